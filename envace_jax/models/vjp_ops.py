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


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention. q ``[B, T, N, H]``, k/v ``[B, S, K, H]``, mask ``[B, T, S]`` bool
    -> ``[B, T, N, H]``. Scores and softmax in float32; masked keys get ``MASK_VALUE`` (a row with no
    visible key attends uniformly, as the plain formula does, and gets no gradient).

    Internally every matmul is a batched ``[B*K, rows, cols]`` product whose large ``[G*T, S]`` operand
    is read as stored: only the small q/k/v/output tensors are transposed."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qh = q.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B * K, G * T, H)
    kh = k.transpose(0, 2, 1, 3).reshape(B * K, S, H)
    vh = v.transpose(0, 2, 1, 3).reshape(B * K, S, H)
    o = _attention(qh, kh, vh, mask, K, G)
    return o.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def _mask_scores(s, mask, K, G):
    """s ``[B*K, G*T, S]`` -> same with masked keys set to MASK_VALUE (mask ``[B, T, S]``)."""
    B, T, S = mask.shape
    s = jnp.where(mask[:, None, None], s.reshape(B, K, G, T, S), MASK_VALUE)
    return s.reshape(B * K, G * T, S)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(qh, kh, vh, mask, K, G):
    return _attention_fwd(qh, kh, vh, mask, K, G)[0]


def _attention_fwd(qh, kh, vh, mask, K, G):
    H = qh.shape[-1]
    s = jnp.einsum("zmh,zsh->zms", qh, kh, preferred_element_type=F32) * (H ** -0.5)
    p = jax.nn.softmax(_mask_scores(s, mask, K, G), axis=-1).astype(vh.dtype)
    o = _mm("zms,zsh->zmh", p, vh, vh.dtype)
    return o, (qh, kh, vh, mask, p, o)


def _attention_bwd(K, G, res, do):
    qh, kh, vh, mask, p, o = res
    H = qh.shape[-1]
    B, T, S = mask.shape
    # Gradients of k and v come out as [B*K, H, S]: the contraction over query rows then transposes
    # only the small q / do operand, never the [G*T, S] probabilities.
    dvt = _mm("zmh,zms->zhs", do, p, vh.dtype)
    dp = jnp.einsum("zmh,zsh->zms", do, vh, preferred_element_type=F32)
    # Softmax backward: ds = p * (dp - sum_s p dp), and sum_s p dp = sum_h do * o.
    delta = jnp.sum(do.astype(F32) * o.astype(F32), axis=-1, keepdims=True)
    # Masked keys already have p == 0 in a row with any visible key; a row with none (padding) had
    # constant scores, so it gets no gradient: a per-row factor instead of a pass over the mask.
    live = jnp.broadcast_to(jnp.any(mask, axis=-1)[:, None, None], (B, K, G, T)).reshape(B * K, G * T, 1)
    ds = (p.astype(F32) * (dp - delta) * jnp.where(live, H ** -0.5, 0.0)).astype(qh.dtype)
    dq = _mm("zms,zsh->zmh", ds, kh, qh.dtype)
    dkt = _mm("zmh,zms->zhs", qh, ds, kh.dtype)
    return dq, dkt.swapaxes(1, 2), dvt.swapaxes(1, 2), None


_attention.defvjp(_attention_fwd, _attention_bwd)
