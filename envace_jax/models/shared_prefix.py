"""The cache-free forward over rows that begin with the same tokens, with those tokens computed once.

Why: the rows of a GRPO group are several completions of one prompt, and a cache-free forward (the
update's, the log-prob recomputation's) runs every row's prompt through every layer again. Here each
shared prefix runs once: ``P`` prefixes ``[P, Lp]`` and ``R`` suffix rows ``[R, Ls]``, where row ``r`` is
prefix ``row_prefix[r]``'s first ``row_prefix_lens[r]`` tokens followed by its own suffix. Every
token-wise op (projections, norms, RoPE, the MLP) runs on the ``P * Lp + R * Ls`` tokens laid out as one
``[1, N]`` row; attention alone sees the structure (``PrefixLayout``): a prefix attends causally to itself,
a suffix row to its prefix's keys and causally to its own. The hidden state of every position equals the
unshared forward's (it depends only on the tokens up to it); gradients reach the shared tokens from every
row that reads them.

The host side that finds the prefixes is ``rl.prefix_plan``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass
class PrefixLayout:
    """Where each row's shared part lies. ``prefix_width`` (``Lp``) is static; the rest are int32 arrays."""

    prefix_lens: jax.Array  # [P] valid tokens of each prefix
    row_prefix: jax.Array  # [R] the prefix a row continues
    row_prefix_lens: jax.Array  # [R] how many of that prefix's tokens begin the row (0: shares nothing)
    suffix_lens: jax.Array  # [R] valid tokens of the row after its prefix
    prefix_width: int = 0

    @property
    def prefix_tokens(self) -> int:
        """``P * Lp``: the first of the flat layout's tokens that belong to the suffix rows."""
        return int(self.prefix_lens.shape[0]) * self.prefix_width


jax.tree_util.register_dataclass(
    PrefixLayout,
    data_fields=["prefix_lens", "row_prefix", "row_prefix_lens", "suffix_lens"],
    meta_fields=["prefix_width"],
)

# attend(q, k, v, mask, causal) -> out: the model's dense attention (q [B, T, N, H], k/v [B, S, K, H]).
Attend = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, bool], jax.Array]


def flat_positions(layout: PrefixLayout, suffix_width: int) -> jax.Array:
    """RoPE positions ``[1, N]`` of the flat layout: ``0..Lp-1`` in each prefix, and a row's suffix
    continues after its shared tokens."""
    P, Lp = layout.prefix_lens.shape[0], layout.prefix_width
    prefix = jnp.tile(jnp.arange(Lp, dtype=jnp.int32), P)
    suffix = layout.row_prefix_lens[:, None] + jnp.arange(suffix_width, dtype=jnp.int32)[None, :]
    return jnp.concatenate([prefix, suffix.reshape(-1)])[None]


def attention(layout: PrefixLayout, q: jax.Array, k: jax.Array, v: jax.Array, attend: Attend) -> jax.Array:
    """Attention over the flat layout: q ``[1, N, heads, H]``, k/v ``[1, N, kv_heads, H]`` -> ``[1, N, heads, H]``."""
    P, R, Lp = layout.prefix_lens.shape[0], layout.row_prefix.shape[0], layout.prefix_width
    n_p = layout.prefix_tokens
    Ls = (q.shape[1] - n_p) // R

    def split(a):
        return a[0, :n_p].reshape(P, Lp, *a.shape[2:]), a[0, n_p:].reshape(R, Ls, *a.shape[2:])

    (qp, qs), (kp, ks), (vp, vs) = split(q), split(k), split(v)
    i = jnp.arange(Lp, dtype=jnp.int32)
    valid_p = i[None, :] < layout.prefix_lens[:, None]  # [P, Lp]
    prefix_mask = (i[:, None] >= i[None, :])[None] & valid_p[:, None, :]
    j = jnp.arange(Ls, dtype=jnp.int32)
    shared = i[None, :] < layout.row_prefix_lens[:, None]  # [R, Lp]: the prefix keys a row reads
    own = (j[:, None] >= j[None, :])[None] & (j[None, :] < layout.suffix_lens[:, None])[:, None, :]
    suffix_mask = jnp.concatenate([jnp.broadcast_to(shared[:, None, :], (R, Ls, Lp)), own], axis=-1)
    out_p = attend(qp, kp, vp, prefix_mask, True)
    keys = jnp.concatenate([kp[layout.row_prefix], ks], axis=1)
    values = jnp.concatenate([vp[layout.row_prefix], vs], axis=1)
    out_s = attend(qs, keys, values, suffix_mask, False)
    flat = jnp.concatenate([out_p.reshape(n_p, *q.shape[2:]), out_s.reshape(R * Ls, *q.shape[2:])])
    return flat[None]
