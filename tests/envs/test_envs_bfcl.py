"""BFCL adapter against BFCL's own execution helper and checkers (bfcl-eval, offline)."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="envace_bfcl_test_"))
pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")

from envace_jax.envs import bfcl
from envace_jax.envs.base import ToolEnvironment, ToolResult


@pytest.fixture(scope="module")
def multi_turn():
    return {c: (bfcl.load_entries(c), bfcl.load_ground_truth(c)) for c in bfcl.MULTI_TURN_CATEGORIES}


def _reference_responses(entry, gt, tag):
    """Runs the GT through BFCL's execute_multi_turn_func_call (which evals the text itself)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = set(vars(multi_turn_utils))
    try:
        lc = "long_context" in bfcl.category_of(entry["id"])
        return [
            multi_turn_utils.execute_multi_turn_func_call(
                turn,
                entry["initial_config"],
                entry["involved_classes"],
                f"envace_ref_{tag}",
                entry["id"],
                long_context=lc,
            )[0]
            for turn in gt
        ]
    finally:
        for key in set(vars(multi_turn_utils)) - before:
            delattr(multi_turn_utils, key)


@pytest.mark.parametrize("category", bfcl.MULTI_TURN_CATEGORIES)
def test_ground_truth_replay_matches_bfcl_and_passes_its_checker(multi_turn, category):
    entries, gts = multi_turn[category]
    assert len(entries) == 200
    valid, calls, positional = 0, 0, 0
    for entry in entries:
        gt = gts[entry["id"]]
        reference = _reference_responses(entry, gt, category)
        env = bfcl.BfclMultiTurnEnv(entry)
        for turn, ref_turn in zip(gt, reference):
            assert len(turn) == len(ref_turn)
            for text, ref in zip(turn, ref_turn):
                name, kwargs = env.parse_call(text)
                positional += "=" not in text and not text.endswith("()")
                # Arguments go through JSON, as they do when the policy emits them.
                got = env.execute(name, json.loads(json.dumps(kwargs)))
                assert got.content == ref, (entry["id"], text)
                assert got.error == (ref.startswith("Error during execution") or '"error"' in ref[:10]), (
                    entry["id"],
                    text,
                    ref,
                )
                calls += 1
        result = bfcl.check_multi_turn(bfcl.ground_truth_trajectory(env, gt), entry, gt)
        assert result["valid"], (entry["id"], result)
        valid += 1
    assert valid == 200 and calls >= 1140
    if category == "multi_turn_base":
        assert positional > 0  # the positional-argument path was exercised


def test_checker_rejects_a_broken_trajectory(multi_turn):
    entries, gts = multi_turn["multi_turn_base"]
    entry = entries[0]
    gt = gts[entry["id"]]
    env = bfcl.BfclMultiTurnEnv(entry)
    traj = bfcl.ground_truth_trajectory(env, gt)
    assert gt[0][1].startswith("mkdir")
    dropped = [traj[0][:1] + traj[0][2:]] + traj[1:]
    res = bfcl.check_multi_turn(dropped, entry, gt)
    assert not res["valid"] and res["error_type"] == "multi_turn:instance_state_mismatch"
    res = bfcl.check_multi_turn(traj[:-1], entry, gt)
    assert not res["valid"] and res["error_type"] == "multi_turn:force_terminated"
    # Plain-text steps (no calls) are skipped, as BFCL skips undecodable steps.
    padded = [turn + [[]] for turn in traj]
    assert bfcl.check_multi_turn(padded, entry, gt)["valid"]


def test_empty_ground_truth_turn_requires_no_call(multi_turn):
    entries, gts = multi_turn["multi_turn_miss_param"]
    entry = next(e for e in entries if any(len(t) == 0 for t in gts[e["id"]]))
    gt = gts[entry["id"]]
    env = bfcl.BfclMultiTurnEnv(entry)
    traj = bfcl.ground_truth_trajectory(env, gt)
    assert bfcl.check_multi_turn(traj, entry, gt)["valid"]
    k = next(i for i, t in enumerate(gt) if not t)
    nonempty = next(t for t in gt if t)
    extra = [list(t) for t in traj]
    extra[k] = [[env.parse_call(nonempty[0])]]
    assert not bfcl.check_multi_turn(extra, entry, gt)["valid"]


