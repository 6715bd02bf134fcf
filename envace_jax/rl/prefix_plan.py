"""Finds the prefixes a micro-batch's rows share, for ``Qwen3.final_hidden_shared`` (host side, numpy).

The rows of one GRPO group (same ``group_ids``) are completions of one prompt. Their longest common
token prefix, rounded down to a multiple of ``multiple``, is computed once instead of once per row. Rows
in a group of one, or whose common prefix is shorter than ``multiple``, share nothing. The plan is kept
only when it runs at most ``max_share`` of the plain forward's positions; otherwise the caller runs the
plain forward (``None``).

Shapes are bucketed so that a run compiles few programs: the prefix count to a power of two, the prefix
and suffix widths to multiples of ``multiple``.
"""

from __future__ import annotations

import numpy as np

from envace_jax.models.shared_prefix import PrefixLayout
from envace_jax.sampling.plan import pow2_bucket


def _common_prefix(rows: np.ndarray, length: int) -> int:
    """How many leading tokens all of ``rows`` ``[G, L]`` have in common, up to ``length``."""
    same = (rows[:, :length] == rows[:1, :length]).all(0)
    return length if same.all() else int(np.argmin(same))


def plan(mb: dict[str, np.ndarray], *, multiple: int = 16, max_share: float = 0.9) -> dict[str, np.ndarray] | None:
    """The shared-prefix arrays of one micro-batch (``TrainBatch.arrays()`` rows), or None when sharing
    would save less than ``1 - max_share`` of the positions, or the rows are packed (several segments)."""
    tokens, seg, groups = mb["tokens"], mb["segment_ids"], mb["group_ids"]
    R, L = tokens.shape
    lengths = seg.astype(bool).sum(1)
    # One segment per row, left-aligned: the layout build_batch makes. Anything else runs unshared.
    if seg.max(initial=0) > 1 or not np.array_equal(seg.astype(bool), np.arange(L)[None] < lengths[:, None]):
        return None
    row_prefix = np.zeros(R, np.int32)
    row_len = np.zeros(R, np.int32)
    firsts, widths = [], []
    for g in np.unique(groups[groups >= 0]):
        rows = np.flatnonzero(groups == g)
        if len(rows) < 2:
            continue
        m = _common_prefix(tokens[rows], int(lengths[rows].min())) // multiple * multiple
        if m == 0:
            continue
        row_prefix[rows], row_len[rows] = len(firsts), m
        firsts.append(int(rows[0]))
        widths.append(m)
    if not firsts:
        return None
    P, Lp = pow2_bucket(len(firsts)), max(widths)
    suffix_lens = (lengths - row_len).astype(np.int32)
    Ls = max(-(-int(suffix_lens.max()) // multiple) * multiple, multiple)
    if P * Lp + R * Ls > max_share * R * L:
        return None
    prefix_tokens = np.zeros((P, Lp), np.int32)
    prefix_lens = np.zeros(P, np.int32)
    for i, (r, m) in enumerate(zip(firsts, widths)):
        prefix_tokens[i, :m] = tokens[r, :m]
        prefix_lens[i] = m
    suffix_tokens = np.zeros((R, Ls), np.int32)
    t = np.arange(L)[None, :]
    in_prefix = t < row_len[:, None]
    k = np.clip(t - row_len[:, None], 0, Ls - 1)  # the position's column in its row's suffix
    full_index = np.where(in_prefix, row_prefix[:, None] * Lp + t, P * Lp + np.arange(R)[:, None] * Ls + k)
    for r in range(R):
        suffix_tokens[r, : suffix_lens[r]] = tokens[r, row_len[r] : lengths[r]]
    return {
        "prefix_tokens": prefix_tokens,
        "suffix_tokens": suffix_tokens,
        "prefix_lens": prefix_lens,
        "row_prefix": row_prefix,
        "row_prefix_lens": row_len,
        "suffix_lens": suffix_lens,
        "full_index": full_index.astype(np.int32),
    }


def layout(mb) -> PrefixLayout:
    """The ``PrefixLayout`` of a micro-batch that holds a plan (device or host arrays)."""
    return PrefixLayout(
        mb["prefix_lens"], mb["row_prefix"], mb["row_prefix_lens"], mb["suffix_lens"], int(mb["prefix_tokens"].shape[1])
    )
