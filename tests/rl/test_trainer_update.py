"""Trainer: exact micro-batch accumulation, SFT learning, non-finite skipping, sharded == single device,
optimizer state sharded like the parameters, one-row micro-batches split along the sequence."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from envace_jax.models import qwen3
from envace_jax.rl.batch import build_batch, pad_rows
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import ACT, REHEARSE, Generation

CFG = qwen3.Qwen3Config(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
)


def _gens(n=6, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(1, 64, rng.integers(3, 9)).tolist()
        g = rng.integers(1, 64, rng.integers(2, 6)).tolist()
        out.append(
            Generation(ACT if i % 2 == 0 else REHEARSE, p, g, rng.normal(-3, 0.5, len(g)).tolist(), f"u{i // 3}", i, 0)
        )
    return out


def _batch(seed=0):
    gens = _gens(seed=seed)
    adv = np.random.default_rng(seed + 1).normal(size=len(gens))
    return build_batch(gens, adv, [i // 3 for i in range(len(gens))], max_len=32)


def _params(trainer):
    return jax.tree.map(np.asarray, trainer.params)


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
def test_micro_batches_equal_one_big_batch(agg):
    batch = _batch()
    results = []
    # (micro-batch size, pad the short last micro-batch): 6 rows as 4 + 2 padded to 4 must change nothing
    for mbs, pad in ((batch.size, False), (2, False), (1, False), (4, True)):
        tr = Trainer(
            qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)),
            OptimConfig(lr=1e-2),
            LossConfig(agg=agg, agg_norm=7.0),
            micro_batch_size=mbs,
            pad_micro_batches=pad,
        )
        logp = tr.compute_logprobs(batch)
        grads = jax.tree.map(np.asarray, tr.gradients(batch))
        results.append((grads, tr.update(batch)["loss"], logp))
    for g, loss, logp in results[1:]:
        assert loss == pytest.approx(results[0][1], rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(logp, results[0][2], rtol=1e-5, atol=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), results[0][0], g)


def test_dr_grpo_constant_normaliser_scales_the_row_sums():
    """Dr. GRPO: each row's token sum over a constant, not over its own length. The gradient is the per-row token
    sum's divided by that constant, and the loss no longer favours short rows: with a per-row mean, a row's
    tokens each weigh 1/|y_i|; here they all weigh 1/agg_norm."""
    batch = _batch()
    grads = {}
    for agg, norm in (("seq_mean_token_sum", 0.0), ("seq_mean_token_sum_norm", 12.0)):
        tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)), OptimConfig(lr=1e-2), LossConfig(agg=agg, agg_norm=norm))
        grads[agg] = jax.tree.map(np.asarray, tr.gradients(batch))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a / 12.0, b, rtol=1e-5, atol=1e-9),
        grads["seq_mean_token_sum"],
        grads["seq_mean_token_sum_norm"],
    )
    with pytest.raises(ValueError, match="agg_norm > 0"):
        LossConfig(agg="seq_mean_token_sum_norm")


def test_a_zero_temperature_row_is_refused_not_divided_by():
    batch = _batch()
    batch.temperature[2] = 0.0  # e.g. a batch built by hand from greedy rows
    tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(5)), OptimConfig(lr=1e-2), LossConfig())
    for call in (tr.compute_logprobs, tr.update):
        with pytest.raises(ValueError, match="temperature must be > 0 in every row"):
            call(batch)


def test_padding_rows_carry_no_weight_and_no_group():
    arrays = _batch().arrays()
    padded = pad_rows(arrays, 8, width=40)
    assert padded["tokens"].shape == (8, 40) and padded["advantages"].shape == (8,)
    width = arrays["tokens"].shape[1]
    np.testing.assert_array_equal(padded["tokens"][:6, :width], arrays["tokens"])
    assert not padded["tokens"][:, width:].any() and not padded["loss_weights"][:, width:].any()
    assert not padded["loss_weights"][6:].any() and not padded["segment_ids"][6:].any()
    assert (padded["group_ids"][6:] == -1).all() and (padded["temperature"][6:] == 1.0).all()
    with pytest.raises(ValueError, match="tokens"):
        pad_rows(arrays, 4)


def test_update_changes_params_and_rl_gradient_sign():
    """A positive-advantage row becomes more likely after one step; a negative one less likely."""
    gens = _gens(2)
    for adv_sign in (1.0, -1.0):
        batch = build_batch(gens[:1], [adv_sign], [0], max_len=32)
        tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(1)), OptimConfig(lr=1e-2, weight_decay=0.0), LossConfig())
        before = tr.compute_logprobs(batch).sum()
        tr.update(batch)
        after = tr.compute_logprobs(batch).sum()
        assert (after - before) * adv_sign > 0


def test_sft_lowers_nll():
    gens = _gens(4)
    batch = build_batch(gens, [1.0] * 4, [0, 0, 1, 1], max_len=32)
    tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(2)), OptimConfig(lr=3e-3, weight_decay=0.0), micro_batch_size=2)
    first = tr.update(batch, kind="sft")["loss"]
    for _ in range(20):
        last = tr.update(batch, kind="sft")["loss"]
    assert last < first - 0.5


def test_nonfinite_step_is_skipped_and_counted():
    batch = _batch()
    tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(3)), OptimConfig(lr=1e-2), LossConfig())
    before = _params(tr)
    bad = batch.take(np.arange(batch.size))
    bad.advantages = np.full_like(bad.advantages, np.nan)
    m = tr.update(bad)
    assert m["skipped_nonfinite"] == 1.0 and tr.nonfinite_steps == 1
    jax.tree.map(np.testing.assert_array_equal, before, _params(tr))
    tr.update(batch)
    assert tr.nonfinite_steps == 1


def test_kl_to_identical_reference_is_zero():
    batch = _batch()
    tr = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(4)), OptimConfig(lr=1e-3), LossConfig(kl_coef=0.1))
    m = tr.update(batch)
    assert abs(m["kl"]) < 1e-6


_SHARDED = textwrap.dedent("""
    import os, sys, json
    import numpy as np, jax, optax
    from flax import nnx
    from test_trainer_update import CFG, _batch
    from envace_jax import sharding as shd
    from envace_jax.models import qwen3
    from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
    assert jax.device_count() == 8

    def trainer_on(mesh, micro_batch_size):
        model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
        if mesh is not None:
            qwen3.place(model, mesh, shd.TRAIN_RULES)
        return Trainer(model, OptimConfig(lr=1e-2), LossConfig(), micro_batch_size=micro_batch_size, mesh=mesh)

    def max_diff(a, b):
        return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(x - y).max()), a, b)))

    batch = _batch()
    res = []
    for mesh in (None, shd.make_mesh(data=2, fsdp=2, tensor=2)):
        tr = trainer_on(mesh, 4)
        for step in range(3):
            if mesh is not None:
                # Adam's moments live where their parameters live from the start (jit(tx.init) alone
                # replicated them on every device) and stay there after updates.
                same = optax.tree_map_params(
                    tr.tx, lambda m, p: m.sharding.is_equivalent_to(p.sharding, p.ndim)
                    and m.addressable_shards[0].data.shape == p.addressable_shards[0].data.shape,
                    tr.opt_state, tr.params, transform_non_params=lambda _: True)
                assert all(jax.tree.leaves(same)), (step, same)
            if step < 2:
                tr.update(batch)
        res.append(jax.tree.map(np.asarray, tr.params))
        if mesh is not None:
            spec = tuple(tr.params["layers"]["q_proj"][...].sharding.spec)
            assert spec + (None,) * (4 - len(spec)) == (None, "fsdp", "tensor", None), spec
    print("MAXDIFF", max_diff(*res))
    # Long prompts, short responses: the vocabulary head runs on the trained positions only, gathered
    # within each of the 4 row shards (data x fsdp), and the update equals one device's.
    from test_gathered_head import _long_prompt_batch
    long_batch = _long_prompt_batch()
    res = []
    for mesh in (None, shd.make_mesh(data=2, fsdp=2, tensor=2)):
        tr = trainer_on(mesh, 8)
        index = tr._local_micro_batches(long_batch)[0]["trained_index"]
        assert index.shape[0] == (1 if mesh is None else 4), index.shape
        for _ in range(2):
            tr.update(long_batch)
        res.append(jax.tree.map(np.asarray, tr.params))
    print("GATHERDIFF", max_diff(*res))
    # One row per micro-batch on an 8-way fsdp mesh: the row's sequence is split over fsdp (not the
    # whole row on every device), and its log-probs are those of one device.
    from jax.sharding import PartitionSpec as P
    mesh = shd.make_mesh(data=1, fsdp=8, tensor=1)
    assert shd.logical_to_spec(("batch", "length", "act_embed"), shd.TRAIN_RULES, mesh,
                               (1, batch.tokens.shape[1], CFG.hidden_size)) == P("data", "fsdp", None)
    lps = []
    for m in (None, mesh):
        model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
        if m is not None:
            qwen3.place(model, m, shd.TRAIN_RULES)
        lps.append(Trainer(model, micro_batch_size=1, mesh=m).compute_logprobs(batch))
    print("SEQDIFF", float(np.abs(lps[0] - lps[1]).max()))
""")


def test_sharded_update_equals_single_device(tmp_path):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH")) if p),
    )
    out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    diff = float(out.stdout.split("MAXDIFF")[1].split()[0])
    assert diff <= 1e-5
    assert float(out.stdout.split("GATHERDIFF")[1].split()[0]) <= 1e-5
    assert float(out.stdout.split("SEQDIFF")[1]) <= 1e-5


def test_weights_loaded_from_host_arrays_compile_the_update_once(tmp_path):
    # Safetensors weights arrive uncommitted and the update's outputs are committed: keyed on both, the
    # second update would compile its programs again.
    from tests.helpers_models import make_tiny_hf_qwen3
    from envace_jax.models import hf_io

    make_tiny_hf_qwen3(
        tmp_path, vocab_size=64, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8
    )
    tr = Trainer(hf_io.load_hf(str(tmp_path)), OptimConfig(lr=1e-2), LossConfig(), micro_batch_size=6)
    batch = _batch()
    for _ in range(3):
        tr.update(batch)
    assert tr._apply._cache_size() == 1
    assert tr._grad_fn("rl")._cache_size() == 1
