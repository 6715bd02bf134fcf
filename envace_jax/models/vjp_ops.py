"""Projection and attention with hand-written backward passes, for the training step.

Autodiff of ``einsum`` computes a weight gradient as a dot followed by a transpose, and XLA CPU then
moves that transpose onto the activations: every decoder layer's backward transposed its
``[tokens, mlp]`` activation gradients in a slow strided pass before the weight-gradient matmul. The
backward passes written here ask for the gradients in the layout of the arrays they belong to, so the
matmul kernels read both operands as stored (a contraction over the token axis is a transposed-operand
GEMM, which the kernels do natively).

The attention backward keeps only the probabilities (not the masked scores, the max and the sum that
autodiff keeps as well) and forms the score gradient in one elementwise pass.

Numerics: the same float32 (or ``preferred_element_type``) matmuls and softmax as the plain code; only
summation order differs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from envace_jax.models.numerics import MASK_VALUE

F32 = jnp.float32


def _mm(spec, a, b, out_dtype):
    return jnp.einsum(spec, a, b, preferred_element_type=F32).astype(out_dtype)


@jax.custom_vjp
def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w``: x ``[N, K]``, w ``[K, M]`` -> ``[N, M]`` in x's dtype, float32 accumulation."""
    return _mm("nk,km->nm", x, w, x.dtype)


def _dense_fwd(x, w):
    return dense(x, w), (x, w)


def _dense_bwd(res, dy):
    x, w = res
    dx = _mm("nm,km->nk", dy, w, x.dtype)
    dw = _mm("nk,nm->km", x, dy, w.dtype)  # contraction over tokens, result already [K, M]
    return dx, dw


dense.defvjp(_dense_fwd, _dense_bwd)


