"""rl.optim.make_optimizer against optax.apply_if_finite(chain(clip_by_global_norm, adamw)), the
optimizer it replaces: the same updates, parameters and counters at every step of a gradient sequence
with NaN and inf steps and a give-up, the same state layout (checkpoints restore across), and a skipped
step that leaves the parameters and Adam's moments as they were."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from envace_jax.checkpoint import Checkpointer
from envace_jax.config import OptimConfig
from envace_jax.rl.optim import make_optimizer, make_schedule

# Warmup then cosine decay (the schedule's step count matters), weight decay, and a clip that bites on
# the larger gradients; two skips in a row are allowed, the third non-finite step in a row is taken.
CFG = OptimConfig(
    lr=0.05,
    schedule="cosine",
    warmup_steps=2,
    total_steps=12,
    weight_decay=0.1,
    grad_clip=1.5,
    max_consecutive_nonfinite=2,
)


def reference(cfg: OptimConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return optax.apply_if_finite(
        optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw), cfg.max_consecutive_nonfinite
    )


def start_params():
    r = np.random.default_rng(0)
    return {"w": jnp.asarray(r.normal(size=(4, 3)), jnp.float32), "b": jnp.asarray(r.normal(size=(3,)), jnp.float32)}


def gradient_sequence():
    """(label, gradient) pairs: finite steps, single NaN / +inf / -inf steps, a NaN in one leaf only,
    then three non-finite steps in a row (skip, skip, give up) and a finite step after the give-up."""
    r = np.random.default_rng(1)

    def finite(scale=1.0):
        return {"w": scale * r.normal(size=(4, 3)), "b": scale * r.normal(size=(3,))}

    def poison(value, leaf="w"):
        g = finite()
        if leaf == "w":
            g["w"][1, 2] = value
        else:
            g["b"][0] = value
        return g

    seq = [
        ("finite", finite()),
        ("finite, clipped", finite(5.0)),
        ("nan", poison(np.nan)),
        ("finite", finite()),
        ("+inf", poison(np.inf)),
        ("-inf in b", poison(-np.inf, "b")),
        ("finite", finite(3.0)),
        ("nan in b", poison(np.nan, "b")),
        ("finite", finite()),
        ("nan 1/3", poison(np.nan)),
        ("inf 2/3", poison(np.inf)),
        ("nan 3/3: given up", poison(np.nan, "b")),
        ("finite after", finite()),
    ]
    return [(label, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)) for label, g in seq]


def _step(tx):
    """One jitted ``tx.update``; the parameters are moved outside it, by the same (unfused) addition for
    both optimizers: fused into a jitted update, XLA may contract ``p - lr * u`` into one multiply-add
    and round it differently by an ulp, which says nothing about the optimizer."""
    update = jax.jit(tx.update)

    def step(params, state, grads):
        updates, state = update(grads, state, params)
        return optax.apply_updates(params, updates), state, updates

    return step


def _equal(a, b, what):
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=what)


def test_same_updates_parameters_and_counters_as_apply_if_finite_at_every_step():
    ours, ref = make_optimizer(CFG), reference(CFG)
    p_ours = p_ref = start_params()
    s_ours, s_ref = ours.init(p_ours), ref.init(p_ref)
    assert isinstance(s_ours, optax.ApplyIfFiniteState)
    _equal(s_ours, s_ref, "init")
    step_ours, step_ref = _step(ours), _step(ref)
    taken_nonfinite = 0
    for i, (label, g) in enumerate(gradient_sequence()):
        p_ours, s_ours, u_ours = step_ours(p_ours, s_ours, g)
        p_ref, s_ref, u_ref = step_ref(p_ref, s_ref, g)
        what = f"step {i} ({label})"
        _equal(u_ours, u_ref, what + ": updates")
        _equal(p_ours, p_ref, what + ": params")
        _equal(s_ours, s_ref, what + ": state")  # counters, last_finite, moments, both step counts
        taken_nonfinite += label.endswith("given up")
    # The sequence did reach every branch: 7 non-finite steps counted, one of them taken (give-up).
    assert int(s_ours.total_notfinite) == 7 and taken_nonfinite == 1
    assert int(s_ours.notfinite_count) == 0 and bool(s_ours.last_finite)
    # After the give-up the NaN reached the parameters, in both.
    assert np.isnan(np.asarray(p_ours["b"])).any()


def test_a_skipped_step_changes_no_parameter_moment_or_count():
    tx = make_optimizer(CFG)
    step = _step(tx)
    seq = gradient_sequence()
    params, state = start_params(), tx.init(start_params())
    for _, g in seq[:2]:
        params, state, _ = step(params, state, g)
    for label, g in (seq[2], seq[4], seq[5]):  # NaN, +inf, -inf in the other leaf; never two in a row
        new_params, new_state, updates = step(params, state, g)
        assert all(not np.asarray(u).any() for u in jax.tree.leaves(updates)), label
        _equal(new_params, params, label + ": params")
        _equal(new_state.inner_state, state.inner_state, label + ": moments and step counts")
        assert int(new_state.notfinite_count) == 1 and not bool(new_state.last_finite), label
        assert int(new_state.total_notfinite) == int(state.total_notfinite) + 1, label
        params, state, _ = step(new_params, new_state, seq[0][1])  # a finite step resets the run
        assert int(state.notfinite_count) == 0
    adam = state.inner_state[1][0]
    assert int(adam.count) == 5  # 2 + one finite step after each of the 3 skips


def test_checkpoint_of_apply_if_finite_state_restores_into_ours(tmp_path):
    """A run checkpointed before this optimizer (its state made by optax.apply_if_finite) resumes:
    the Checkpointer restores the saved state into our state's structure, value for value."""
    params = start_params()
    ref = reference(CFG)
    state = ref.init(params)
    step = _step(ref)
    for _, g in gradient_sequence()[:4]:
        params, state, _ = step(params, state, g)
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(4, {"params": params, "opt_state": state})
        ck.wait()
    # As a resumed run restores (rl.training_loop.resume): into the structure of its fresh train state.
    with Checkpointer(str(tmp_path)) as ck:
        fresh = {"params": start_params(), "opt_state": make_optimizer(CFG).init(start_params())}
        res = ck.restore_latest_good(fresh)
    assert res.step == 4 and not res.skipped
    _equal(res.state["opt_state"], state, "restored state")
    assert isinstance(res.state["opt_state"], optax.ApplyIfFiniteState)
    assert int(res.state["opt_state"].total_notfinite) == 1  # the NaN step of the first four


