"""The sampler's per-row KV cache: its layout, chunk attention over it, and the one write per chunk.

With a cache, each row ``b`` writes its chunk at cache slots ``cache.end[b] + t``; a query at slot
``s`` sees every key slot ``j <= s``. Chunks are right-padded per row; the caller advances ``end`` by
each row's valid length (``chunk_lengths``), so padding written past ``end`` is overwritten by the
next chunk and never read by a valid query. Slots past the cache size are dropped, so a full row never
overwrites its earlier slots; the caller reports such a row as ``cache_full``.

How the cache path runs (why, measured on CPU where decoding is memory-bound): the cache is
*read-only* inside the model's layer scan. Each layer attends to the cached slots ``j < end[b]`` and,
separately, causally within the chunk's own fresh keys/values; the two score blocks share one
softmax. All layers' fresh keys and values leave the scan as its outputs and are written with one
scatter after it (``write_chunk``). Writing per layer inside the scan instead made XLA carry, slice
and re-layout the whole cache at every layer. Keys are stored ``[.., H, S]`` (slots last) so the
score product reads them without a transpose; values ``[.., S, H]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from envace_jax.models.numerics import MASK_VALUE, as_dtype


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Per-row KV cache. ``k``: ``[L, B, K, H, S]`` (slots last), ``v``: ``[L, B, K, S, H]``;
    ``end``: ``[B]`` int32 filled slots."""

    k: jax.Array
    v: jax.Array
    end: jax.Array

    @property
    def size(self) -> int:
        return self.v.shape[3]

    @staticmethod
    def shapes(cfg: Any, batch: int, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of ``k`` and ``v`` for ``batch`` rows of ``size`` slots."""
        L, K, H = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        return (L, batch, K, H, size), (L, batch, K, size, H)

    @classmethod
    def init(cls, cfg: Any, batch: int, size: int, dtype: Any = None) -> "KVCache":
        dt = as_dtype(dtype or cfg.dtype)
        ks, vs = cls.shapes(cfg, batch, size)
        return cls(jnp.zeros(ks, dt), jnp.zeros(vs, dt), jnp.zeros((batch,), jnp.int32))


# Logical axes of KVCache.k and KVCache.v (their layouts differ: see the module docstring).
CACHE_K_AXES = ("layers", "batch", "act_kv_heads", None, "cache_length")
CACHE_V_AXES = ("layers", "batch", "act_kv_heads", "cache_length", None)
# Axis of the slots in KVCache.k / KVCache.v.
CACHE_K_SLOT_AXIS, CACHE_V_SLOT_AXIS = 4, 3


def cached_attention(q, k_new, v_new, k_cache, v_cache, cached):
    """Chunk attention over read-only cached slots plus the chunk's own keys (causal).

    q ``[B,T,N,H]``; k_new/v_new ``[B,T,K,H]`` (this chunk); k_cache ``[B,K,H,S]``, v_cache
    ``[B,K,S,H]``; cached ``[B,S]`` bool (slot holds a key every chunk query may see) ->
    ``[B,T,N,H]``. The two score blocks share one softmax, normalised after the value products
    (on ``[B,K,G,T,H]`` rather than on the ``S``-long probabilities).
    """
    B, T, N, H = q.shape
    K = k_new.shape[2]
    qg = (q * jnp.asarray(H ** -0.5, q.dtype)).reshape(B, T, K, N // K, H)
    if T == 1:
        # One decode token: per (row, kv head) this is a [G, H] x [H, S] product, which XLA CPU runs as a
        # batched dot ~8x slower than reading the cache; multiply + reduce over H streams the cache once
        # (a batch-32 decode step of the 40M benchmark model: 85 -> 63 ms, alternating in one process).
        q1 = jnp.transpose(qg, (0, 2, 3, 1, 4)).astype(jnp.float32)  # [B,K,G,1,H]
        s_old = jnp.sum(q1[..., None] * k_cache[:, :, None, None].astype(jnp.float32), axis=-2)
    else:
        s_old = jnp.einsum("btkgh,bkhs->bkgts", qg, k_cache, preferred_element_type=jnp.float32)
    s_old = jnp.where(cached[:, None, None, None, :], s_old, MASK_VALUE)
    s_new = jnp.einsum("btkgh,bukh->bkgtu", qg, k_new, preferred_element_type=jnp.float32)
    causal = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
    s_new = jnp.where(causal, s_new, MASK_VALUE)
    m = jnp.maximum(s_old.max(-1, keepdims=True), s_new.max(-1, keepdims=True))
    e_old, e_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
    den = e_old.sum(-1) + e_new.sum(-1)  # [B,K,G,T]
    dt = v_new.dtype
    out = (jnp.einsum("bkgts,bksh->bkgth", e_old.astype(dt), v_cache, preferred_element_type=jnp.float32)
           + jnp.einsum("bkgtu,bukh->bkgth", e_new.astype(dt), v_new, preferred_element_type=jnp.float32))
    out = (out / den[..., None]).astype(dt)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, N, H)


def write_chunk(cache: KVCache, k_new: jax.Array, v_new: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatters every layer's chunk keys/values at slots ``cache.end[b] + t`` (one scatter each).

    k_new/v_new ``[L, B, T, K, H]``. Returns the new ``k`` ``[L, B, K, H, S]`` and ``v``
    ``[L, B, K, S, H]``. Slots past the cache size are dropped, never clamped onto earlier slots.
    """
    B, T = k_new.shape[1], k_new.shape[2]
    rows = jnp.arange(B, dtype=jnp.int32)[:, None]
    slots = cache.end[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    # Advanced indices split by slices put the (B, T) index dims first: updates are [B, T, L, K, H].
    upd_k = jnp.transpose(k_new, (1, 2, 0, 3, 4)).astype(cache.k.dtype)
    upd_v = jnp.transpose(v_new, (1, 2, 0, 3, 4)).astype(cache.v.dtype)
    k = cache.k.at[:, rows, :, :, slots].set(upd_k, mode="drop")
    v = cache.v.at[:, rows, :, slots, :].set(upd_v, mode="drop")
    return k, v
