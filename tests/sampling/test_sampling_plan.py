"""The sampler's host-side plan (``sampling.plan``), without a model: row resume, room and budget,
prefill chunking and the next state's bookkeeping, each against a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest

from envace_jax.sampling import SamplingParams
from envace_jax.sampling.plan import CACHE_FULL, LENGTH, PrevRows, plan_batch


def _prev(ends, pending, rows):
    k = len(ends)
    keys = np.stack([np.arange(k, dtype=np.uint32) + 100, np.arange(k, dtype=np.uint32) + 200], axis=1)
    return PrevRows(
        ends=np.asarray(ends, np.int64),
        pending=np.asarray(pending, np.int64),
        keys=keys,
        draws=np.asarray([7 * (r + 1) for r in range(k)], np.int32),
        rows=np.asarray(rows, np.int64),
    )


def _ids(*lengths):
    return [np.arange(3, 3 + n, dtype=np.int32) for n in lengths]


def test_fresh_row_that_does_not_fit_has_no_pending_token():
    # Regression (issue 14): a fresh prompt that does not fit used to inherit row 0's pending token.
    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    prev = _prev(ends=[10, 12], pending=[41, 42], rows=[1, -1])
    plan = plan_batch(_ids(2, 40), [p, p], [0, 0], 32, batch=2, max_chunk=16, prev=prev)
    assert plan.src.tolist() == [1, -1] and plan.full_now.tolist() == [False, True]
    ends, pending, draws = plan.next_state(np.zeros((2, 4), np.int32), np.array([0, 0]))
    assert pending.tolist() == [-1, -1]  # row 0's pending 42 went into the cache; row 1 holds nothing
    assert ends.tolist() == [12 + 1 + 2, 0] and draws.tolist() == [14, 0]


def test_kept_row_resumes_its_cache_stream_and_pending_token():
    p = SamplingParams(temperature=1.0, max_new_tokens=5, seed=9)
    prev = _prev(ends=[6, 20], pending=[50, -1], rows=[0, 1])
    plan = plan_batch(_ids(3, 3), [p, p], [9, 9], 24, batch=4, max_chunk=8, prev=prev)
    # Row 0 writes its pending token first; row 1 has none; padding rows write nothing.
    assert plan.inputs[0].tolist() == [50, 3, 4, 5] and plan.inputs[1].tolist() == [3, 4, 5]
    assert plan.lens.tolist() == [4, 3, 0, 0] and plan.end_after.tolist() == [10, 23, 0, 0]
    assert plan.keys[:2].tolist() == [[100, 200], [101, 201]] and plan.draws[:2].tolist() == [7, 14]
    # Row 1 has 24 - 23 = 1 slot left: one token, then cache_full; row 0 gets its 5.
    assert plan.n_max[:2].tolist() == [5, 1] and plan.cap_reason[:2].tolist() == [LENGTH, CACHE_FULL]
    ends, pending, draws = plan.next_state(np.array([[1, 2, 3, 4, 5], [9, 0, 0, 0, 0]]), np.array([5, 1, 0, 0]))
    assert ends.tolist() == [14, 23] and pending.tolist() == [5, 9] and draws.tolist() == [12, 15]


def test_refused_kept_row_keeps_its_state():
    p = SamplingParams(temperature=0.0, max_new_tokens=8)
    prev = _prev(ends=[30], pending=[77], rows=[0])
    plan = plan_batch(_ids(5), [p], [0], 32, batch=1, max_chunk=16, prev=prev)
    assert plan.full_now.tolist() == [True] and plan.lens.tolist() == [0] and plan.n_max.tolist() == [0]
    assert plan.cap_reason.tolist() == [CACHE_FULL]
    ends, pending, draws = plan.next_state(np.zeros((1, 8), np.int32), np.array([0]))
    assert ends.tolist() == [30] and pending.tolist() == [77] and draws.tolist() == [7]


def test_long_inputs_split_into_chunks_and_size_the_window():
    p = SamplingParams(temperature=0.0, max_new_tokens=10)
    plan = plan_batch(_ids(70, 5), [p, p], [1, 2], 128, batch=2, max_chunk=64, length_buckets=(32, 64))
    assert [c.offset for c in plan.prefill] == [0, 64]
    assert [c.take.tolist() for c in plan.prefill] == [[64, 5], [6, 0]]
    assert [c.length for c in plan.prefill] == [64, 32]
    assert [c.end.tolist() for c in plan.prefill] == [[0, 0], [64, 5]]
    assert [c.last_for(plan.lens).tolist() for c in plan.prefill] == [[False, True], [True, False]]
    tok = plan.chunk_tokens(plan.prefill[1])
    assert tok.shape == (2, 32) and tok[0, :6].tolist() == list(range(67, 73)) and not tok[0, 6:].any()
    # Need: second chunk writes up to 64 + 32 = 96 slots; decode up to 70 + 10 = 80. 96 rounds to 96
    # (four buckets per octave), below capacity + headroom = 192.
    assert plan.window == 96
    assert plan.budget == 16  # max_new 10, bucketed to a power of two >= 8


def test_fresh_rows_get_distinct_streams_and_bad_sizes_are_named():
    p = SamplingParams(temperature=1.0, max_new_tokens=4)
    plan = plan_batch(_ids(2, 2), [p, p], [5, 5], 16, batch=2, max_chunk=8)
    assert plan.keys[0].tolist() != plan.keys[1].tolist() and (plan.src == -1).all()
    with pytest.raises(ValueError, match="3 inputs"):
        plan_batch(_ids(1, 1, 1), [p] * 3, [0] * 3, 16, batch=2, max_chunk=8)


def test_split_rows_by_hand():
    from envace_jax.sampling.plan import split_rows

    # A rolling call: six resumed rows write their pending token, one joining row a 90-token
    # prompt, one row writes nothing. One call would compute 8 rows x 128 columns = 1,024 slots; two
    # sub-batches compute 8 x 16 (the one-token rows) + 1 x 128 (the prompt) = 256.
    take = np.array([1, 1, 1, 0, 1, 90, 1, 1])
    end = np.array([40, 41, 42, 43, 44, 0, 46, 47])
    groups = split_rows(take, end, length=128, headroom=512, length_buckets=None, min_rows=1)
    short, long_ = groups
    assert (short.n_real, short.length, long_.n_real, long_.length) == (6, 16, 1, 128)
    assert short.rows[:6].tolist() == [0, 1, 2, 4, 6, 7] and long_.rows.tolist() == [5]
    assert short.take.tolist() == [1] * 6 + [0, 0] and short.end[:6].tolist() == [40, 41, 42, 44, 46, 47]
    # Padding entries: distinct rows outside the group (first the idle row 3, then row 5), at the end
    # they have after the chunk, so what they write lands past anything they hold.
    assert short.rows[6:].tolist() == [3, 5] and short.end[6:].tolist() == [43, 90]
    assert len(set(short.rows.tolist())) == 8
    # Rows of similar length: one call costs little more, so the chunk is not split.
    assert (
        split_rows(
            np.array([60, 70, 80, 90]), np.zeros(4, np.int64), length=128, headroom=512, length_buckets=None, min_rows=1
        )
        is None
    )
    # Sub-batches of at least 8 rows (the default): a 32-row call with 28 one-token rows and 4 prompts
    take = np.array([1] * 28 + [100] * 4)
    short, long_ = split_rows(take, np.arange(32) + 200, length=128, headroom=512, length_buckets=None)
    assert (len(short.rows), short.length, len(long_.rows), long_.length) == (32, 16, 8, 128)


def test_plan_splits_only_when_asked_and_sizes_the_window_for_the_padding_writes():
    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    # twelve resumed rows write their pending token, one fresh row a 100-token prompt, in a 32-row call
    ins = [np.zeros(0, np.int32)] * 12 + _ids(100)
    prev = _prev(
        ends=[30 + r for r in range(12)] + [0], pending=[5 + r for r in range(12)] + [-1], rows=list(range(12)) + [-1]
    )
    kw = dict(batch=32, max_chunk=512, prev=prev)
    whole = plan_batch(ins, [p] * 13, [0] * 13, 256, **kw)
    split = plan_batch(ins, [p] * 13, [0] * 13, 256, **kw, split_prefill=True)
    assert whole.prefill[0].groups is None and whole.prefill[0].slots == 32 * 128
    g = split.prefill[0].groups
    # Sub-batches of at least 8 rows. The cheapest: 8 x 16 for five pending tokens, and 8 x 128 for the
    # prompt with the other seven pending tokens in its padding rows (12 + 1 rows at 16 x 16 + 8 x 128,
    # or all 13 at 16 x 128, cost more).
    assert [x.n_real for x in g] == [5, 8] and split.prefill[0].slots == 8 * 16 + 8 * 128
    assert [x.length for x in g] == [16, 128] and 12 in g[1].rows[: g[1].n_real].tolist()
    assert sorted(np.concatenate([x.rows[: x.n_real] for x in g]).tolist()) == list(range(13))
    assert split.window >= max(int((x.end + x.length).max()) for x in g) and split.window == whole.window
    tok = {int(r): split.group_tokens(split.prefill[0], x)[i] for x in g for i, r in enumerate(x.rows[: x.n_real])}
    assert tok[12][:100].tolist() == ins[12].tolist()
    assert [int(tok[r][0]) for r in range(12)] == [5 + r for r in range(12)]  # the pending tokens
