"""The public classes' fast defaults (envace_jax.fast_defaults): a GRPO iteration written with ``Sampler``,
``build_batch`` and ``Trainer`` and nothing else pads rows to 16 tokens and shares each group's prompt; it
samples the same tokens and takes the same gradient as the earlier defaults (64-token buckets, nothing
shared) up to float32 summation order; ``ENVACE_JAX_REPLAY_DEFAULTS=1`` brings the earlier defaults back."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from envace_jax import fast_defaults
from envace_jax.models import qwen3
from envace_jax.rl.advantages import role_wise_advantages
from envace_jax.rl.batch import build_batch
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import ACT, ROLE_ID, Generation
from envace_jax.sampling import Sampler, SamplingParams

CFG = qwen3.Qwen3Config(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
)
PROMPTS, GROUP, PROMPT_LEN, NEW = 3, 4, 32, 16  # 48-token rows: 48 wide at 16s, 64 at 64s


def _iteration(model, seed: int):
    """One GRPO iteration's batch, written with the classes' defaults only: (sampled tokens, batch)."""
    rng = np.random.default_rng(seed)
    distinct = rng.integers(1, CFG.vocab_size, (PROMPTS, PROMPT_LEN)).tolist()
    prompts = [p for p in distinct for _ in range(GROUP)]
    group_ids = np.repeat(np.arange(PROMPTS), GROUP)
    out = Sampler(model, seed=seed).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=seed))
    scores = np.asarray([np.mean(np.asarray(t) % 2 == 0) for t in out.tokens], np.float32)
    adv = np.asarray(role_wise_advantages(scores, group_ids, np.full(len(prompts), ROLE_ID[ACT]), normalize_std=True))
    gens = [
        Generation(ACT, p, list(t), list(lp), f"p{g}", i, 0, r)
        for i, (p, t, lp, r, g) in enumerate(zip(prompts, out.tokens, out.logprobs, out.finish_reasons, group_ids))
    ]
    return out.tokens, build_batch(gens, adv, group_ids, max_len=PROMPT_LEN + NEW)


def test_defaults_and_the_replay_switch(monkeypatch):
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
    monkeypatch.delenv(fast_defaults.REPLAY_ENV, raising=False)
    assert fast_defaults.length_multiple() == 16
    assert Sampler(model).share_prompts and Trainer(model).share_prefixes
    # An explicit choice is kept either way.
    assert not Sampler(model, share_prompts=False).share_prompts
    monkeypatch.setenv(fast_defaults.REPLAY_ENV, "1")
    assert fast_defaults.length_multiple() == 64
    assert not Sampler(model).share_prompts and not Trainer(model).share_prefixes
    assert Sampler(model, share_prompts=True).share_prompts and Trainer(model, share_prefixes=True).share_prefixes
    monkeypatch.setenv(fast_defaults.REPLAY_ENV, "sometimes")
    with pytest.raises(ValueError, match="ENVACE_JAX_REPLAY_DEFAULTS='sometimes'"):
        fast_defaults.length_multiple()


def test_default_iteration_matches_the_replayed_one(monkeypatch):
    """Same tokens, the same batch up to its padding, and the same gradient up to float32 summation order."""
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(1))
    optim, loss = OptimConfig(lr=1e-3), LossConfig()
    monkeypatch.delenv(fast_defaults.REPLAY_ENV, raising=False)
    fast_tokens, fast = _iteration(model, seed=3)
    fast_trainer = Trainer(model, optim, loss)
    monkeypatch.setenv(fast_defaults.REPLAY_ENV, "1")
    slow_tokens, slow = _iteration(model, seed=3)
    slow_trainer = Trainer(model, optim, loss)
    assert fast_tokens == slow_tokens
    # 48-token rows: 48 positions at the 16-token default, 64 at the earlier 64-token bucket.
    assert fast.tokens.shape == (PROMPTS * GROUP, 48) and slow.tokens.shape == (PROMPTS * GROUP, 64)
    for name in ("tokens", "loss_weights", "positions", "segment_ids"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name)[:, :48], err_msg=name)
        assert not getattr(slow, name)[:, 48:].any(), name
    np.testing.assert_allclose(fast.old_logprobs, slow.old_logprobs[:, :48], rtol=1e-5, atol=1e-5)
    assert fast_trainer.share_prefixes and not slow_trainer.share_prefixes
    assert all("full_index" in mb for mb in fast_trainer._local_micro_batches(fast))  # the shared path ran
    a, b = fast_trainer.gradients(fast), slow_trainer.gradients(slow)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * np.abs(y).max())
