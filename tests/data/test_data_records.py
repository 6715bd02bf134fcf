"""CM2 checklist records: validation errors, JSONL/parquet round trips, reference layout, filters."""

from __future__ import annotations

import copy
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envace_jax.data import records as R
from tests.helpers_data import make_record, make_records


def _expected(rec, max_num_checklist=1):
    out = copy.deepcopy(rec)
    out["checklist"] = out["checklist"][:max_num_checklist]
    return out


def test_valid_record_truncates_checklist_to_one_by_default():
    rec = make_record(0, n_checklists=3)
    out = R.validate_record(rec, 0)
    assert len(out["checklist"]) == 1 and out["checklist"][0] == rec["checklist"][0]
    assert len(R.validate_record(rec, 0, max_num_checklist=None)["checklist"]) == 3
    assert len(R.validate_record(rec, 0, max_num_checklist=2)["checklist"]) == 2
    assert len(rec["checklist"]) == 3  # input untouched


def _broken(mutate):
    rec = make_record(7)
    mutate(rec)
    return rec


BAD_CASES = [
    ("missing messages", lambda r: r.pop("messages"), r"record 7 uid='task-7': missing field 'messages'"),
    (
        "empty messages",
        lambda r: r.__setitem__("messages", []),
        r"record 7 uid='task-7'\.messages: must be a non-empty",
    ),
    (
        "no user",
        lambda r: r.__setitem__("messages", [{"role": "system", "content": "s"}]),
        r"\.messages: contains no user",
    ),
    ("bad role", lambda r: r["messages"][1].__setitem__("role", "robot"), r"\.messages\[1\]\.role"),
    ("tool type", lambda r: r["tools"][1].__setitem__("type", "fn"), r"\.tools\[1\]\.type: must be 'function'"),
    ("tool no name", lambda r: r["tools"][0]["function"].pop("name"), r"\.tools\[0\]\.function\.name"),
    (
        "tool params",
        lambda r: r["tools"][0]["function"].__setitem__("parameters", [1]),
        r"\.tools\[0\]\.function\.parameters: must be a dict",
    ),
    (
        "tool required",
        lambda r: r["tools"][1]["function"]["parameters"].__setitem__("required", "city"),
        r"\.tools\[1\]\.function\.parameters\.required",
    ),
    (
        "duplicate tools",
        lambda r: r["tools"].append(copy.deepcopy(r["tools"][0])),
        r"\.tools: duplicate tool names \['weather'\]",
    ),
    (
        "item missing key",
        lambda r: r["checklist"][0][1][0].pop("pass_condition"),
        r"\.checklist\[0\]\[1\]\[0\]: checklist item is missing key 'pass_condition'",
    ),
    (
        "focus_on",
        lambda r: r["checklist"][0][0][1].__setitem__("focus_on", "assistant.mood"),
        r"\.checklist\[0\]\[0\]\[1\]\.focus_on: must be one of",
    ),
    (
        "weight str",
        lambda r: r["checklist"][0][0][0].__setitem__("weight", "0.6"),
        r"\.checklist\[0\]\[0\]\[0\]\.weight: must be a finite",
    ),
    (
        "weight nan",
        lambda r: r["checklist"][0][0][0].__setitem__("weight", float("nan")),
        r"\.weight: must be a finite",
    ),
    ("weight bool", lambda r: r["checklist"][0][1][0].__setitem__("weight", True), r"\[0\]\[1\]\[0\]\.weight"),
    (
        "weight sum",
        lambda r: r["checklist"][0][0][0].__setitem__("weight", 0.2),
        r"\.checklist\[0\]\[0\]: item weights sum to 0\.6000",
    ),
    (
        "required bool",
        lambda r: r["checklist"][0][1][0].__setitem__("required_for_next_turn", "yes"),
        r"\.required_for_next_turn: must be a bool",
    ),
    ("failure examples", lambda r: r["checklist"][0][0][0].__setitem__("failure_examples", "x"), r"\.failure_examples"),
    ("empty checklist", lambda r: r.__setitem__("checklist", []), r"\.checklist: must be a non-empty list"),
    ("empty turn", lambda r: r["checklist"][0].__setitem__(1, []), r"\.checklist\[0\]\[1\]: must be a non-empty list"),
    (
        "bad rule",
        lambda r: r["checklist"][0][0][0].__setitem__("rule", {"type": "tool_maybe"}),
        r"\[0\]\[0\]\[0\]\.rule\.type",
    ),
    (
        "nested rule",
        lambda r: r["checklist"][0][0][0].__setitem__(
            "rule", {"type": "all", "rules": [{"type": "reply_contains", "values": "x"}]}
        ),
        r"\.rule\.rules\[0\]\.values",
    ),
    (
        "string args",
        lambda r: r["reference_messages"][1]["tool_calls"][0]["function"].__setitem__("arguments", "{}"),
        r"\.reference_messages\[1\]\.tool_calls\[0\]\.function\.arguments: must be a parsed dict",
    ),
    ("uid", lambda r: r.__setitem__("uid", 7), r"record 7 uid=7\.uid: must be a non-empty string"),
    ("env", lambda r: r.__setitem__("env", {"state": {}}), r"\.env: must be None or a dict"),
]


