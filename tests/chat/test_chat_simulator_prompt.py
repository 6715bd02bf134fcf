"""The REHEARSE prompt: sections, few-shot on/off, history serialisation, rendering to ids."""

from __future__ import annotations

import json

import pytest

from tests.helpers_chat import SYSTEM, TOOLS, demo_tokenizer

from envace_jax.chat import (
    ChatRenderer,
    Qwen3ChatCodec,
    SimulatorPromptOptions,
    build_simulator_messages,
    logged_tool_calls,
    serialize_history,
)

CALLER_TEXT = (
    '<think>\nCheck A1.\n</think>\n\n<tool_call>\n{"name": "get_balance", "arguments": {"account": "A1"}}\n</tool_call>'
)

REFERENCE = [
    {"role": "user", "content": "Balance of A1?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "r0", "type": "function", "function": {"name": "get_balance", "arguments": {"account": "A1"}}}
        ],
    },
    {"role": "tool", "name": "get_balance", "tool_call_id": "r0", "content": '{"balance": 120}'},
    {"role": "assistant", "content": "A1 holds 120."},
    {"role": "user", "content": "Move 20 to B2."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "r1",
                "type": "function",
                "function": {"name": "transfer", "arguments": {"source": "A1", "target": "B2", "amount": 20}},
            },
            {"id": "r2", "type": "function", "function": {"name": "get_balance", "arguments": {"account": "B2"}}},
        ],
    },
    # Answered out of order: matching must go by tool_call_id.
    {"role": "tool", "name": "get_balance", "tool_call_id": "r2", "content": '{"balance": 95}'},
    {"role": "tool", "name": "transfer", "tool_call_id": "r1", "content": '{"ok": true}'},
    {"role": "assistant", "content": "Done."},
]

HISTORY = [
    SYSTEM,
    {"role": "user", "content": "Balance of A1?"},
    {
        "role": "assistant",
        "content": "<think>\nfirst\n</think>\n",
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "get_balance", "arguments": {"account": "Z9"}}}
        ],
    },
    {"role": "tool", "name": "get_balance", "tool_call_id": "c0", "content": '{"error": "no such account"}'},
]


def build(options=SimulatorPromptOptions(), **kw):
    args = dict(
        tools=TOOLS,
        history=HISTORY,
        caller_text=CALLER_TEXT,
        call_name="get_balance",
        call_arguments={"account": "A1"},
        reference_messages=REFERENCE,
        options=options,
    )
    args.update(kw)
    return build_simulator_messages(**args)


def test_logged_tool_calls_pairs_by_id_across_all_turns():
    assert logged_tool_calls(REFERENCE) == [
        ("get_balance", {"account": "A1"}, '{"balance": 120}'),
        ("get_balance", {"account": "B2"}, '{"balance": 95}'),
        ("transfer", {"source": "A1", "target": "B2", "amount": 20}, '{"ok": true}'),
    ]
    # Without ids, responses answer the preceding calls in order.
    no_ids = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "a", "arguments": {}}},
                {"function": {"name": "b", "arguments": {"x": 1}}},
            ],
        },
        {"role": "tool", "name": "a", "content": "A"},
        {"role": "tool", "name": "b", "content": "B"},
    ]
    assert logged_tool_calls(no_ids) == [("a", {}, "A"), ("b", {"x": 1}, "B")]


def test_serialize_history_layout():
    assert serialize_history(HISTORY) == (
        "User: Balance of A1?\n"
        "Assistant: <think>\nfirst\n</think>\n\n<tool_call>\n"
        '{"name": "get_balance", "arguments": {"account": "Z9"}}\n</tool_call>\n'
        'Tool[get_balance]: {"error": "no such account"}'
    )


