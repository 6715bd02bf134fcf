"""Rule judge semantics, rule validation, judge-prompt serialization and verdict parsing."""

from __future__ import annotations

import json

import pytest

from envace_jax.rl.judge_prompt import (
    VERDICT_RESPONSE_FORMAT,
    MalformedVerdict,
    build_judge_prompt,
    parse_verdict_text,
    serialize_messages,
    split_think,
)
from envace_jax.rl.judges import JudgeRequest, RuleJudge, Verdict, evaluate_rule, validate_rule


def call(name, args):
    return {"id": "c0", "type": "function", "function": {"name": name, "arguments": args}}


STEP = {
    "role": "assistant",
    "content": "<think>The user wants 3 tickets.</think>Booked: Flight AF12, 3 seats.",
    "tool_calls": [
        call(
            "book",
            {
                "flight": "AF12",
                "seats": 3,
                "price": 99.5,
                "window": True,
                "names": ["Ann", "Bo"],
                "meta": {"vip": False},
            },
        ),
        call("notify", {"to": "ann@x.org"}),
    ],
}


@pytest.mark.parametrize(
    "rule, expected",
    [
        ({"type": "tool_called", "name": "book"}, True),
        ({"type": "tool_called", "name": "book", "arguments": {}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"flight": "AF12", "seats": 3}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"seats": 3.0}}, True),  # numbers ==
        ({"type": "tool_called", "name": "book", "arguments": {"price": 99.5}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"seats": "3"}}, False),  # str vs int
        ({"type": "tool_called", "name": "book", "arguments": {"flight": "af12"}}, False),  # strings exact
        ({"type": "tool_called", "name": "book", "arguments": {"window": 1}}, False),  # bool is not 1
        ({"type": "tool_called", "name": "book", "arguments": {"window": True}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"names": ["Ann", "Bo"]}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"names": ["Bo", "Ann"]}}, False),
        ({"type": "tool_called", "name": "book", "arguments": {"meta": {"vip": False}}}, True),
        ({"type": "tool_called", "name": "book", "arguments": {"gate": "B"}}, False),  # key missing
        ({"type": "tool_called", "name": "notify", "arguments": {"flight": "AF12"}}, False),  # other call's args
        ({"type": "tool_called", "name": "cancel"}, False),
        ({"type": "tool_not_called", "name": "cancel"}, True),
        ({"type": "tool_not_called", "name": "notify"}, False),
        ({"type": "reply_contains", "values": ["flight af12", "3 SEATS"]}, True),  # case-insensitive
        ({"type": "reply_contains", "values": ["3 tickets"]}, False),  # only in thinking
        (
            {
                "type": "all",
                "rules": [{"type": "tool_called", "name": "book"}, {"type": "reply_contains", "values": ["AF12"]}],
            },
            True,
        ),
        (
            {
                "type": "all",
                "rules": [{"type": "tool_called", "name": "book"}, {"type": "tool_not_called", "name": "notify"}],
            },
            False,
        ),
        (
            {
                "type": "any",
                "rules": [{"type": "tool_called", "name": "cancel"}, {"type": "reply_contains", "values": ["booked"]}],
            },
            True,
        ),
        (
            {
                "type": "any",
                "rules": [
                    {"type": "tool_called", "name": "cancel"},
                    {"any": 1, "type": "tool_called", "name": "refund"},
                ],
            },
            False,
        ),
    ],
)
def test_rule_semantics(rule, expected):
    validate_rule(rule)
    assert evaluate_rule(rule, STEP) is expected


def test_reply_without_think_block_is_all_content_and_string_arguments_are_parsed():
    step = {
        "role": "assistant",
        "content": "Total is 42 EUR",
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "pay", "arguments": json.dumps({"amount": 42})}}
        ],
    }
    assert evaluate_rule({"type": "reply_contains", "values": ["42 eur"]}, step)
    assert evaluate_rule({"type": "tool_called", "name": "pay", "arguments": {"amount": 42}}, step)
    broken = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "pay", "arguments": "{not json"}}],
    }
    assert not evaluate_rule({"type": "tool_called", "name": "pay", "arguments": {"amount": 42}}, broken)
    assert evaluate_rule({"type": "tool_called", "name": "pay"}, broken) is False
    assert not evaluate_rule({"type": "reply_contains", "values": ["42"]}, broken)


@pytest.mark.parametrize(
    "rule, msg",
    [
        ({"type": "tool_calld", "name": "x"}, "unknown rule type 'tool_calld'"),
        ({"name": "x"}, "unknown rule type None"),
        ({"type": "tool_called"}, "non-empty string 'name'"),
        ({"type": "tool_called", "name": "x", "arguments": [1]}, "'arguments' must be a dict"),
        ({"type": "reply_contains", "values": "yes"}, "non-empty list of strings"),
        ({"type": "reply_contains", "values": []}, "non-empty list of strings"),
        ({"type": "all", "rules": []}, "needs 'rules'"),
        ({"type": "any", "rules": [{"type": "bogus"}]}, r"rules\[0\]\.type: unknown rule type 'bogus'"),
        ("tool_called", "rule must be a dict"),
    ],
)
def test_bad_rules_raise_naming_the_item(rule, msg):
    with pytest.raises(ValueError, match=msg):
        validate_rule(rule, "item q7")
    req = JudgeRequest(
        item={"question": "Did it book?", "rule": rule},
        previous_messages=[],
        current_messages=[{"role": "user", "content": "go"}, STEP],
        tag="ep3/k7",
    )
    with pytest.raises(ValueError, match="ep3/k7.*Did it book"):
        RuleJudge().judge_many([req])