@pytest.mark.parametrize("name,mutate,pattern", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_malformed_record_names_record_and_field(name, mutate, pattern):
    with pytest.raises(R.RecordError, match=pattern):
        R.validate_record(_broken(mutate), 7)


def test_weight_check_can_be_relaxed():
    rec = _broken(lambda r: r["checklist"][0][0][0].__setitem__("weight", 0.2))
    assert R.validate_record(rec, 0, weight_tol=None)["checklist"][0][0][0]["weight"] == 0.2


def test_jsonl_round_trip(tmp_path):
    recs = make_records(5)
    R.save_jsonl(recs, tmp_path / "a.jsonl")
    assert R.load_records(tmp_path / "a.jsonl", max_num_checklist=None) == recs
    assert R.load_records(tmp_path / "a.jsonl") == [_expected(r) for r in recs]


def test_parquet_round_trip(tmp_path):
    recs = make_records(5)
    R.save_parquet(recs, tmp_path / "a.parquet")
    got = R.load_records(tmp_path / "a.parquet", max_num_checklist=None)
    assert got == recs
    # Types survive exactly (int stays int, nested floats stay floats).
    assert got[3]["reference_messages"][1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Kyiv",
        "days": 4,
        "extra": {"u": [1, 2.5]},
    }


def test_bad_line_in_jsonl_names_the_line(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(make_record(0)) + "\n{not json\n")
    with pytest.raises(R.RecordError, match=r"b\.jsonl line 2: not valid JSON"):
        R.load_records(p)
    p.write_text(json.dumps(make_record(0)) + "\n" + json.dumps(_broken(lambda r: r.pop("tools"))) + "\n")
    with pytest.raises(R.RecordError, match=r"record 1 uid='task-7': missing field 'tools'"):
        R.load_records(p)


def _reference_row(rec: dict, index: int) -> dict:
    """A row laid out as the reference's verl parquet: OpenAI messages with JSON-string
    arguments, tools as a JSON string, no tool message names, checklist under interaction_kwargs."""
    ref = copy.deepcopy(rec["reference_messages"])
    for m in ref:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
        if m["role"] == "tool":
            m.pop("name")
    checklist = copy.deepcopy(rec["checklist"])
    for turns in checklist:
        for items in turns:
            for it in items:
                it.pop("rule", None)
    return {
        "data_source": rec["data_source"],
        "messages": copy.deepcopy(rec["messages"]),
        "extra_info": {
            "index": index,
            "original_index": 1000 + index,
            "tools": json.dumps(rec["tools"]),
            "messages": ref,
            "interaction_kwargs": {"checklist_list": checklist},
        },
    }


def test_reference_parquet_layout_is_converted(tmp_path):
    recs = make_records(4, n_checklists=2)
    rows = [_reference_row(r, i) for i, r in enumerate(recs)]
    # Arrow infers nested structs; rows with missing keys come back with None-filled fields.
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ref.parquet")
    got = R.load_records(tmp_path / "ref.parquet")
    assert len(got) == 4
    for i, (g, rec) in enumerate(zip(got, recs)):
        assert g["uid"] == str(1000 + i)
        assert g["messages"] == rec["messages"]
        assert g["tools"] == rec["tools"]
        assert g["reference_messages"] == rec["reference_messages"]  # arguments parsed, tool names restored
        want = copy.deepcopy(rec["checklist"][:1])
        for items in want[0]:
            for it in items:
                it.pop("rule", None)
        assert g["checklist"] == want
        assert g["env"] is None


def test_reference_prompt_key_and_missing_checklist(tmp_path):
    row = _reference_row(make_record(1), 0)
    row["prompt"] = row.pop("messages")
    p = tmp_path / "r.jsonl"
    R.save_jsonl([row], p)
    assert R.load_records(p)[0]["messages"] == make_record(1)["messages"]
    del row["extra_info"]["interaction_kwargs"]["checklist_list"]
    R.save_jsonl([row], p)
    with pytest.raises(
        R.RecordError, match=r"record 0\.extra_info\.interaction_kwargs: missing field 'checklist_list'"
    ):
        R.load_records(p)


def test_invalid_tools_raise_or_drop_like_reference(tmp_path, caplog):
    recs = make_records(3)
    recs[1]["tools"][0]["function"]["name"] = ""
    p = tmp_path / "t.jsonl"
    R.save_jsonl(recs, p)
    with pytest.raises(R.RecordError, match=r"record 1 uid='task-1'\.tools\[0\]\.function\.name"):
        R.load_records(p)
    with caplog.at_level(logging.WARNING):
        got = R.load_records(p, drop_invalid_tools=True)
    assert [g["uid"] for g in got] == ["task-0", "task-2"]
    assert "task-1" in caplog.text


def test_prompt_length_filter_keeps_at_most_limit():
    recs = make_records(6)
    lengths = {f"task-{i}": L for i, L in enumerate([10, 3500, 3501, 0, 9999, 3499])}
    kept = R.prompt_length_filter(recs, lambda r: lengths[r["uid"]], R.reference_prompt_limit(4000))
    assert [r["uid"] for r in kept] == ["task-0", "task-1", "task-3", "task-5"]
    with pytest.raises(ValueError, match=r"tokenizer_fn returned 'x' for record 0 uid='task-0'"):
        R.prompt_length_filter(recs, lambda r: "x", 10)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        R.prompt_length_filter(recs, lambda r: 1, 0)


def test_unsupported_extension(tmp_path):
    with pytest.raises(ValueError, match=r"unsupported file type .*\.csv"):
        R.load_records(tmp_path / "x.csv")
