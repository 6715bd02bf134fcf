"""Grain prompt pipeline: seeded shuffle, disjoint per-process shards, epochs, exact resume."""

from __future__ import annotations

import json

import pytest

from envace_jax.data import tfds_builder as T
from envace_jax.data.pipeline import PipelineConfig, PromptIterator, epoch_order, take
from tests.helpers_data import make_records


@pytest.fixture(scope="module")
def raw_source(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipe")
    T.write_tfds({"train": make_records(21)}, d, name="pipe_tasks")
    return T.read_split(d, "pipe_tasks", "train", decode=False)


def uids(batches):
    return [[r["uid"] for r in b] for b in batches]


def cfg(**kw):
    base = dict(batch_size=3, seed=0, shard_index=0, shard_count=1)
    base.update(kw)
    return PipelineConfig(**base)


def test_same_seed_same_batches_other_seed_differs(raw_source):
    a = uids(PromptIterator(raw_source, cfg(seed=5)))
    b = uids(PromptIterator(raw_source, cfg(seed=5)))
    c = uids(PromptIterator(raw_source, cfg(seed=6)))
    assert a == b and a != c
    assert len(a) == 7 and all(len(x) == 3 for x in a)
    flat = [u for batch in a for u in batch]
    assert sorted(flat) == sorted(f"task-{i}" for i in range(21))  # one epoch = a permutation


def test_order_follows_epoch_permutation_and_reshuffles_each_epoch(raw_source):
    plain = [raw_source[i]["uid"].decode() for i in range(21)]
    got = [u for b in uids(PromptIterator(raw_source, cfg(seed=2, num_epochs=2, batch_size=7))) for u in b]
    e0, e1 = epoch_order(21, 2, 0), epoch_order(21, 2, 1)
    assert got == [plain[i] for i in e0] + [plain[i] for i in e1]
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(21))
    unshuffled = [u for b in uids(PromptIterator(raw_source, cfg(shuffle=False, batch_size=7))) for u in b]
    assert unshuffled == plain


@pytest.mark.parametrize("count", [2, 3, 4])
def test_shards_disjoint_equal_and_cover_the_epoch(raw_source, count):
    per_epoch = []
    for epoch_span in (1, 2):
        shards = []
        for s in range(count):
            it = PromptIterator(
                raw_source, cfg(seed=1, batch_size=1, num_epochs=epoch_span, shard_index=s, shard_count=count)
            )
            shards.append([b[0]["uid"] for b in it])
        per_epoch.append(shards)
    shards = per_epoch[0]
    n_per = 21 // count
    assert all(len(s) == n_per for s in shards)  # lockstep: same length on every process
    union = [u for s in shards for u in s]
    assert len(set(union)) == len(union) == n_per * count  # disjoint
    # What the shards miss is exactly the epoch's tail beyond a multiple of count.
    order = epoch_order(21, 1, 0)
    plain = [raw_source[i]["uid"].decode() for i in range(21)]
    assert set(union) == {plain[i] for i in order[: n_per * count]}
    # Second epoch: each shard continues with its slice of the next permutation.
    two = per_epoch[1]
    assert all(two[s][:n_per] == shards[s] for s in range(count))
    assert len({u for s in two for u in s[n_per:]}) == n_per * count


@pytest.mark.parametrize("epochs,skip", [(2, 2), (2, 4), (None, 9)])
def test_state_restore_reproduces_next_batches(raw_source, epochs, skip):
    c = cfg(seed=3, batch_size=4, num_epochs=epochs, shard_index=1, shard_count=2)
    it = PromptIterator(raw_source, c)
    take(it, skip)
    saved = json.loads(it.state_json())  # must survive a JSON round trip (it is stored as JSON)
    want = uids(take(it, 4))
    assert len(want) == (min(4, 10 * 2 // 4 - skip) if epochs else 4)
    fresh = PromptIterator(raw_source, c)
    fresh.set_state(saved)
    assert fresh.batches_seen == skip
    assert uids(take(fresh, 4)) == want
    # And a state restored into an iterator that already advanced also rewinds exactly.
    ahead = PromptIterator(raw_source, c)
    take(ahead, skip + 2)
    ahead.set_state(saved)
    assert uids(take(ahead, 4)) == want


def test_state_from_another_stream_is_refused(raw_source):
    it = PromptIterator(raw_source, cfg(seed=3))
    next(it)
    other = PromptIterator(raw_source, cfg(seed=4))
    with pytest.raises(ValueError, match=r"different stream; \(saved, now\) = \{'seed': \(3, 4\)\}"):
        other.set_state(it.get_state())
    with pytest.raises(ValueError, match="not a pipeline state"):
        other.set_state({"next_index": 3})


def test_last_short_batch_kept_or_dropped(raw_source):
    kept = uids(PromptIterator(raw_source, cfg(batch_size=4, drop_remainder=False)))
    dropped = uids(PromptIterator(raw_source, cfg(batch_size=4)))
    assert [len(b) for b in kept] == [4] * 5 + [1] and kept[:5] == dropped


def test_default_shard_is_this_process_and_plain_lists_work():
    it = PromptIterator(list(range(10)), PipelineConfig(batch_size=5, seed=0), decode=None)
    assert it.get_state()["stream"]["shard_index"] == 0 and it.get_state()["stream"]["shard_count"] == 1
    assert sorted(x for b in it for x in b) == list(range(10))


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="batch_size"):
        PipelineConfig(batch_size=0)
    with pytest.raises(ValueError, match="num_epochs"):
        PipelineConfig(batch_size=1, num_epochs=0)
    with pytest.raises(ValueError, match=r"shard_index=2 is outside \[0, shard_count=2\)"):
        PipelineConfig(batch_size=1, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="fewer than shard_count=4"):
        PromptIterator([1, 2, 3], PipelineConfig(batch_size=1, shard_index=0, shard_count=4), decode=None)
