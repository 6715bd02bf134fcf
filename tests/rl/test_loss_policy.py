"""Policy loss: hand-computed clipping, REINFORCE gradient, KL, masking, micro-batch accumulation."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.rl.loss import (
    AGG_MODES,
    add_pairs,
    kl_penalty,
    policy_loss,
    reduce_pairs,
    role_unit_counts,
    token_entropy,
    token_logprobs,
)

B, T, V = 6, 6, 13
# Tests call the loss through jit, as the trainer does; eager op-by-op differentiation is needlessly slow.
_STATIC = (
    "clip_low",
    "clip_high",
    "dual_clip",
    "log_ratio_clamp",
    "kl_coef",
    "kl_type",
    "entropy_coef",
    "agg",
    "agg_norm",
    "role_balanced",
    "num_roles",
)
jit_policy_loss = jax.jit(policy_loss, static_argnames=_STATIC)
NORM = 5.0  # the constant of "seq_mean_token_sum_norm" (Dr. GRPO) wherever a test runs every mode


def _np_logprobs(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(lp, targets[..., None], -1)[..., 0]


@functools.lru_cache(maxsize=None)
def _batch():
    # numpy draws: jax.random would cost a compile per test file for no benefit.
    rng = np.random.default_rng(0)
    logits = (2.0 * rng.standard_normal((B, T, V))).astype(np.float32)
    targets = rng.integers(0, V, (B, T)).astype(np.int32)
    adv = rng.standard_normal(B).astype(np.float32)
    old = _np_logprobs(logits + 0.3 * rng.standard_normal(logits.shape), targets).astype(np.float32)
    ref = _np_logprobs(logits + 0.3 * rng.standard_normal(logits.shape), targets).astype(np.float32)
    # Prompt (leading zeros), response tokens with fractional weights, padding; row 3 has no response at all.
    w = np.zeros((B, T), np.float32)
    w[0, 2:6] = 1
    w[1, 1:3] = 1
    w[2, 3:6] = [1, 0.5, 1]
    w[4, 0:5] = 1
    w[5, 4:6] = 1
    roles = jnp.array([0, 1, 0, 1, 1, 0])
    return tuple(jnp.asarray(x) for x in (logits, targets, adv, w, roles, old, ref))


def _loss(logits, targets, old, adv, w, **kw):
    out = jit_policy_loss(token_logprobs(logits, targets), old, adv, w, **kw)
    return reduce_pairs(out)["loss"], out


# ---- hand-computed per-token cases --------------------------------------------------------------------------


def _one(ratio, a, **kw):
    """A single token with the given ratio and advantage; returns (loss value, metric means)."""
    logp = jnp.array([[math.log(ratio)]], jnp.float32)
    out = policy_loss(logp, jnp.zeros((1, 1)), jnp.array([a], jnp.float32), jnp.ones((1, 1)), **kw)
    return {k: float(v) for k, v in reduce_pairs(out).items()}


@pytest.mark.parametrize(
    "ratio,a,kw,loss,clipfrac,lower",
    [
        (1.5, 1.0, {}, -1.2, 1.0, 0.0),  # pg1=-1.5, pg2=-1.2: clip binds (no gain past 1+0.2)
        (0.5, 1.0, {}, -0.5, 0.0, 0.0),  # pg1=-0.5, pg2=-0.8: the unclipped term is the max
        (0.5, -1.0, {}, 0.8, 1.0, 0.0),  # pg1=0.5, pg2=0.8
        (1.5, -1.0, {}, 1.5, 0.0, 0.0),  # pg1=1.5 > pg2=1.2, below the dual bound 3
        (5.0, -1.0, {}, 3.0, 0.0, 1.0),  # pg1=5 -> dual clip caps at -A*3
        (5.0, -1.0, {"dual_clip": None}, 5.0, 0.0, 0.0),
        (5.0, -2.0, {"dual_clip": 4.0}, 8.0, 0.0, 1.0),
        (1.5, 1.0, {"clip_low": 0.1, "clip_high": 0.3}, -1.3, 1.0, 0.0),
        (0.5, -1.0, {"clip_low": 0.1, "clip_high": 0.3}, 0.9, 1.0, 0.0),
        (1.0, 2.0, {}, -2.0, 0.0, 0.0),
    ],
)
def test_clipping_hand_cases(ratio, a, kw, loss, clipfrac, lower):
    m = _one(ratio, a, **kw)
    assert m["loss"] == pytest.approx(loss, rel=1e-5)
    assert m["pg_clipfrac"] == clipfrac and m["pg_clipfrac_lower"] == lower
    assert m["ratio"] == pytest.approx(ratio, rel=1e-6)


def test_log_ratio_clamp_bounds_ratio_and_stops_its_gradient():
    def f(lp):
        out = policy_loss(lp, jnp.zeros((1, 1)), jnp.array([1.0]), jnp.ones((1, 1)), clip_high=1e9, log_ratio_clamp=5.0)
        return reduce_pairs(out)["loss"]

    lp = jnp.array([[30.0]])
    assert float(f(lp)) == pytest.approx(-math.exp(5.0), rel=1e-6)
    assert float(jax.grad(f)(lp)[0, 0]) == 0.0
    assert float(jax.grad(f)(jnp.array([[1.0]]))[0, 0]) == pytest.approx(-math.e, rel=1e-6)


def test_kl_estimators_hand_values_and_zero_for_identical_policies():
    lp, ref = jnp.array([[-1.0, -0.5]]), jnp.array([[-2.0, -0.5]])
    np.testing.assert_allclose(kl_penalty(lp, ref, "k1"), [[1.0, 0.0]], atol=1e-7)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k2"), [[0.5, 0.0]], atol=1e-7)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k3"), [[math.exp(-1) + 1 - 1, 0.0]], atol=1e-7)
    # k3 is clamped at 10 (exp(15) - 15 - 1 would be ~3.3e6).
    assert float(kl_penalty(jnp.array([[-20.0]]), jnp.array([[-5.0]]), "k3")[0, 0]) == 10.0
    logits, targets, adv, w, roles, old, _ = _batch()
    lp = token_logprobs(logits, targets)
    for kind in ("k1", "k2", "k3"):
        assert float(jnp.abs(kl_penalty(lp, lp, kind)).max()) == 0.0
    out = reduce_pairs(jit_policy_loss(lp, old, adv, w, ref_logp=lp, kl_coef=0.5, kl_type="k3"))
    assert float(out["kl"]) == 0.0
    assert float(out["loss"]) == pytest.approx(float(out["pg_loss"]), abs=1e-7)


def test_kl_and_entropy_terms_enter_the_loss():
    logits, targets, adv, w, roles, old, ref = _batch()
    lp, ent = token_logprobs(logits, targets), token_entropy(logits)
    for agg in AGG_MODES:
        m = reduce_pairs(
            jit_policy_loss(
                lp,
                old,
                adv,
                w,
                ref_logp=ref,
                kl_coef=0.1,
                kl_type="k2",
                entropy=ent,
                entropy_coef=0.01,
                agg=agg,
                agg_norm=NORM,
            )
        )
        assert float(m["kl"]) > 0 and float(m["entropy"]) > 0
        assert float(m["loss"]) == pytest.approx(float(m["pg_loss"] + 0.1 * m["kl"] - 0.01 * m["entropy"]), abs=1e-6)


# ---- gradients ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
def test_on_policy_gradient_is_reinforce(agg):
    """old_logp == logp (one step per batch): ratio 1, no clipping, and the gradient is the REINFORCE one."""
    logits, targets, adv, w, _, _, _ = _batch()
    old = jax.lax.stop_gradient(token_logprobs(logits, targets))
    loss, out = _loss(logits, targets, old, adv, w, agg=agg, agg_norm=NORM)
    m = reduce_pairs(out)
    assert float(m["ratio"]) == pytest.approx(1.0, abs=1e-7) and float(m["pg_clipfrac"]) == 0.0

    rows = [i for i in range(B) if float(w[i].sum()) > 0]

    def reinforce(lg):
        lp = jax.nn.log_softmax(lg, -1)
        lp = jnp.take_along_axis(lp, targets[..., None], -1)[..., 0]
        if agg == "token_mean":
            return -sum(adv[i] * jnp.sum(w[i] * lp[i]) for i in rows) / jnp.sum(w)
        if agg == "seq_mean_token_mean":
            return -sum(adv[i] * jnp.sum(w[i] * lp[i]) / jnp.sum(w[i]) for i in rows) / len(rows)
        if agg == "seq_mean_token_sum_norm":
            return -sum(adv[i] * jnp.sum(w[i] * lp[i]) / NORM for i in rows) / len(rows)
        return -sum(adv[i] * jnp.sum(w[i] * lp[i]) for i in rows) / len(rows)

    g = jax.jit(jax.grad(lambda lg: _loss(lg, targets, old, adv, w, agg=agg, agg_norm=NORM)[0]))(logits)
    g_ref = jax.jit(jax.grad(reinforce))(logits)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-7)
    assert float(jnp.abs(g).max()) > 1e-3


def test_zero_weight_tokens_get_exactly_zero_gradient():
    logits, targets, adv, w, roles, old, ref = _batch()
    # Junk constants where the weight is 0 (sampler padding can hold -inf or NaN) must not leak.
    junk = jnp.where(w > 0, old, jnp.nan).at[0, 0].set(-jnp.inf)
    ref_junk = jnp.where(w > 0, ref, -jnp.inf)
    ent = token_entropy(logits)
    for agg in AGG_MODES:

        def f(lg):
            return _loss(
                lg,
                targets,
                junk,
                adv,
                w,
                agg=agg,
                agg_norm=NORM,
                ref_logp=ref_junk,
                kl_coef=0.1,
                entropy=ent,
                entropy_coef=0.01,
                role_ids=roles,
                role_balanced=True,
            )[0]

        g = np.asarray(jax.jit(jax.grad(f))(logits))
        assert np.isfinite(g).all()
        masked = np.asarray(w) == 0
        assert (g[masked] == 0.0).all()
        assert (np.abs(g[~masked]).sum(-1) > 0).all()


_CONFIGS = [(agg, bal) for agg in AGG_MODES for bal in (False, True)]


@jax.jit
def _micro_batch_all_configs(lg, tg, old, adv, w, ref, ent, roles, counts):
    """For every (agg, role_balanced): metric pairs of one micro-batch and grad of its loss sum w.r.t. lg.

    One program for all configurations keeps this test to two compilations (full batch, micro-batch).
    counts: ``[len(_CONFIGS), 2]`` role unit counts of the whole batch, or NaN to count this call's rows.
    """
    res = []
    for c, (agg, bal) in enumerate(_CONFIGS):
        rc = jnp.where(jnp.isnan(counts[c]), role_unit_counts(w, roles, agg), counts[c]) if bal else None

        def loss_sum(lg, agg=agg, bal=bal, rc=rc):
            out = policy_loss(
                token_logprobs(lg, tg),
                old,
                adv,
                w,
                agg=agg,
                agg_norm=NORM,
                ref_logp=ref,
                kl_coef=0.2,
                entropy=ent,
                entropy_coef=0.05,
                role_balanced=bal,
                role_ids=roles,
                role_counts=rc,
            )
            return out["loss"][0], out

        (_, out), g = jax.value_and_grad(loss_sum, has_aux=True)(lg)
        res.append((out, g))
    return res


def test_micro_batches_accumulate_to_the_big_batch():
    logits, targets, adv, w, roles, old, ref = _batch()
    ent = token_entropy(logits)
    counts = jnp.stack([role_unit_counts(w, roles, agg) for agg, _ in _CONFIGS])

    def run(sl, counts):
        return _micro_batch_all_configs(
            logits[sl], targets[sl], old[sl], adv[sl], w[sl], ref[sl], ent[sl], roles[sl], counts
        )

    full_all = run(slice(None), jnp.full(counts.shape, jnp.nan))
    parts_all = [run(sl, counts) for sl in (slice(0, 2), slice(2, 4), slice(4, 6))]
    for c, cfg in enumerate(_CONFIGS):
        full, g_full_sum = full_all[c]
        parts = [p[c] for p in parts_all]
        acc = parts[0][0]
        for p, _ in parts[1:]:
            acc = add_pairs(acc, p)
        for k in full:
            np.testing.assert_allclose(float(acc[k][0]), float(full[k][0]), rtol=1e-5, atol=1e-6, err_msg=f"{cfg} {k}")
            np.testing.assert_allclose(float(acc[k][1]), float(full[k][1]), rtol=1e-6, err_msg=f"{cfg} {k}")
        assert float(reduce_pairs([p for p, _ in parts])["loss"]) == pytest.approx(
            float(reduce_pairs(full)["loss"]), rel=1e-5, abs=1e-6
        ), cfg
        # Gradient: per-micro-batch gradients of the sums, divided once by the total count.
        g_acc = jnp.concatenate([g for _, g in parts]) / float(acc["loss"][1])
        np.testing.assert_allclose(
            np.asarray(g_acc), np.asarray(g_full_sum) / float(full["loss"][1]), rtol=1e-5, atol=1e-7, err_msg=str(cfg)
        )
        assert float(jnp.abs(g_acc).max()) > 1e-4, cfg
    # Role balancing must actually change the loss here, or the balanced cases above prove nothing.
    assert abs(float(reduce_pairs(full_all[0][0])["loss"]) - float(reduce_pairs(full_all[1][0])["loss"])) > 1e-3


def test_aggregation_hand_case():
    # pg = -A per token at ratio 1. Row 0: values 1,1 (weights 1,1); row 1: value 3 (weight 1) ; row 2: 10 x3.
    lp = jnp.zeros((3, 3))
    adv = jnp.array([-1.0, -3.0, -10.0])
    w = jnp.array([[1, 1, 0], [0, 1, 0], [1, 1, 1]], jnp.float32)
    m = {agg: float(reduce_pairs(policy_loss(lp, lp, adv, w, agg=agg, agg_norm=NORM))["loss"]) for agg in AGG_MODES}
    assert m["token_mean"] == pytest.approx((1 + 1 + 3 + 30) / 6)
    assert m["seq_mean_token_mean"] == pytest.approx((1 + 3 + 10) / 3)
    assert m["seq_mean_token_sum"] == pytest.approx((2 + 3 + 30) / 3)
    assert m["seq_mean_token_sum_norm"] == pytest.approx((2 + 3 + 30) / 3 / NORM)


def test_role_balanced_hand_case():
    # Rows 0,1 are role 0 (row means 1 and 3, tokens 1,1 and 3); row 2 is role 1 (three tokens of 10).
    lp = jnp.zeros((3, 3))
    adv = jnp.array([-1.0, -3.0, -10.0])
    w = jnp.array([[1, 1, 0], [0, 1, 0], [1, 1, 1]], jnp.float32)
    roles = jnp.array([0, 0, 1])

    def val(agg):
        out = policy_loss(lp, lp, adv, w, agg=agg, agg_norm=NORM, role_ids=roles, role_balanced=True)
        return float(reduce_pairs(out)["loss"]), float(out["loss"][1])

    assert val("seq_mean_token_mean") == (pytest.approx(((1 + 3) / 2 + 10) / 2), pytest.approx(2.0))
    assert val("seq_mean_token_sum")[0] == pytest.approx(((2 + 3) / 2 + 30) / 2)
    assert val("seq_mean_token_sum_norm")[0] == pytest.approx(((2 + 3) / 2 + 30) / 2 / NORM)
    assert val("token_mean")[0] == pytest.approx(((1 + 1 + 3) / 3 + 10) / 2)
    # Only one role present: balancing changes nothing.
    out = policy_loss(lp[:2], lp[:2], adv[:2], w[:2], role_ids=roles[:2], role_balanced=True)
    assert float(reduce_pairs(out)["loss"]) == pytest.approx(2.0)


def test_token_logprobs_and_entropy_match_torch():
    import torch

    logits, targets, *_ = _batch()
    for temp in (1.0, 0.6):
        lt = torch.tensor(np.asarray(logits)) / temp
        want = torch.log_softmax(lt, -1).gather(-1, torch.tensor(np.asarray(targets)).long()[..., None])[..., 0]
        np.testing.assert_allclose(np.asarray(token_logprobs(logits, targets, temp)), want.numpy(), atol=2e-6)
        ent = torch.distributions.Categorical(logits=lt).entropy()
        np.testing.assert_allclose(np.asarray(token_entropy(logits, temp)), ent.numpy(), atol=2e-6)


def test_bad_input_names_the_problem():
    lp, w = jnp.zeros((2, 3)), jnp.ones((2, 3))
    a = jnp.ones(2)
    with pytest.raises(ValueError, match="agg='mean'"):
        policy_loss(lp, lp, a, w, agg="mean")
    with pytest.raises(ValueError, match="kl_type='kl'"):
        policy_loss(lp, lp, a, w, kl_type="kl")
    with pytest.raises(ValueError, match="old_logp has shape"):
        policy_loss(lp, jnp.zeros((2, 4)), a, w)
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_loss(lp, lp, jnp.ones(3), w)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logp"):
        policy_loss(lp, lp, a, w, kl_coef=0.1)
    with pytest.raises(ValueError, match="role_balanced=True needs role_ids"):
        policy_loss(lp, lp, a, w, role_balanced=True)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(lp, lp, a, w, dual_clip=0.5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), jnp.int32), 0.0)
