"""The sampler's per-row KV cache: its layout, the one write per chunk, and attention over it.

The cache holds one buffer per layer (``k[l]`` ``[B, K, H, S]`` with slots last, so the score
product reads keys without a transpose; ``v[l]`` ``[B, K, S, H]``) and ``end[b]``, the slots row
``b`` has filled. A chunk of ``T`` tokens is written at slots ``end[b] + t`` *before* the layer
attends, and query ``t`` then sees every slot ``j <= end[b] + t``. Chunks are right-padded per row;
the caller advances ``end`` by each row's valid length (``chunk_lengths``), so padding written past
``end`` is overwritten by the row's next chunk before any valid query can see it. Slots past the
cache size are dropped, so a full row never overwrites its earlier slots; the caller reports such a
row as ``cache_full``.

Why per-layer buffers, written in place before the read (measured on CPU, where decoding is
memory-bound): with one stacked ``[L, ...]`` array read inside a scan over layers, XLA copied each
layer's slice of the cache (and of the stacked weights) out at every decode step, about a third of
the step beyond its floor. Separate buffers are read where they lie, and the write of one token per
layer is an in-place scatter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from envace_jax.models.numerics import MASK_VALUE, as_dtype, is_16bit_float


def cache_dtype(cfg: Any, cpu: bool) -> jnp.dtype:
    """The dtype of the sampler's k/v buffers for ``cfg``: its compute dtype, except float32 on CPU when
    that dtype is a 16-bit float.

    Why: XLA CPU has no bfloat16 scatter, so the one-slot write of a decode step converted the layer's whole
    k and v buffers to float32 and back at every step, and the attention products converted them again
    (at Qwen3-0.6B shape, batch 32, bfloat16: a decode step of 472 ms against 155 ms of weight products and
    a cache read). The keys and values are rounded to the compute dtype before they are written, so a float32
    buffer holds exactly what a bfloat16 one would: the same numbers, twice the bytes."""
    dt = jnp.dtype(as_dtype(cfg.dtype))
    return jnp.dtype(jnp.float32) if cpu and is_16bit_float(dt) else dt


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Per-row KV cache: ``k``/``v`` tuples of per-layer buffers (``k[l]`` ``[B, K, H, S]``, slots
    last; ``v[l]`` ``[B, K, S, H]``), ``end`` ``[B]`` int32 filled slots."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    end: jax.Array

    @property
    def size(self) -> int:
        return self.v[0].shape[CACHE_V_SLOT_AXIS]

    @staticmethod
    def shapes(cfg: Any, batch: int, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of one layer's ``k`` and ``v`` buffers for ``batch`` rows of ``size`` slots."""
        K, H = cfg.num_kv_heads, cfg.head_dim
        return (batch, K, H, size), (batch, K, size, H)

    @classmethod
    def init(cls, cfg: Any, batch: int, size: int, dtype: Any = None) -> "KVCache":
        dt = as_dtype(dtype or cfg.dtype)
        ks, vs = cls.shapes(cfg, batch, size)
        L = cfg.num_layers
        return cls(
            tuple(jnp.zeros(ks, dt) for _ in range(L)),
            tuple(jnp.zeros(vs, dt) for _ in range(L)),
            jnp.zeros((batch,), jnp.int32),
        )


# Logical axes of one layer's KVCache.k and KVCache.v buffer (their layouts differ: see above).
CACHE_K_AXES = ("batch", "act_kv_heads", None, "cache_length")
CACHE_V_AXES = ("batch", "act_kv_heads", "cache_length", None)
# Axis of the slots in one layer's KVCache.k / KVCache.v buffer.
CACHE_K_SLOT_AXIS, CACHE_V_SLOT_AXIS = 3, 2


def visible_slots(end: jax.Array, chunk: int, size: int) -> jax.Array:
    """bool ``[B, T, S]``: query ``t`` of row ``b`` (at slot ``end[b] + t``) sees slot ``j`` iff
    ``j <= end[b] + t``. Built once per chunk and shared by every layer."""
    pos = end[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :]
    return jnp.arange(size, dtype=jnp.int32)[None, None, :] <= pos[:, :, None]


def write_chunk(
    k_cache: jax.Array, v_cache: jax.Array, k_new: jax.Array, v_new: jax.Array, end: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Scatters one layer's chunk keys/values ``[B, T, K, H]`` at slots ``end[b] + t``.

    Slots past the cache size are dropped, never clamped onto earlier slots.
    """
    B, T = k_new.shape[:2]
    rows = jnp.arange(B, dtype=jnp.int32)[:, None]
    slots = end[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    # Advanced indices split by a slice put the (B, T) index dims first: updates are [B, T, K, H].
    k = k_cache.at[rows, :, :, slots].set(k_new.astype(k_cache.dtype), mode="drop")
    v = v_cache.at[rows, :, slots, :].set(v_new.astype(v_cache.dtype), mode="drop")
    return k, v


def cached_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, visible: jax.Array) -> jax.Array:
    """Chunk attention over one layer's cache, the chunk already written into it.

    q ``[B,T,N,H]``; k_cache ``[B,K,H,S]``, v_cache ``[B,K,S,H]``; visible ``[B,T,S]`` bool
    (``visible_slots``) -> ``[B,T,N,H]``. Scores and the softmax are float32.
    """
    B, T, N, H = q.shape
    K = k_cache.shape[1]
    qg = (q * jnp.asarray(H**-0.5, q.dtype)).reshape(B, T, K, N // K, H)
    if T == 1:
        # One decode token: per (row, kv head) this is a [G, H] x [H, S] product, which XLA CPU runs as a
        # batched dot ~8x slower than reading the cache; multiply + reduce over H streams the cache once
        # (a batch-32 decode step of the 40M benchmark model: 85 -> 63 ms, alternating in one process).
        q1 = jnp.transpose(qg, (0, 2, 3, 1, 4)).astype(jnp.float32)  # [B,K,G,1,H]
        s = jnp.sum(q1[..., None] * k_cache[:, :, None, None].astype(jnp.float32), axis=-2)
    else:
        # q as [B,K,G,T,H] first: with q's own [B,T,K,G,H] layout XLA CPU lowered this product to a dot it
        # cannot run in bfloat16 with a float32 result ("Unsupported element type for DotThunk").
        s = jnp.einsum(
            "bkgth,bkhs->bkgts", jnp.transpose(qg, (0, 2, 3, 1, 4)), k_cache, preferred_element_type=jnp.float32
        )
    s = jnp.where(visible[:, None, None], s, MASK_VALUE)
    m = s.max(-1, keepdims=True)
    e = jnp.exp(s - m)
    den = e.sum(-1)  # [B,K,G,T]
    # Normalised after the value product (on [B,K,G,T,H] rather than on the S-long probabilities).
    if T == 1:
        # The value product as multiply + reduce over S too, for the same reason as the scores (0.6B width,
        # bfloat16, batch 32: 8 layers' step 87 -> 79 ms; float32 unchanged within noise).
        out = jnp.sum(e[..., None] * v_cache[:, :, None, None].astype(jnp.float32), axis=-2)
    else:
        dt = v_cache.dtype
        out = jnp.einsum("bkgts,bksh->bkgth", e.astype(dt), v_cache, preferred_element_type=jnp.float32)
    out = (out / den[..., None]).astype(q.dtype)
    if T == 1:
        # [B,K,G,1,H] is already [B,1,N,H] in memory; a transpose here (a no-op for T = 1) led XLA CPU
        # to re-lay out the activation and transpose o_proj's weights at every decode step.
        return out.reshape(B, T, N, H)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, N, H)