@pytest.mark.parametrize(
    "name",
    [
        "__class__",
        "_load_scenario",
        "os.system",
        "__init__",
        "eval",
        "__import__('os').system",
        "cd; import os",
        "",
        "no_such_tool",
    ],
)
def test_odd_names_are_rejected_never_executed(multi_turn, name):
    entries, _ = multi_turn["multi_turn_base"]
    env = bfcl.BfclMultiTurnEnv(entries[0])
    assert isinstance(env, ToolEnvironment)
    before = json.dumps(env.state(), sort_keys=True, default=str)
    res = env.execute(name, {"folder": "document"})
    assert res.error and "Error during execution" in res.content and "not defined" in res.content
    assert json.dumps(env.state(), sort_keys=True, default=str) == before


def test_private_method_cannot_reload_state(multi_turn):
    entries, _ = multi_turn["multi_turn_base"]
    env = bfcl.BfclMultiTurnEnv(entries[0])
    assert env.execute("cd", {"folder": "document"}).content == '{"current_working_directory": "document"}'
    res = env.execute("_load_scenario", {"scenario": {}})
    assert res.error
    # State untouched by the rejected call: cd back up still works from 'document'.
    assert env.execute("pwd", {}).content == '{"current_working_directory": "/workspace/document"}'


def test_tool_errors_and_bad_arguments_become_error_responses(multi_turn):
    entries, _ = multi_turn["multi_turn_base"]
    env = bfcl.BfclMultiTurnEnv(entries[0])
    res = env.execute("cd", {"folder": "no_such_dir"})
    assert res.error and res.content == '{"error": "cd: \'no_such_dir\': No such file or directory"}'
    res = env.execute("cd", {"folder": "document", "bogus": 1})
    assert res.error and "unexpected keyword argument 'bogus'" in res.content
    assert env.execute("mkdir", {"dir_name": "temp"}) == ToolResult("None", error=False)
    res = env.execute("cd", ["document"])
    assert res.error and "must be an object" in res.content


def test_reset_is_fresh_and_accepts_task_records(multi_turn):
    entries, gts = multi_turn["multi_turn_base"]
    entry = entries[0]
    env = bfcl.BfclMultiTurnEnv(entry)
    pristine = json.dumps(env.state(), sort_keys=True, default=str)
    env.execute("cd", {"folder": "document"})
    env.execute("mkdir", {"dir_name": "temp"})
    assert json.dumps(env.state(), sort_keys=True, default=str) != pristine
    task = bfcl.entry_to_task(entry, gts[entry["id"]])
    env.reset(task)
    assert json.dumps(env.state(), sort_keys=True, default=str) == pristine
    assert task["messages"] == entry["question"][0] and task["env"]["name"] == bfcl.ENV_NAME
    with pytest.raises(ValueError, match="env name"):
        env.reset({"env": {"name": "tau2", "state": {}}})
    with pytest.raises(ValueError, match="involved_classes"):
        env.reset({"id": "multi_turn_base_x"})


def test_long_context_flag_follows_category(multi_turn):
    longc, _ = multi_turn["multi_turn_long_context"]
    padded = bfcl.BfclMultiTurnEnv(longc[0])
    plain = bfcl.BfclMultiTurnEnv(longc[0], long_context=False)
    size = lambda env: len(json.dumps(env.state(), default=str))
    assert size(padded) > 2 * size(plain)


def test_schemas_are_json_schema(multi_turn):
    entries, _ = multi_turn["multi_turn_base"]
    env = bfcl.BfclMultiTurnEnv(entries[0], include_response_schema=True)
    schemas = env.tool_schemas
    assert len(schemas) == len(entries[0]["function"])
    allowed = {"object", "string", "number", "integer", "boolean", "array", "null"}

    def types_in(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "type" and isinstance(v, str):
                    yield v
                elif k == "properties":
                    for s in v.values():
                        yield from types_in(s)
                else:
                    yield from types_in(v)
        elif isinstance(node, list):
            for x in node:
                yield from types_in(x)

    for s in schemas:
        assert s["type"] == "function" and set(s["function"]) >= {"name", "description", "parameters"}
        assert set(types_in(s["function"])) <= allowed, s["function"]["name"]
    cd = next(s for s in schemas if s["function"]["name"] == "cd")["function"]
    assert cd["parameters"]["type"] == "object" and cd["response"]["type"] == "object"
    doc = {
        "name": "f",
        "description": "d",
        "parameters": {
            "type": "dict",
            "properties": {
                "a": {"type": "float"},
                "b": {"type": "tuple", "items": {"type": "integer"}},
                "c": {"type": "any"},
                "type": {"type": "dict", "properties": {"x": {"type": "float"}}},
            },
        },
    }
    got = bfcl.function_doc_to_schema(doc)["function"]["parameters"]
    assert got == {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "b": {"type": "array", "items": {"type": "integer"}},
            "c": {"type": "string"},
            "type": {"type": "object", "properties": {"x": {"type": "number"}}},
        },
    }
    with pytest.raises(ValueError, match="parameters"):
        bfcl.function_doc_to_schema({"name": "g"})


