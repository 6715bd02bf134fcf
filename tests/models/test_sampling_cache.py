"""The model's KV-cache path: chunked prefill with uneven rows against transformers, the cache
layout, and dropped out-of-range writes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.helpers_models import make_tiny_hf_qwen3
from envace_jax.models import hf_io, qwen3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache_hf")
    hf = make_tiny_hf_qwen3(d, num_heads=4, num_kv_heads=2, head_dim=16)
    return hf, hf_io.load_hf(str(d))


def _chunk_step(model):
    return jax.jit(lambda ids, c, n: model(ids, cache=c, chunk_lengths=n))


def _stacked(cache):
    """The cache's per-layer buffers as numpy ``k [L, B, K, H, S]`` and ``v [L, B, K, S, H]``."""
    return np.stack([np.asarray(a) for a in cache.k]), np.stack([np.asarray(a) for a in cache.v])


def test_uneven_multi_chunk_prefill_matches_transformers(models):
    # Rows start at different ends and take different valid lengths per chunk, so every chunk mixes
    # cached-slot attention (slots < end) with causal attention inside the chunk.
    hf, model = models
    rng = np.random.RandomState(0)
    seqs = [rng.randint(3, 256, 13), rng.randint(3, 256, 13), rng.randint(3, 256, 13)]
    with torch.no_grad():
        ref = [hf(torch.tensor(s[None])).logits[0].numpy() for s in seqs]
    takes = [[5, 2, 0], [1, 6, 5], [7, 5, 8]]  # per chunk, per row: tokens written
    cache = model.init_cache(batch=3, size=24)
    step = _chunk_step(model)
    done = np.zeros(3, int)
    for take in takes:
        T = 8
        ids = np.zeros((3, T), np.int32)
        for r in range(3):
            ids[r, : take[r]] = seqs[r][done[r] : done[r] + take[r]]
        logits, cache = step(jnp.asarray(ids), cache, jnp.asarray(take, jnp.int32))
        logits = np.asarray(logits)
        for r in range(3):
            if take[r]:
                err = np.abs(logits[r, : take[r]] - ref[r][done[r] : done[r] + take[r]]).max()
                assert err <= 1e-4, (r, done[r], err)
        done += take
    np.testing.assert_array_equal(np.asarray(cache.end), done)


def test_cache_layout_holds_keys_slots_last(models):
    # One buffer per layer, k[l] [B, K, H, S] and v[l] [B, K, S, H]: a one-token write at slot s of
    # row b equals the same token's k/v written into a fresh cache by a chunk of its own.
    _, model = models
    cfg = model.config
    ks, vs = qwen3.KVCache.shapes(cfg, 2, 10)
    assert ks == (2, cfg.num_kv_heads, cfg.head_dim, 10)
    assert vs == (2, cfg.num_kv_heads, 10, cfg.head_dim)
    step = _chunk_step(model)
    cache = model.init_cache(batch=2, size=10)
    ids = jnp.asarray([[11, 12, 13], [21, 22, 23]], jnp.int32)
    _, cache = step(ids, cache, jnp.asarray([3, 2], jnp.int32))
    assert len(cache.k) == len(cache.v) == cfg.num_layers and cache.size == 10
    assert all(a.shape == ks for a in cache.k) and all(a.shape == vs for a in cache.v)
    k, v = _stacked(cache)
    # Position of the written token matters (rotary), so compare against the no-cache projection
    # of the same prefix: slot 2 of row 0 holds token 13 at position 2.
    fresh = model.init_cache(batch=1, size=10)
    _, fresh = step(jnp.asarray([[11, 12, 13]], jnp.int32), fresh, jnp.asarray([3], jnp.int32))
    fk, fv = _stacked(fresh)
    np.testing.assert_allclose(k[:, 0, :, :, 2], fk[:, 0, :, :, 2], atol=1e-6)
    np.testing.assert_allclose(v[:, 0, :, 2], fv[:, 0, :, 2], atol=1e-6)
    # Row 1 wrote padding at slot 2 (past its end of 2); slots past the padded chunk stay zero.
    assert not k[:, :, :, :, 3:].any() and not v[:, :, :, 3:].any()


def test_writes_past_the_cache_are_dropped_not_clamped(models):
    _, model = models
    step = _chunk_step(model)
    cache = model.init_cache(batch=1, size=8)
    _, cache = step(jnp.asarray([list(range(3, 9))], jnp.int32), cache, jnp.asarray([6], jnp.int32))
    k0, v0 = _stacked(cache)
    # A 4-token chunk at end 6 has room for 2 slots; the other 2 must vanish, not overwrite 4..5.
    _, cache = step(jnp.asarray([[40, 41, 42, 43]], jnp.int32), cache, jnp.asarray([4], jnp.int32))
    k1, v1 = _stacked(cache)
    np.testing.assert_array_equal(k1[..., :6], k0[..., :6])
    np.testing.assert_array_equal(v1[:, :, :, :6], v0[:, :, :, :6])
    assert not k0[..., 6:].any() and (np.abs(k1[..., 6:]).max(axis=(0, 1, 2, 3)) > 0).all()
    assert (np.abs(v1[:, :, :, 6:]).max(axis=(0, 1, 2, 4)) > 0).all()
    np.testing.assert_array_equal(np.asarray(cache.end), [10])
