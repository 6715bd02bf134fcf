"""The sampler's host-side plan for one call: pure numpy, no model (so it is testable on its own).

``plan_batch`` decides, for every row of a ``Sampler.generate`` / ``continue_`` call: where the row
starts (a fresh prompt, or a kept row of the previous state with its cache end, PRNG stream and
pending token), whether its new tokens fit, how many tokens it may generate and why it would stop,
how its tokens are split into prefill chunks, how large the device cache window must be, and the
decode budget. ``BatchPlan.next_state`` turns the decode results back into the host bookkeeping of
the next ``SamplerState``. The jitted programs that carry the plan out live in ``sampling.loop``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from envace_jax.sampling.records import SamplingParams

RUNNING, STOP, LENGTH, CACHE_FULL = 0, 1, 2, 3
# "running": still generating when the call returned early (``min_done``); continue it with nothing
# appended and the rest of its budget.
REASONS = {RUNNING: "running", STOP: "stop", LENGTH: "length", CACHE_FULL: "cache_full"}


def pow2_bucket(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def quarter_octave_bucket(n: int, minimum: int = 64) -> int:
    """Round up to 4 buckets per power of two (at most ~25% padding)."""
    n = max(int(n), minimum)
    p = pow2_bucket(n)
    step = max(p // 8, 1) if p > minimum else p
    return -(-n // step) * step


def bucket(n: int, buckets: Sequence[int] | None, minimum: int) -> int:
    """``n`` rounded up to the next configured bucket (powers of two, at least ``minimum``, if none)."""
    if buckets is None:
        return pow2_bucket(n, minimum)
    for b in sorted(buckets):
        if b >= n:
            return b
    return n  # larger than every configured bucket: its own shape


@dataclasses.dataclass(frozen=True)
class PrevRows:
    """What ``plan_batch`` needs of the previous ``SamplerState``: per-row host bookkeeping, and
    ``rows[i]``, the previous row that call row ``i`` continues (-1 = a fresh prompt)."""

    ends: np.ndarray
    pending: np.ndarray
    keys: np.ndarray
    draws: np.ndarray
    rows: np.ndarray


@dataclasses.dataclass(frozen=True)
class PrefillGroup:
    """Part of a chunk run on a sub-batch: entry ``i`` is batch row ``rows[i]``, writing ``take[i]``
    tokens at ``end[i]``, padded to ``length`` columns. Entries past ``n_real`` are padding: distinct
    rows of the batch that write nothing, placed at the end they have after the chunk (what a program
    writes past a row's end is never read, and a later write overwrites it)."""

    rows: np.ndarray
    n_real: int
    take: np.ndarray
    length: int
    end: np.ndarray


@dataclasses.dataclass(frozen=True)
class PrefillChunk:
    """One prefill call: row ``b`` writes ``take[b]`` tokens (from ``offset`` of its input) at
    ``end[b]``, padded to ``length`` columns. With ``groups`` the chunk runs instead as one call per
    group, each on the rows it names (``split_rows``)."""

    offset: int
    take: np.ndarray
    length: int
    end: np.ndarray
    groups: tuple[PrefillGroup, ...] | None = None

    @property
    def slots(self) -> int:
        """Token slots the chunk's calls compute (rows x columns, padding included)."""
        if self.groups is None:
            return int(self.take.shape[0]) * self.length
        return sum(int(g.rows.shape[0]) * g.length for g in self.groups)

    def last_for(self, lens: np.ndarray) -> np.ndarray:
        """Rows whose last input token is in this chunk (their next-token logits come from it)."""
        return (self.take > 0) & (self.offset + self.take >= lens)


@dataclasses.dataclass
class BatchPlan:
    """Everything one sampler call decides before touching the device (rows padded to ``batch``).

    ``src[b]``: previous-state row that slot ``b`` continues, -1 for a fresh prompt or padding.
    ``inputs[i]``: the tokens row ``i`` writes (a kept row's pending token first). ``lens``: how many
    it writes (0 if they do not fit); ``full_now``: rows refused for lack of room. ``n_max``: tokens
    a row may generate; ``cap_reason``: its finish reason when it reaches ``n_max``.
    """

    n: int
    batch: int
    capacity: int
    src: np.ndarray
    keys: np.ndarray
    draws: np.ndarray
    end0: np.ndarray
    pending0: np.ndarray
    inputs: list[np.ndarray]
    lens: np.ndarray
    full_now: np.ndarray
    end_after: np.ndarray
    max_new: np.ndarray
    n_max: np.ndarray
    cap_reason: np.ndarray
    prefill: list[PrefillChunk]
    window: int
    budget: int
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    stop_ids: np.ndarray

    @property
    def gather_rows(self) -> np.ndarray:
        """``src`` with fresh and padding slots pointing at row 0: they hold nothing (end 0), so
        which row they copy is never read."""
        return np.maximum(self.src, 0).astype(np.int32)

    def group_tokens(self, chunk: PrefillChunk, group: PrefillGroup) -> np.ndarray:
        """int32 ``[len(group.rows), group.length]`` right-padded tokens of one sub-batch call."""
        tok = np.zeros((group.rows.shape[0], group.length), np.int32)
        for i in range(group.n_real):
            t = int(group.take[i])
            r = int(group.rows[i])
            tok[i, :t] = self.inputs[r][chunk.offset : chunk.offset + t]
        return tok

    def chunk_tokens(self, chunk: PrefillChunk) -> np.ndarray:
        """int32 ``[batch, chunk.length]`` right-padded tokens of one prefill call."""
        tok = np.zeros((self.batch, chunk.length), np.int32)
        for i in range(self.n):
            t = int(chunk.take[i])
            if t > 0:
                tok[i, :t] = self.inputs[i][chunk.offset : chunk.offset + t]
        return tok

    def next_state(
        self, tokens: np.ndarray, n_gen: np.ndarray, running: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ends, pending, draws) of the first ``n`` rows after decoding ``n_gen`` tokens each.

        The last generated token of a finished row is pending (not in the cache yet); a row still
        ``running`` (bool ``[n]``: the call returned early) fed it, so it has none. A row that
        generated nothing keeps what it had: a refused kept row keeps its old pending token (nothing
        was written); a fresh row has none.
        """
        n = self.n
        n_gen = np.asarray(n_gen[:n], np.int64)
        running = np.zeros((n,), bool) if running is None else np.asarray(running[:n], bool) & (n_gen > 0)
        pending = self.pending0[:n].copy()
        ends = self.end_after[:n].copy()
        written = ~self.full_now[:n]
        pending[written] = -1  # its old pending token went into the cache with the chunk
        got = (n_gen > 0) & ~running
        pending[got] = np.asarray(tokens)[np.arange(n)[got], n_gen[got] - 1]
        ends[got] += n_gen[got] - 1
        ends[running] += n_gen[running]
        return ends, pending, (self.draws[:n] + n_gen).astype(np.int32)


# A chunk is split only when its groups compute at most this share of the full batch's slots: each
# group is one more program call, with a gather and a scatter of its rows' cache.
SPLIT_AT_MOST = 0.6
# Smallest sub-batch: fewer distinct shapes to compile.
SUB_BATCH_MIN = 8


def split_rows(
    take: np.ndarray,
    end: np.ndarray,
    *,
    length: int,
    headroom: int,
    length_buckets: Sequence[int] | None,
    min_rows: int = SUB_BATCH_MIN,
) -> tuple[PrefillGroup, ...] | None:
    """The chunk's writing rows in at most two sub-batches by length, or None when the full batch
    (``len(take)`` rows x ``length`` columns) costs little more.

    Why: in a rolling batch most rows write little (a resumed row its pending token and a short
    suffix; a row still generating nothing) while a few joining rows write whole prompts; one call
    pads every row to the longest prompt.
    Sub-batches are powers of two of at least ``min_rows`` rows (not the sampler's batch buckets,
    which may start at the full batch) and lengths use its length buckets, so they reuse a few
    compiled shapes."""
    batch = int(take.shape[0])
    active = np.flatnonzero(take > 0)
    if active.size == 0:
        return None
    order = active[np.argsort(take[active], kind="stable")]
    # parts are runs of ``order`` (ascending take): a part's longest row is its last
    t_of = lambda rows: min(bucket(int(take[rows[-1]]), length_buckets, 16), headroom)
    b_of = lambda m: min(pow2_bucket(m, min_rows), batch)
    best, best_cost = None, batch * length
    for k in range(order.size):  # order[:k] short rows, order[k:] long rows (k = 0: one sub-batch)
        parts = [p for p in (order[:k], order[k:]) if p.size]
        cost = sum(b_of(p.size) * t_of(p) for p in parts)
        if cost < best_cost:
            best, best_cost = parts, cost
    if best is None or best_cost > SPLIT_AT_MOST * batch * length:
        return None
    after = end + take
    groups = []
    for part in best:
        b = b_of(part.size)
        members = set(part.tolist())
        spare = [r for r in np.concatenate([np.flatnonzero(take == 0), order]) if r not in members]
        pad = np.asarray(spare[: b - part.size], np.int64)
        rows = np.concatenate([part, pad]).astype(np.int32)
        groups.append(
            PrefillGroup(
                rows=rows,
                n_real=int(part.size),
                take=np.concatenate([take[part], np.zeros(pad.size, take.dtype)]),
                length=t_of(part),
                end=np.concatenate([end[part], after[pad]]),
            )
        )
    return tuple(groups)


_GOLDEN = 0x9E3779B9


def _row_key(seed: int, i: int) -> tuple[int, int]:
    return seed % 2**32, (i + _GOLDEN * (seed >> 32)) % 2**32


def seed_at_row(seed: int, stream: int, row: int) -> int:
    """The seed that gives a fresh row at position ``row`` of a call the key that row ``stream`` of a call with
    ``seed`` gets: a request's draws then do not depend on where a server batched it (``envace_jax.serve``)."""
    hi = ((stream - row) * pow(_GOLDEN, -1, 2**32) + (seed >> 32)) % 2**32
    return seed % 2**32 + (hi << 32)


def plan_batch(
    inputs: Sequence[np.ndarray],
    ps: Sequence["SamplingParams"],
    seeds: Sequence[int],
    capacity: int,
    *,
    batch: int,
    max_chunk: int,
    prev: PrevRows | None = None,
    length_buckets: Sequence[int] | None = None,
    window_buckets: Sequence[int] | None = None,
    split_prefill: bool = False,
    split_min_rows: int = SUB_BATCH_MIN,
) -> BatchPlan:
    """Plans one sampler call of ``len(inputs)`` rows padded to ``batch`` (see ``BatchPlan``).

    ``inputs[i]``: int32 tokens row ``i`` appends (the whole prompt for a fresh row); ``seeds[i]``:
    its seed (used by fresh rows only; kept rows continue their stream). The cache may hold at most
    ``capacity`` tokens per row; chunks are at most ``max_chunk`` long (and the window never exceeds
    ``capacity + min(max_chunk, capacity)``, the sampler's headroom rule). ``split_prefill``: a chunk
    whose rows write very different lengths runs as sub-batches (``split_rows``).
    """
    n = len(inputs)
    if not (len(ps) == len(seeds) == n) or n > batch:
        raise ValueError(f"plan_batch: {n} inputs, {len(ps)} params, {len(seeds)} seeds, batch {batch}")
    headroom = min(max_chunk, max(capacity, 1))
    phys = capacity + headroom

    # Per-row starting point: fresh rows start empty; kept rows carry their cache and pending token.
    keys = np.zeros((batch, 2), np.uint32)
    draws = np.zeros((batch,), np.int32)
    end0 = np.zeros((batch,), np.int64)
    pending0 = np.full((batch,), -1, np.int64)
    src = np.full((batch,), -1, np.int32)
    rows_in = []
    for i in range(n):
        chunk = np.asarray(inputs[i], np.int32)
        r = -1 if prev is None else int(prev.rows[i])
        if r >= 0:
            src[i] = r
            keys[i], draws[i], end0[i], pending0[i] = prev.keys[r], prev.draws[r], prev.ends[r], prev.pending[r]
            if pending0[i] >= 0:
                chunk = np.concatenate([[pending0[i]], chunk]).astype(np.int32)
        else:
            keys[i] = _row_key(int(seeds[i]), i)
        rows_in.append(chunk)

    lens = np.zeros((batch,), np.int64)
    lens[:n] = [len(c) for c in rows_in]
    fits = end0 + lens <= capacity
    full_now = np.zeros((batch,), bool)
    full_now[:n] = ~fits[:n]
    lens = np.where(fits, lens, 0)
    end_after = end0 + lens

    max_new = np.zeros((batch,), np.int64)
    max_new[:n] = [p.max_new_tokens for p in ps]
    room = np.maximum(capacity - end_after, 0)
    n_max = np.where(full_now, 0, np.minimum(max_new, room))
    cap_reason = np.where(full_now | (room < max_new), CACHE_FULL, LENGTH)

    # Prefill plan: chunks of at most max_chunk tokens; every row is written at its current end
    # in every chunk (rows with nothing left write padding past their end), so the cache window
    # must cover end + chunk length for all rows in all chunks, and every decode write.
    prefill = []
    off, end_cur = 0, end0.copy()
    while lens.max() > 0:  # nothing to write (every row carries its logits, or sits out): no prefill
        take = np.clip(lens - off, 0, max_chunk)
        T = min(bucket(max(int(take.max()), 1), length_buckets, 16), headroom)
        groups = (
            split_rows(
                take, end_cur, length=T, headroom=headroom, length_buckets=length_buckets, min_rows=split_min_rows
            )
            if split_prefill
            else None
        )
        prefill.append(PrefillChunk(off, take, T, end_cur, groups))
        end_cur = end_cur + take
        off += max_chunk
        if off >= lens.max():
            break
    need = max(
        max((int((c.end + c.length).max()) for c in prefill), default=0),
        max((int((g.end + g.length).max()) for c in prefill for g in c.groups or ()), default=0),
        int((end_after + np.maximum(n_max, 1)).max()),
    )
    window = min(phys, quarter_octave_bucket(need) if window_buckets is None else bucket(need, window_buckets, 1))

    stop_w = max(4, pow2_bucket(max((len(p.stop_token_ids) for p in ps), default=1)))
    stop_ids = np.full((batch, stop_w), -1, np.int32)
    temperature = np.zeros((batch,), np.float32)
    top_p = np.ones((batch,), np.float32)
    top_k = np.zeros((batch,), np.int32)
    for i, p in enumerate(ps):
        stop_ids[i, : len(p.stop_token_ids)] = p.stop_token_ids
        temperature[i], top_p[i], top_k[i] = p.temperature, p.top_p, p.top_k
    # Bucketed on the requested budget (capped by the capacity) rather than on n_max, so that
    # rows ending early for lack of room do not change the program.
    budget = pow2_bucket(max(min(int(max_new.max()), capacity), int(n_max.max()), 1), 8)
    return BatchPlan(
        n=n,
        batch=batch,
        capacity=capacity,
        src=src,
        keys=keys,
        draws=draws,
        end0=end0,
        pending0=pending0,
        inputs=rows_in,
        lens=lens,
        full_now=full_now,
        end_after=end_after,
        max_new=max_new,
        n_max=n_max,
        cap_reason=cap_reason,
        prefill=prefill,
        window=window,
        budget=budget,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop_ids=stop_ids,
    )