def _update_temporaries(monkeypatch, optimizer=None) -> tuple[int, int]:
    """(XLA's temporary bytes of the Trainer's compiled optimizer step, parameter bytes) for an abstract
    4096-token, hidden-256 Qwen3 (nothing is allocated); ``optimizer`` replaces make_optimizer."""
    from flax import nnx

    from envace_jax.models import qwen3
    from envace_jax.rl import trainer as trainer_lib

    if optimizer is not None:
        monkeypatch.setattr(trainer_lib, "make_optimizer", optimizer)
    cfg = qwen3.Qwen3Config.tiny(4096, hidden_size=256)
    tr = trainer_lib.Trainer(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))), OptimConfig())
    p = tr.params
    compiled = tr.program("apply").lower(p, tr.opt_state, p, jax.ShapeDtypeStruct((), jnp.float32)).compile()
    return compiled.memory_analysis().temp_size_in_bytes, sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(p))


def test_the_optimizer_step_holds_no_parameter_sized_temporary(monkeypatch):
    """The Trainer's step holds no parameter-sized temporary. An optax chain of clip + AdamW handed the
    averaged gradient holds one (the divided or clipped copy); apply_if_finite's cond holds a second."""
    ours, weights = _update_temporaries(monkeypatch)
    assert ours < weights // 100, (ours, weights)

    def plain(cfg):  # the same chain, with no skip at all
        adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)

    floor, _ = _update_temporaries(monkeypatch, plain)
    with_cond, _ = _update_temporaries(monkeypatch, reference)
    assert ours <= floor + 64 * 1024, (ours, floor, weights)
    assert with_cond >= floor + weights // 2, (with_cond, floor, weights)  # the copy this replaces


def test_a_scaled_gradient_steps_as_the_divided_one_through_clips_and_skips():
    """``update(grads, ..., grad_scale=s)`` (what the Trainer passes: the gradient sum and 1 / count) takes
    the step apply_if_finite(clip + AdamW) takes on ``grads * s``, through clipped, skipped and given-up
    steps: the counters equal, the values within rounding (the clip's factor is folded into one scalar)."""
    scale = jnp.float32(1 / 3)
    ours, ref = make_optimizer(CFG), reference(CFG)
    p_ours = p_ref = start_params()
    s_ours, s_ref = ours.init(p_ours), ref.init(p_ref)
    update_ours, update_ref = jax.jit(ours.update), jax.jit(ref.update)
    clipped = 0
    for i, (label, g) in enumerate(gradient_sequence()):
        # the sequence's gradients are sums of 3: some clip after the division, some do not
        g = jax.tree.map(lambda x: 3 * x, g)
        u_ours, s_ours = update_ours(g, s_ours, p_ours, grad_scale=scale)
        u_ref, s_ref = update_ref(jax.tree.map(lambda x: x * scale, g), s_ref, p_ref)
        p_ours, p_ref = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_ref, u_ref)
        for name, a, b in (("updates", u_ours, u_ref), ("params", p_ours, p_ref), ("state", s_ours, s_ref)):
            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
                np.testing.assert_allclose(
                    np.asarray(x), np.asarray(y), rtol=2e-6, atol=1e-7, err_msg=f"{i} {label} {name}"
                )
        norm = float(optax.tree.norm(jax.tree.map(lambda x: x * scale, g)))
        clipped += np.isfinite(norm) and norm > CFG.grad_clip
    assert clipped >= 2 and int(s_ours.total_notfinite) == 7