def test_call_string_round_trip_and_errors():
    assert bfcl.parse_call_string("cd(folder='document')") == ("cd", {"folder": "document"})
    assert bfcl.parse_call_string("sort('a.pdf')", ["file_name"]) == ("sort", {"file_name": "a.pdf"})
    assert bfcl.parse_call_string("math.factorial(number=5)") == ("math.factorial", {"number": 5})
    call = ("lockDoors", {"unlock": True, "door": ["driver", "passenger"], "x": None, "f": 1.5, "d": {"k": "it's"}})
    text = bfcl.format_call(*call)
    assert bfcl.parse_call_string(text) == call
    for bad, msg in [
        ("sort('a.pdf')", "positional"),
        ("cd(folder=os.getcwd())", "non-literal"),
        ("cd(**kw)", r"\*\*kwargs"),
        ("1 + 2", "not a function call"),
        ("cd(", "not a Python call"),
        ("f()(x=1)", "not a name"),
        ("cd(folder='a', folder='b')", "given twice|not a Python call"),
    ]:
        with pytest.raises(ValueError, match=msg):
            bfcl.parse_call_string(bad)


def test_result_to_string_follows_bfcl_rule():
    class S(str):
        pass

    assert bfcl.result_to_string("x") == "x"
    assert bfcl.result_to_string({"a": 1}) == '{"a": 1}'
    assert bfcl.result_to_string({"a": {1, 2}}) == "{'a': {1, 2}}"  # json fails -> str
    assert bfcl.result_to_string(None) == "None"
    assert bfcl.result_to_string([1, "a"]) == "[1, 'a']"
    assert bfcl.result_to_string(S("y")) == "y"


def _answer_fits_schema(answer, docs):
    """Independent truth for the single-turn sweep: can any concrete call satisfy the schema?"""
    by_name = {d["name"]: d["parameters"] for d in docs}
    for ans in answer:
        ((name, params),) = ans.items()
        schema = by_name.get(name)
        if schema is None:
            return False
        props, required = set(schema.get("properties", {})), set(schema.get("required", []))
        for r in required:
            if r not in params or all(v == "" for v in params[r]):
                return False
        for k, vs in params.items():
            if k not in props and "" not in vs:
                return False
    return True


@pytest.mark.parametrize("category", bfcl.SINGLE_TURN_CATEGORIES)
def test_single_turn_ground_truth_passes_ast_checker(category):
    entries = bfcl.load_entries(category)
    gts = bfcl.load_ground_truth(category)
    outcomes = {}
    for entry in entries:
        answer = gts[entry["id"]]
        calls = bfcl.possible_answer_to_calls(answer, entry["function"])
        # Our side: JSON arguments (as the policy emits) and BFCL call text, both round-tripped.
        calls = [(n, json.loads(json.dumps(kw))) for n, kw in calls]
        assert [bfcl.parse_call_string(bfcl.format_call(n, kw)) for n, kw in calls] == calls
        valid = bfcl.check_single_turn(calls, entry, answer)["valid"]
        outcomes[entry["id"]] = valid
        assert valid == _answer_fits_schema(answer, entry["function"]), entry["id"]
    if category in (
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "live_parallel",
        "live_parallel_multiple",
    ):
        assert all(outcomes.values())
    else:
        # A handful of live answers contradict their own schema; the checker cannot pass them.
        assert sum(outcomes.values()) >= len(outcomes) - 3


def test_single_turn_checker_rejects_wrong_calls():
    entries = {e["id"]: e for e in bfcl.load_entries("simple_python")}
    gts = bfcl.load_ground_truth("simple_python")
    entry, answer = entries["simple_python_0"], gts["simple_python_0"]
    good = bfcl.possible_answer_to_calls(answer, entry["function"])
    assert bfcl.check_single_turn(good, entry, answer)["valid"]
    name, kw = good[0]
    assert not bfcl.check_single_turn([(name, {**kw, "height": kw["height"] + 1})], entry, answer)["valid"]
    assert not bfcl.check_single_turn(good * 2, entry, answer)["valid"]
    assert not bfcl.check_single_turn([], entry, answer)["valid"]
    with pytest.raises(ValueError, match="category"):
        bfcl.check_single_turn(good, {"id": "multi_turn_base_0", "function": []}, answer)
    with pytest.raises(ValueError, match="unsupported BFCL category"):
        bfcl.load_entries("web_search")
