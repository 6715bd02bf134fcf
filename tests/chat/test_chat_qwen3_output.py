"""What real Qwen3 writes, read the same way by training (every rollout mode), evaluation and test-time
rehearsal: one parser (``chat.parse_tool_calls`` via ``chat.make_assistant_message``) behind all of them.

The texts are the shapes Qwen3 emits after its generation prompt: with thinking off the prompt already ends in
``<think>\\n\\n</think>\\n\\n`` and the turn starts with ``<tool_call>`` itself; with thinking on the turn
starts with its ``<think>`` block and a blank line precedes the first call. The expected messages are written
by hand: content is the text before the first call without the one newline that Qwen3's template puts
between content and call.
"""

from __future__ import annotations

import json

import pytest

from envace_jax.chat import make_assistant_message, parse_tool_calls, split_assistant_text
from envace_jax.envs.base import ToolEnvironment, ToolResult
from envace_jax.eval import rehearsal as R
from envace_jax.eval.harness import parse_turn
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rollout import MODES, RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.types import ACT
from tests.helpers_rollout import ScriptedClient, codec, result_text

A1 = {"name": "get_balance", "arguments": {"account": "A1"}}
B2 = {"name": "get_balance", "arguments": {"account": "B2"}}
CJK = {"name": "get_balance", "arguments": {"account": "张三-7 🏦"}}


def block(call: dict) -> str:
    """A call as Qwen3's template writes it (and Qwen3 therefore samples it)."""
    return "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"


THINK = "<think>\nI need the balances.\n</think>\n\n"
# (id, sampled text, content, calls)
QWEN3_TURNS = [
    ("off_one_call", block(A1), "", [A1]),
    ("off_two_calls", block(A1) + "\n" + block(B2), "", [A1, B2]),
    ("off_cjk_emoji_arguments", block(CJK), "", [CJK]),
    ("off_content_then_call", "Let me check.\n" + block(A1), "Let me check.", [A1]),
    ("content_blank_line_then_call", "Let me check.\n\n" + block(A1), "Let me check.\n", [A1]),
    ("on_one_call", THINK + block(A1), THINK[:-1], [A1]),
    ("on_two_calls", THINK + block(A1) + "\n" + block(B2), THINK[:-1], [A1, B2]),
    ("on_empty_think_call", "<think>\n\n</think>\n\n" + block(A1), "<think>\n\n</think>\n", [A1]),
    ("compact_block", '<tool_call>{"name": "get_balance", "arguments": {"account": "A1"}}</tool_call>', "", [A1]),
    (
        "spaced_block",
        '<tool_call>\n  {"name": "get_balance", "arguments": {"account": "A1"}}  \n\n</tool_call>\n',
        "",
        [A1],
    ),
    ("on_final_answer", THINK + "A1 holds 5.", THINK + "A1 holds 5.", []),
    ("off_final_answer", "A1 holds 5.", "A1 holds 5.", []),
]
IDS = [t[0] for t in QWEN3_TURNS]


def expected_message(content: str, calls: list[dict], prefix: str) -> dict:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [
            {"id": f"{prefix}_{i}", "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)
        ]
    return msg


@pytest.mark.parametrize("case_id,text,content,calls", QWEN3_TURNS, ids=IDS)
def test_parser_reads_real_qwen3_turns(case_id, text, content, calls):
    assert parse_tool_calls(text) == (calls, None)
    assert split_assistant_text(text) == content
    assert make_assistant_message(text, call_id_prefix="c") == (expected_message(content, calls, "c"), None)


@pytest.mark.parametrize("case_id,text,content,calls", QWEN3_TURNS, ids=IDS)
def test_evaluation_reads_a_turn_as_training_does(case_id, text, content, calls):
    msg, got_calls, error = parse_turn(text)
    assert error is None
    assert got_calls == [(c["name"], c["arguments"]) for c in calls]
    assert msg["content"] == content and len(msg.get("tool_calls") or []) == len(calls)


# ----------------------------------------------------------------------------- training: every rollout mode

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_balance",
            "description": "Balance of an account.",
            "parameters": {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]},
        },
    }
]
FINAL = "<think>\ndone\n</think>\n\nHere you go."
RS = RoleSampling(temperature=1.0, max_new_tokens=256)


def bank_record(uid: str = "r") -> dict:
    user = {"role": "user", "content": "Balances of A1 and B2?"}
    item = {
        "question": "q",
        "focus_on": "assistant.tool_calls",
        "pass_condition": "p",
        "failure_examples": [],
        "evidence": [],
        "weight": 1.0,
        "required_for_next_turn": False,
        "rule": {"type": "tool_called", "name": "get_balance", "arguments": {"account": "A1"}},
    }
    return {
        "uid": uid,
        "data_source": "test",
        "messages": [{"role": "system", "content": "Bank."}, user],
        "tools": TOOLS,
        "reference_messages": [user, {"role": "assistant", "content": "fine"}],
        "checklist": [[[item]]],
    }


