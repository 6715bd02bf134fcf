"""Token log-probs straight from the final hidden states, with a hand-written backward pass.

``log_softmax(h @ W / T)[target]`` is the whole output layer of an update step: on the benchmark's 41.6M
model its vocabulary projection is a third of the step's FLOPs and its ``[tokens, V]`` float32 logits
are the largest tensors of the step. Left to autodiff, the log-softmax keeps its own copy of the
scaled logits, the exponentials and the scattered target gradient, and the weight gradient transposes
the whole ``[tokens, V]`` cotangent before its matmul. Here the forward keeps only the logits
(one ``[tokens, V]`` buffer) and the backward turns them into the logits' cotangent in one
elementwise pass, ``g * (onehot(target) - softmax)``, which then feeds both gradient matmuls in the
layouts the CPU matmul kernels take without a transpose of the big operand.

Values equal ``token_logprobs(h @ W, targets, T)`` up to float32 rounding (the temperature scales the
hidden state before the matmul instead of the logits after it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from envace_jax.models.numerics import as_dtype
from envace_jax.rl.loss import check_temperature


def _project(xs, w, layout: str, dt):
    spec = "nd,vd->nv" if layout == "vd" else "nd,dv->nv"
    return jnp.einsum(spec, xs.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _logp(xs, w, y, layout, dt):
    return _logp_fwd(xs, w, y, layout, dt)[0]


def _logp_fwd(xs, w, y, layout, dt):
    z = _project(xs, w, layout, dt)  # [N, V] float32: the one vocabulary-sized buffer kept for backward
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0]
    return picked - lse, (xs, w, z, lse, y)


def _logp_bwd(layout, dt, res, g):
    xs, w, z, lse, y = res
    # d logp / d z = onehot(y) - softmax(z): one elementwise pass over z, no scatter.
    hit = jnp.arange(z.shape[-1], dtype=jnp.int32)[None, :] == y[:, None]
    dz = (g[:, None] * (hit.astype(jnp.float32) - jnp.exp(z - lse[:, None]))).astype(dt)
    wc, xc = w.astype(dt), xs.astype(dt)
    if layout == "vd":
        dxs = jnp.einsum("nv,vd->nd", dz, wc, preferred_element_type=jnp.float32)
        # [D, V] then one transpose of the (small) weight gradient, instead of transposing dz.
        dw = jnp.einsum("nd,nv->dv", xc, dz, preferred_element_type=jnp.float32).T
    else:
        dxs = jnp.einsum("nv,dv->nd", dz, wc, preferred_element_type=jnp.float32)
        dw = jnp.einsum("nd,nv->dv", xc, dz, preferred_element_type=jnp.float32)
    return dxs.astype(xs.dtype), dw.astype(w.dtype), None


_logp.defvjp(_logp_fwd, _logp_bwd)


def fused_token_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    temperature=1.0,
    *,
    head_layout: str = "vd",
    compute_dtype=None,
) -> jax.Array:
    """``log_softmax(hidden @ head / temperature)`` at ``targets``, differentiable in hidden and head.

    Args:
      hidden: ``[B, T, D]`` final hidden states, after the final norm.
      head: ``[V, D]`` (``head_layout="vd"``, tied embeddings) or ``[D, V]`` (``"dv"``, an lm_head).
      targets: int ``[B, T]``.
      temperature: a positive scalar, or an array broadcastable to ``[B, T]`` (e.g. ``[B, 1]`` per row).
      compute_dtype: dtype of the matmul inputs (default ``hidden.dtype``); accumulation and the
        softmax are float32.

    Returns:
      float32 ``[B, T]``.
    """
    if head_layout not in ("dv", "vd"):
        raise ValueError(f"head_layout must be 'dv' or 'vd', got {head_layout!r}")
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [B, T, D], got {tuple(hidden.shape)}")
    B, T, D = hidden.shape
    if targets.shape != (B, T):
        raise ValueError(f"targets {tuple(targets.shape)} must be [B, T] = {(B, T)} like hidden")
    if head.ndim != 2 or head.shape[1 if head_layout == "vd" else 0] != D:
        raise ValueError(f"head {tuple(head.shape)} does not match hidden size {D} with layout {head_layout!r}")
    check_temperature(temperature)
    dt = hidden.dtype if compute_dtype is None else as_dtype(compute_dtype)
    # Scaling the [B, T, D] input instead of the [B, T, V] logits: autodiff handles it outside the
    # custom backward, at a cost of D instead of V per token.
    inv_t = (
        jnp.broadcast_to(1.0 / jnp.asarray(temperature, jnp.float32), (B, T))
        if jnp.ndim(temperature)
        else jnp.full((B, T), 1.0 / temperature, jnp.float32)
    )
    xs = hidden.astype(jnp.float32) * inv_t[..., None]
    lp = _logp(xs.reshape(B * T, D), head, targets.reshape(B * T).astype(jnp.int32), head_layout, jnp.dtype(dt))
    return lp.reshape(B, T)


def gathered_token_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    index: jax.Array,
    temperature=1.0,
    *,
    head_layout: str = "vd",
    compute_dtype=None,
) -> jax.Array:
    """``fused_token_logprobs`` at the trained positions only, zeros elsewhere.

    An SFT or RL row trains on its response, not on its prompt or padding: in the demo's rows about a
    quarter of the positions carry a loss weight. The vocabulary projection and its log-softmax are the
    costliest per-position work of the step, so they run on those positions alone; the layers below
    still see every position (attention needs them).

    Args:
      hidden: ``[B, T, D]``; the rows fall into ``G`` equal groups of consecutive rows (one per data
        shard of the batch, so the gather never crosses devices).
      index: int ``[G, K]``, flat positions ``row * T + t`` within each group of ``B // G`` rows
        (``trained_positions`` builds it); entries ``>= (B // G) * T`` are padding and are dropped.
      targets, temperature, head_layout, compute_dtype: as ``fused_token_logprobs``.

    Returns:
      float32 ``[B, T]``: the log-probs at the indexed positions, 0 at every other position.
    """
    B, T, D = hidden.shape
    G, K = index.shape
    if B % G:
        raise ValueError(f"index has {G} row groups, which do not divide the batch of {B} rows")
    n = (B // G) * T
    temp = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (B, T)).reshape(G, n)
    # Padding entries read the group's last position (any real one would do) and are dropped on the way
    # back, so their cotangent is 0 and nothing reaches the hidden state through them.
    safe = jnp.minimum(index, n - 1)
    hs = jnp.take_along_axis(hidden.reshape(G, n, D), safe[..., None], axis=1)
    ys = jnp.take_along_axis(targets.reshape(G, n), safe, axis=1)
    ts = jnp.take_along_axis(temp, safe, axis=1)
    lp = fused_token_logprobs(hs, head, ys, ts, head_layout=head_layout, compute_dtype=compute_dtype)
    out = jax.vmap(lambda i, v: jnp.zeros((n,), jnp.float32).at[i].set(v, mode="drop"))(index, lp)
    return out.reshape(B, T)