def test_missing_rule_policies_and_fallback():
    cur = [{"role": "user", "content": "go"}, STEP]
    no_rule = JudgeRequest(item={"question": "nice tone?"}, previous_messages=[], current_messages=cur, tag="k0")
    with_rule = JudgeRequest(
        item={"question": "booked", "rule": {"type": "tool_called", "name": "book"}},
        previous_messages=[],
        current_messages=cur,
        tag="k1",
    )
    v = RuleJudge().judge_many([no_rule, with_rule])
    assert [(x.passed, x.ok, x.api_failed) for x in v] == [(False, True, False), (True, True, False)]
    with pytest.raises(ValueError, match="k0.*no 'rule'"):
        RuleJudge(missing_rule="raise").judge_many([no_rule])
    with pytest.raises(ValueError, match="missing_rule"):
        RuleJudge(missing_rule="skip")

    class AlwaysPass(RuleJudge):
        def __init__(self):
            super().__init__()
            self.seen = []

        def judge_many(self, requests):
            self.seen += [r.tag for r in requests]
            return [Verdict(passed=True, raw="fallback") for _ in requests]

    fb = AlwaysPass()
    v = RuleJudge(fallback=fb).judge_many([no_rule, with_rule, no_rule])
    assert fb.seen == ["k0", "k0"] and [x.raw for x in v] == ["fallback", with_rule.item["rule"], "fallback"]


def test_step_is_last_assistant_with_its_tool_messages():
    tool = {"role": "tool", "name": "book", "tool_call_id": "c0", "content": "ok"}
    req = JudgeRequest(
        item={},
        previous_messages=[],
        current_messages=[
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a1"},
            {"role": "tool", "content": "t1"},
            STEP,
            tool,
        ],
    )
    assistant, tools = req.step()
    assert assistant is STEP and tools == [tool]


def test_split_think():
    assert split_think("<think> plan </think>\nHello") == ("plan", "Hello")
    assert split_think("Hello there") == ("Hello there", None)  # no think block: all thinking
    assert split_think("<think>plan</think>") == ("plan", "")
    assert split_think(None) == ("", None)


def test_serialize_messages_layout():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "<think>T</think>R", "tool_calls": [call("f", {"a": 1})]},
        {"role": "tool", "name": "f", "content": "OUT"},
        {"role": "assistant", "content": "plain"},
        {"role": "user", "content": "U2"},
        {"role": "assistant", "content": "<think>x</think>"},
    ]
    text = serialize_messages(msgs)
    expected = "\n\n".join(
        [
            "Role: system\ncontent: S",
            "# Turn: 1\nRole: user\ncontent: U1",
            "## Step: 1\nRole: assistant\ncontent.thinking: T\ncontent.user_visible_reply: R\n"
            f"tool_call: {json.dumps([call('f', {'a': 1})])}",
            "Role: tool\ncontent: OUT",
            "## Step: 2\nRole: assistant\ncontent.thinking: plain\ncontent.user_visible_reply: None\ntool_call: None",
            "# Turn: 2\nRole: user\ncontent: U2",
            "## Step: 1\nRole: assistant\ncontent.thinking: x\ncontent.user_visible_reply: None\ntool_call: None",
        ]
    )
    assert text == expected
    with pytest.raises(ValueError, match="unknown role 'robot'"):
        serialize_messages([{"role": "robot", "content": "beep"}])


def test_prompt_sections_and_content():
    item = {
        "question": "Did it book AF12?",
        "focus_on": "assistant.tool_calls",
        "pass_condition": "book called with flight AF12",
        "failure_examples": ["booked AF13"],
        "evidence": [{"snippet": "book(flight='AF12')", "turn": 0, "step": 1, "from": "assistant"}],
        "weight": 1.0,
        "required_for_next_turn": True,
    }
    prev = [{"role": "user", "content": "earlier question"}, {"role": "assistant", "content": "earlier answer"}]
    cur = [{"role": "user", "content": "book it"}, STEP]
    p = build_judge_prompt(item, prev, cur)
    order = [
        "# Role",
        "# Objective",
        "# Criteria",
        "**Question:** Did it book AF12?",
        "**Focus on:** assistant.tool_calls",
        "**Pass condition:** book called with flight AF12",
        "**Failure examples:**\n" + json.dumps(["booked AF13"], indent=2),
        "**Reference snippet:**\n" + json.dumps(["book(flight='AF12')"], indent=2),
        "# Previous Messages\n# Turn: 1\nRole: user\ncontent: earlier question",
        "# Current Messages to Evaluate\n# Turn: 2\nRole: user\ncontent: book it",
        "# Special rule of tool call",
        "# Evaluation process",
    ]
    positions = [p.index(s) for s in order]
    assert positions == sorted(positions)
    for field in VERDICT_RESPONSE_FORMAT["json_schema"]["schema"]["required"]:
        assert field in p
    assert "# Previous Messages\nNone" in build_judge_prompt(item, [], cur)


def test_parse_verdict_text():
    good = {
        "high_level_understanding_of_the_question": "q",
        "analysis_of_if_focus_on": "f",
        "analysis_of_pass_condition": "p",
        "analysis_of_failure_examples": "e",
        "answer": False,
    }
    assert parse_verdict_text(json.dumps(good)) == good
    fenced = '<think>{"answer": false} is wrong</think>\n```json\n' + json.dumps({**good, "answer": True}) + "\n```"
    assert parse_verdict_text(fenced)["answer"] is True
    for bad in [
        None,
        "",
        "yes",
        "<think>unfinished",
        '{"answer": "true"}',
        '{"verdict": true}',
        '{"answer": true',
        "[true]",
        '{"answer": 1}',
    ]:
        with pytest.raises(MalformedVerdict):
            parse_verdict_text(bad)
