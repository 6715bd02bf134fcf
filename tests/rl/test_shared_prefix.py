"""Shared prompts computed once (rl.prefix_plan + Qwen3.final_hidden_shared): the plan rebuilds every row,
the hidden states and log-probs equal the plain forward's, and a Trainer update with sharing equals one
without it."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from envace_jax.models import qwen3
from envace_jax.rl import prefix_plan
from envace_jax.rl.batch import build_batch
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import ACT, REHEARSE, Generation
from tests.helpers_models import build_on_two_devices

CFG = qwen3.Qwen3Config(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
)


def _grouped_gens(seed=0, groups=(4, 3, 1), prompt_lens=(13, 21, 9), max_new=11):
    """GRPO groups: each group's rows share one prompt and have their own completions."""
    rng = np.random.default_rng(seed)
    gens, gids = [], []
    for g, (size, plen) in enumerate(zip(groups, prompt_lens)):
        prompt = rng.integers(1, 64, plen).tolist()
        for i in range(size):
            new = rng.integers(1, 64, rng.integers(3, max_new + 1)).tolist()
            role = ACT if g % 2 == 0 else REHEARSE
            gens.append(Generation(role, prompt, new, rng.normal(-3, 0.5, len(new)).tolist(), f"u{g}", len(gens), 0))
            gids.append(g)
    adv = rng.normal(size=len(gens))
    return gens, adv, gids


def _batch(seed=0, **kw):
    gens, adv, gids = _grouped_gens(seed, **kw)
    return build_batch(gens, adv, gids, max_len=64, length_multiple=16)


def test_plan_rebuilds_every_row_from_prefixes_and_suffixes():
    batch = _batch()
    p = prefix_plan.plan(batch.arrays(), multiple=4, max_share=1.0)
    assert p is not None
    flat = np.concatenate([p["prefix_tokens"].reshape(-1), p["suffix_tokens"].reshape(-1)])
    valid = batch.segment_ids != 0
    np.testing.assert_array_equal(flat[p["full_index"]][valid], batch.tokens[valid])
    # Group 0 (4 rows, 13-token prompt) shares 12 tokens (13 rounded down to 4s), group 1 (3 rows, 21) shares
    # 20; the lone row of group 2 shares nothing. Prefixes are bucketed to a power of two (2 here).
    np.testing.assert_array_equal(p["row_prefix_lens"], [12] * 4 + [20] * 3 + [0])
    np.testing.assert_array_equal(p["prefix_lens"], [12, 20])
    assert p["prefix_tokens"].shape == (2, 20)
    lengths = valid.sum(1)
    np.testing.assert_array_equal(p["suffix_lens"], lengths - p["row_prefix_lens"])
    assert p["suffix_tokens"].shape[1] % 4 == 0 and p["suffix_tokens"].shape[1] >= lengths[-1]


def test_plan_declines_when_it_would_not_save_or_rows_are_packed():
    batch = _batch()
    arrays = batch.arrays()
    assert prefix_plan.plan(arrays, multiple=4, max_share=0.1) is None  # saves too little
    packed = dict(arrays, segment_ids=np.where(arrays["segment_ids"] > 0, 1 + (np.arange(32) >= 8), 0))
    assert prefix_plan.plan(packed, multiple=4) is None
    lone = dict(arrays, group_ids=np.arange(len(arrays["group_ids"]), dtype=np.int32))  # no group of two
    assert prefix_plan.plan(lone, multiple=4) is None


@pytest.mark.parametrize("attention_block", [0, 8])
def test_shared_hidden_equals_the_plain_forward(attention_block):
    model = qwen3.Qwen3(CFG.replace(attention_block=attention_block), rngs=nnx.Rngs(3))
    batch = _batch(seed=1)
    mb = batch.arrays()
    p = prefix_plan.plan(mb, multiple=4, max_share=1.0)
    plain = np.asarray(model.final_hidden(mb["tokens"], mb["positions"], mb["segment_ids"]))
    shared = np.asarray(
        jax.jit(model.final_hidden_shared)(
            p["prefix_tokens"], p["suffix_tokens"], prefix_plan.layout(p), p["full_index"]
        )
    )
    valid = mb["segment_ids"] != 0
    np.testing.assert_allclose(shared[valid], plain[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gather_trained", [True, False])
def test_update_with_shared_prefixes_equals_the_plain_update(gather_trained):
    batch = _batch(seed=2, groups=(4, 4), prompt_lens=(24, 18), max_new=6)
    trainers = [
        Trainer(
            qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)),
            OptimConfig(lr=1e-2),
            LossConfig(kl_coef=0.1),
            micro_batch_size=8,
            gather_trained=gather_trained,
            share_prefixes=share,
        )
        for share in (False, True)
    ]
    parts = trainers[1]._local_micro_batches(batch)
    assert all("full_index" in mb for mb in parts)  # the shared path did run
    logps = [t.compute_logprobs(batch) for t in trainers]
    np.testing.assert_allclose(logps[1], logps[0], rtol=1e-5, atol=1e-5)
    # The gradient, not the parameters after an Adam step: Adam's first step is about lr * sign(g), which
    # turns a float32 rounding difference in a near-zero gradient into a full step of either sign.
    grads = [t.gradients(batch) for t in trainers]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * np.abs(a).max())
    metrics = [t.update(batch) for t in trainers]
    for k in ("loss", "grad_norm", "kl"):
        assert metrics[1][k] == pytest.approx(metrics[0][k], rel=1e-4, abs=1e-6), k


def test_shared_prefixes_run_on_one_device_only():
    # A mesh of one device (what rl.train builds on a single chip) runs the shared path.
    from envace_jax import sharding as shd

    batch = _batch(seed=3, groups=(4, 4), prompt_lens=(24, 18), max_new=6)
    plain = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)), micro_batch_size=8, share_prefixes=False)
    on_mesh = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)), micro_batch_size=8, mesh=shd.make_mesh(1, 1, 1))
    assert on_mesh.share_prefixes and not plain.share_prefixes  # the default is on where it applies
    assert all("full_index" in mb for mb in on_mesh._local_micro_batches(batch))
    np.testing.assert_allclose(on_mesh.compute_logprobs(batch), plain.compute_logprobs(batch), rtol=1e-5, atol=1e-5)
    # On two devices the default is off (the rule the Trainer applies; this unsharded model builds no Trainer
    # on that mesh), an explicit True is refused.
    out = build_on_two_devices(
        "from envace_jax import fast_defaults; print('DEFAULT', fast_defaults.share_repeated_prompts(None, mesh)); "
        "Trainer(model, mesh=mesh, share_prefixes=True)"
    )
    assert "DEFAULT False" in out.stdout, out.stderr[-2000:]
    assert "REFUSED share_prefixes runs on one device, not on a mesh of 2 devices" in out.stdout