def causal_blocks(length: int) -> int:
    """How many query blocks a causal attention over ``length`` positions is split into: 4 when the
    blocks stay at least 32 rows (the keys after a block's last query are skipped, which removes 3/8 of
    the score work), else 2, else 1."""
    for n in (4, 2):
        if length % n == 0 and length // n >= 32:
            return n
    return 1


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, causal: bool = False) -> jax.Array:
    """Grouped-query softmax attention. q ``[B, T, N, H]``, k/v ``[B, S, K, H]``, mask ``[B, T, S]`` bool
    -> ``[B, T, N, H]``. Scores and softmax in float32; masked keys get ``MASK_VALUE`` (a row with no
    visible key attends uniformly, as the plain formula does, and gets no gradient).

    ``causal=True`` promises that the mask hides every key after its query (``T == S``, key ``s > t``
    masked): queries are then processed in ``causal_blocks(T)`` blocks that skip the keys after the
    block, which are masked anyway (same result, less work).

    Internally every matmul is a batched ``[B*K, rows, cols]`` product whose large ``[rows, S]`` operand
    is read as stored: only the small q/k/v/output tensors are transposed. Rows are (query, group)
    pairs, query-major, so a block of queries is a contiguous block of rows."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    if causal and T != S:
        raise ValueError(f"causal attention needs as many keys as queries, got {T} queries and {S} keys")
    nb = causal_blocks(T) if causal else 1
    qh = q.reshape(B, T, K, G, H).transpose(0, 2, 1, 3, 4).reshape(B * K, T * G, H)
    kh = k.transpose(0, 2, 1, 3).reshape(B * K, S, H)
    vh = v.transpose(0, 2, 1, 3).reshape(B * K, S, H)
    o = _attention(qh, kh, vh, mask, K, nb)
    return o.reshape(B, K, T, G, H).transpose(0, 2, 1, 3, 4).reshape(B, T, N, H)


def _blocks(T: int, S: int, nb: int):
    """(first query, last query + 1, visible keys) of each query block."""
    c = T // nb
    return [(i * c, (i + 1) * c, S if nb == 1 else (i + 1) * c) for i in range(nb)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(qh, kh, vh, mask, K, nb):
    return _attention_fwd(qh, kh, vh, mask, K, nb)[0]


def _attention_fwd(qh, kh, vh, mask, K, nb):
    B, T, S = mask.shape
    H = qh.shape[-1]
    G = qh.shape[1] // T
    outs, probs = [], []
    for t0, t1, sk in _blocks(T, S, nb):
        s = jnp.einsum("zmh,zsh->zms", qh[:, t0 * G : t1 * G], kh[:, :sk], preferred_element_type=F32) * (H**-0.5)
        s = jnp.where(mask[:, None, t0:t1, None, :sk], s.reshape(B, K, t1 - t0, G, sk), MASK_VALUE)
        p = jax.nn.softmax(s, axis=-1).reshape(B * K, (t1 - t0) * G, sk).astype(vh.dtype)
        outs.append(_mm("zms,zsh->zmh", p, vh[:, :sk], vh.dtype))
        probs.append(p)
    if nb == 1:
        o = outs[0]
    else:
        # A row with no visible key (padding) attends uniformly to all S keys in the plain formula; its
        # blocks saw only a prefix of them, so its output is set to the mean of all values.
        o = jnp.where(
            _live_rows(mask, K, G),
            jnp.concatenate(outs, axis=1),
            jnp.mean(vh.astype(F32), axis=1, keepdims=True).astype(vh.dtype),
        )
    return o, (qh, kh, vh, mask, tuple(probs), o)


def _live_rows(mask, K, G):
    """``[B*K, T*G, 1]`` bool: the (query, group) row has at least one visible key."""
    B, T, _ = mask.shape
    return jnp.broadcast_to(jnp.any(mask, axis=-1)[:, None, :, None], (B, K, T, G)).reshape(B * K, T * G, 1)


def _attention_bwd(K, nb, res, do):
    qh, kh, vh, mask, probs, o = res
    B, T, S = mask.shape
    H = qh.shape[-1]
    G = qh.shape[1] // T
    # Softmax backward: ds = p * (dp - sum_s p dp), and sum_s p dp = sum_h do * o.
    delta = jnp.sum(do.astype(F32) * o.astype(F32), axis=-1, keepdims=True)
    # Masked keys already have p == 0 in a row with any visible key; a row with none (padding) had
    # constant scores, so it gets no gradient: a per-row factor instead of a pass over the mask.
    live = _live_rows(mask, K, G)
    scale = jnp.where(live, H**-0.5, 0.0)
    dq, dkt, dvt = [], 0.0, 0.0
    if nb > 1:  # rows with no visible key took the mean of all values (see the forward)
        dvt = jnp.sum(jnp.where(live, 0.0, do.astype(F32)), axis=1)[:, :, None] / S
        do = jnp.where(live, do, 0.0).astype(do.dtype)
    for (t0, t1, sk), p in zip(_blocks(T, S, nb), probs):
        r = slice(t0 * G, t1 * G)
        dob, qb = do[:, r], qh[:, r]
        # Gradients of k and v come out as [B*K, H, keys]: the contraction over query rows then
        # transposes only the small q / do operand, never the [rows, keys] probabilities.
        pad = ((0, 0), (0, 0), (0, S - sk))
        dvt = dvt + jnp.pad(_mm("zmh,zms->zhs", dob, p, F32), pad)
        dp = jnp.einsum("zmh,zsh->zms", dob, vh[:, :sk], preferred_element_type=F32)
        ds = (p.astype(F32) * (dp - delta[:, r]) * scale[:, r]).astype(qh.dtype)
        dq.append(_mm("zms,zsh->zmh", ds, kh[:, :sk], qh.dtype))
        dkt = dkt + jnp.pad(_mm("zmh,zms->zhs", qb, ds, F32), pad)
    dq = dq[0] if nb == 1 else jnp.concatenate(dq, axis=1)
    return dq, dkt.swapaxes(1, 2).astype(kh.dtype), dvt.swapaxes(1, 2).astype(vh.dtype), None


_attention.defvjp(_attention_fwd, _attention_bwd)