def test_full_prompt_sections_in_order():
    system, user = build()
    assert system["role"] == "system" and user["role"] == "user"
    for code in ("INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS", "<execution_result>"):
        assert code in system["content"]
    sections = user["content"].split("\n\n")
    heads = [
        "Candidate tools",
        "Logged tool calls",
        "Conversation so far",
        "The assistant's latest raw message",
        "Call to answer",
    ]
    positions = [user["content"].index(h) for h in heads]
    assert positions == sorted(positions)
    assert user["content"].endswith("\n\n/think")
    # Candidate tools are the schemas as JSON with indent=0.
    tools_json = user["content"].split(":\n", 1)[1].split("\n\nLogged tool calls")[0]
    assert json.loads(tools_json) == TOOLS and tools_json == json.dumps(TOOLS, ensure_ascii=False, indent=0)
    # Few-shot leaks the future turn's calls (documented): the transfer of turn 2 is already visible.
    assert (
        'Tool name:\ntransfer\nTool arguments:\n{"source": "A1", "target": "B2", "amount": 20}\n'
        'Tool execution result:\n{"ok": true}' in user["content"]
    )
    assert "Assistant: <think>\nfirst" in user["content"]
    assert "You are a careful bank assistant." not in user["content"]  # system skipped in the history
    assert f"The assistant's latest raw message:\n{CALLER_TEXT}" in user["content"]
    assert (
        "- name: get_balance\n- input schema (JSON Schema):\n" + json.dumps(TOOLS[0]["function"]["parameters"])
        in user["content"]
    )
    assert user["content"].rstrip("/think").rstrip().endswith('{"account": "A1"}')
    assert len(sections) > 5


def test_few_shot_off_and_unavailable():
    _, user = build(SimulatorPromptOptions(few_shot=False))
    assert "Logged tool calls" not in user["content"] and "Tool name:" not in user["content"]
    _, user = build(reference_messages=[])
    assert "Logged tool calls and their real results: <unavailable>" in user["content"]
    _, user = build(call_name="delete_everything")
    assert "- name: delete_everything\n- input schema (JSON Schema):\n<unavailable>" in user["content"]


def test_append_think_flag_and_compact_variant():
    _, user = build(SimulatorPromptOptions(append_think=False))
    assert not user["content"].endswith("/think")
    system_c, user_c = build(SimulatorPromptOptions(compact=True))
    system_f, user_f = build()
    assert len(system_c["content"]) < len(system_f["content"]) / 3
    assert len(user_c["content"]) < len(user_f["content"])
    # Logged call and call to answer are identical whole lines; the logged result is the next line.
    assert '\nget_balance({"account":"A1"})\n{"balance": 120}\n' in user_c["content"]
    assert user_c["content"].rstrip("/think \n").endswith('Call:\nget_balance({"account":"A1"})')
    assert "Tool[get_balance]" in user_c["content"]


def test_bad_call_name_is_named():
    with pytest.raises(ValueError, match="call_name"):
        build(call_name=None)


@pytest.mark.parametrize("thinking", [True, False])
def test_codec_renders_simulator_prompt_through_the_template(thinking):
    tok = demo_tokenizer()
    codec = Qwen3ChatCodec(tok, simulator_thinking=thinking)
    record = {"tools": TOOLS, "reference_messages": REFERENCE}
    call = ("c1", "get_balance", {"account": "A1"})
    ids = codec.simulator_prompt(record, HISTORY, CALLER_TEXT, call)
    messages = codec.simulator_messages(record, HISTORY, CALLER_TEXT, call)
    assert messages == build()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    assert ids == ChatRenderer(tok).encode(text)
    decoded = tok.decode(ids)
    assert decoded.startswith("<|im_start|>system\nYou act as a tool")
    assert decoded.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
    assert "# Tools" not in decoded  # the candidate tools live in the user message, not a tools block


def test_compact_prompt_carries_tool_descriptions_only_when_asked():
    """The compact tool lines are name + parameters; with ``tool_descriptions`` each carries its tool's
    description as written in the schema, before the parameters (the full prompt always has them)."""
    import json

    from envace_jax.chat.simulator import _function

    _, plain = build(SimulatorPromptOptions(compact=True))
    _, described = build(SimulatorPromptOptions(compact=True, tool_descriptions=True))
    descriptions = [_function(t)["description"] for t in TOOLS]
    assert descriptions and all(d not in plain["content"] for d in descriptions)
    lines = described["content"].split("Tools:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "name": _function(t)["name"],
            "description": _function(t)["description"],
            "parameters": _function(t)["parameters"],
        }
        for t in TOOLS
    ]
    # the rest of the prompt is the same
    assert described["content"].split("\n\nLogged calls:", 1)[1] == plain["content"].split("\n\nLogged calls:", 1)[1]
    _, full = build(SimulatorPromptOptions(tool_descriptions=True))
    assert full == build()[1]