class Bank(ToolEnvironment):
    def __init__(self, record=None):
        self.calls = []

    def reset(self, task):
        pass

    def execute(self, name, arguments):
        self.calls.append((name, dict(arguments)))
        return ToolResult(json.dumps({"balance": 5}))

    @property
    def tool_schemas(self):
        return TOOLS


def play(text: str, mode: str, syntax: str = "qwen3"):
    c = codec()
    rehearsals = [result_text('{"balance": 5}')] * 2
    client = ScriptedClient(c, acts={0: [text, FINAL]}, rehearsals={0: rehearsals})
    cfg = RolloutConfig(mode=mode, max_model_len=8192, act=RS, rehearse=RS, tool_call_syntax=syntax)
    eng = RolloutEngine(cfg, c, client, ChecklistTurnJudge(RuleJudge()), make_env=Bank, simulator=client)
    (ep,) = eng.run([bank_record()])
    return ep


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case_id,text,content,calls", QWEN3_TURNS, ids=IDS)
def test_every_rollout_mode_reads_real_qwen3_turns(mode, case_id, text, content, calls):
    ep = play(text, mode)
    assert ep.generations[0].role == ACT and ep.generations[0].text == text  # the sampled text, decoded back
    assert ep.messages[2] == expected_message(content, calls, "call_r_1")
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [f"call_r_1_{i}" for i in range(len(calls))]
    assert ep.termination != "parse_error" and ep.turn_rewards == [1.0 if calls and calls[0] == A1 else 0.0]
    if mode == "real":
        assert ep.env.calls == [(c["name"], c["arguments"]) for c in calls]


# The faithful setting keeps the reference's regex (spec 2.5): "\n<tool_call>\n" is required, so a turn that
# starts with its call is a parse error, and of two such calls only the second (preceded by "\n") counts.
FAITHFUL = [
    ("off_one_call", "NO_TOOL_CALL_FOUND", None),
    ("off_two_calls", None, [B2]),
    ("compact_block", "NO_TOOL_CALL_FOUND", None),
    ("on_one_call", None, [A1]),
    ("on_two_calls", None, [A1, B2]),
    ("off_final_answer", None, []),
]


@pytest.mark.parametrize("case_id,code,calls", FAITHFUL, ids=[f[0] for f in FAITHFUL])
def test_faithful_syntax_keeps_the_reference_regex(case_id, code, calls):
    text = dict((t[0], t[1]) for t in QWEN3_TURNS)[case_id]
    got, error = parse_tool_calls(text, syntax="reference")
    if code is None:
        assert (got, error) == (calls, None)
    else:
        assert got == [] and error["error_tool_call"].startswith(code + ":")
    ep = play(text, "rehearsal", syntax="reference")
    if code is not None:
        assert ep.termination == "parse_error" and ep.messages[-1]["name"] == "error_tool_call"
    else:
        assert [c["function"]["arguments"] for c in ep.messages[2].get("tool_calls") or []] == [
            c["arguments"] for c in calls
        ]
    # The reference's content: the text before the first "\n<tool_call>\n".
    assert ep.messages[2]["content"] == text.split("\n<tool_call>\n", 1)[0]


def test_bad_syntax_is_named():
    with pytest.raises(ValueError, match="tool-call syntax 'hermes'"):
        parse_tool_calls(block(A1), syntax="hermes")
    from envace_jax.config import ConfigError

    with pytest.raises(ConfigError, match="tool_call_syntax"):
        RolloutConfig(tool_call_syntax="hermes")


# ----------------------------------------------------------------------------- test-time rehearsal


@pytest.mark.parametrize(
    "case_id,text,content,calls",
    [t for t in QWEN3_TURNS if t[0] in ("off_one_call", "off_two_calls", "on_two_calls")],
    ids=["off_one_call", "off_two_calls", "on_two_calls"],
)
def test_test_time_rehearsal_reads_real_qwen3_turns(case_id, text, content, calls):
    c = codec()
    # The imagined episode and then the committed one are both episode 0 of their engine runs.
    client = ScriptedClient(
        c, acts={0: [text, FINAL, text, FINAL]}, rehearsals={0: [result_text('{"balance": 5}')] * 2}
    )
    rollout = RolloutConfig(max_steps=20, max_model_len=8192, act=RS, rehearse=RS)
    runner = R.TestTimeRehearsal(
        R.RehearsalConfig(n=1, mode="parallel"), rollout, c, client, ChecklistTurnJudge(RuleJudge()), Bank
    )
    run = runner.run([bank_record()])
    (imagined,), (committed,) = run.rehearsals[0].imagined, run.committed
    for ep in (imagined, committed):
        start = len(bank_record()["messages"])
        assert ep.messages[start] == expected_message(content, calls, f"call_{ep.uid}_1")
    assert [(s.name, s.arguments) for s in run.rehearsals[0].traces[0].steps] == [
        (c["name"], c["arguments"]) for c in calls
    ]
    assert committed.env.calls == [(c["name"], c["arguments"]) for c in calls]
