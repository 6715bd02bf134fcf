"""tfds array_record builder: write -> read round trip over all splits, without TensorFlow."""

from __future__ import annotations

import json
import os
import sys

import pytest

from envace_jax.data import records as R
from envace_jax.data import tfds_builder as T
from tests.helpers_data import make_records


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("tfds")
    recs = [R.validate_record(r, i) for i, r in enumerate(make_records(20))]
    splits = {"train": recs[:12], "validation": recs[12:16], "test": recs[16:]}
    path = T.write_tfds(splits, d, name="demo_tasks")
    return d, splits, path


def test_round_trip_all_splits_identical(written):
    d, splits, path = written
    assert path == os.path.join(str(d), "demo_tasks", "1.0.0")
    assert T.split_names(d, "demo_tasks") == ["test", "train", "validation"]
    for split, recs in splits.items():
        src = T.read_split(d, "demo_tasks", split)
        assert len(src) == len(recs)
        got = {src[i]["uid"]: src[i] for i in range(len(src))}
        assert got == {r["uid"]: r for r in recs}
        # Key order survives too (dict equality ignores it): tool schemas and arguments render through
        # the chat template in the order the user gave, so a reordered record trains a different text.
        for r in recs:
            assert json.dumps(got[r["uid"]]) == json.dumps(r)
    # Never imported TensorFlow (it is not installed; tfds must not need it on this path).
    assert "tensorflow" not in sys.modules


def test_raw_source_holds_uid_and_json_bytes(written):
    d, splits, _ = written
    raw = T.read_split(d, "demo_tasks", "validation", decode=False)
    ex = raw[0]
    assert isinstance(ex["uid"], bytes) and isinstance(ex["record"], bytes)
    rec = T.decode_example(ex)
    assert rec["uid"] == ex["uid"].decode()
    assert rec in splits["validation"]


def test_records_are_shuffled_on_write(written):
    d, splits, _ = written
    src = T.read_split(d, "demo_tasks", "train")
    assert [src[i]["uid"] for i in range(len(src))] != [r["uid"] for r in splits["train"]]


def test_errors_name_the_problem(written, tmp_path):
    d, _, _ = written
    with pytest.raises(ValueError, match=r"has no split 'dev'; available: \['test', 'train', 'validation'\]"):
        T.read_split(d, "demo_tasks", "dev")
    with pytest.raises(FileNotFoundError, match="no dataset 'other'"):
        T.read_split(d, "other", "train")
    with pytest.raises(FileExistsError, match="already holds a dataset"):
        T.write_tfds({"train": make_records(1)}, d, name="demo_tasks")
    recs = make_records(3)
    recs[2]["uid"] = recs[0]["uid"]
    with pytest.raises(ValueError, match=r"split 'train' record 2 repeats uid 'task-0'"):
        T.write_tfds({"train": recs}, tmp_path, name="dups")
    with pytest.raises(ValueError, match="split 'test' has no records"):
        T.write_tfds({"train": make_records(1), "test": []}, tmp_path, name="empty")
    with pytest.raises(ValueError, match="lower_snake_case"):
        T.write_tfds({"train": make_records(1)}, tmp_path, name="Bad-Name")
