"""The chat-completions protocol pieces against hand-written expectations of vLLM's shapes (its hermes tool
parser, its error envelope): no model, no server."""

from __future__ import annotations

import json

import pytest

from envace_jax.serve.protocol import (
    ChatRequest,
    RequestError,
    assistant_message,
    cut_at_stop,
    finish_reason,
    parse_request,
    stream_chunks,
)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
MSGS = [{"role": "user", "content": "weather?"}]


def test_tool_calls_come_back_in_the_hermes_parser_shape():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    req = parse_request({"messages": MSGS, "tools": TOOLS}, "m")
    msg, has_calls = assistant_message(text, req)
    assert has_calls and msg["role"] == "assistant" and msg["content"] == "Let me check."
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather", "get_weather"]
    first = msg["tool_calls"][0]
    assert first["type"] == "function" and first["id"].startswith("chatcmpl-tool-")
    assert first["function"]["arguments"] == '{"city": "Zürich", "days": 2}'  # a JSON string, not ASCII-escaped
    assert len({c["id"] for c in msg["tool_calls"]}) == 2
    assert finish_reason("stop", has_calls, req) == "tool_calls"
    # parallel_tool_calls=false keeps the first call only; no text before a call is content None
    one = parse_request({"messages": MSGS, "tools": TOOLS, "parallel_tool_calls": False}, "m")
    msg, _ = assistant_message(text[len("Let me check.\n") :], one)
    assert len(msg["tool_calls"]) == 1 and msg["content"] is None


def test_unparseable_calls_are_plain_content_and_tool_choice_none_parses_nothing():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    req = parse_request({"messages": MSGS, "tools": TOOLS}, "m")
    msg, has_calls = assistant_message(bad, req)
    assert not has_calls and msg["content"] == bad and msg["tool_calls"] == []
    assert finish_reason("stop", False, req) == "stop" and finish_reason("cache_full", False, req) == "length"
    good = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    none = parse_request({"messages": MSGS, "tools": TOOLS, "tool_choice": "none"}, "m")
    assert assistant_message(good, none) == ({"role": "assistant", "content": good, "tool_calls": []}, False)
    required = parse_request({"messages": MSGS, "tools": TOOLS, "tool_choice": "required"}, "m")
    assert finish_reason("stop", False, required) == "tool_calls"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ([], 400, None),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
        ({"messages": MSGS, "temperature": -1}, 400, "temperature"),
        ({"messages": MSGS, "temperature": "hot"}, 400, "temperature"),
        ({"messages": MSGS, "top_p": 0}, 400, "top_p"),
        ({"messages": MSGS, "n": 0}, 400, "n"),
        ({"messages": MSGS, "n": 1.5}, 400, "n"),
        ({"messages": MSGS, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": MSGS, "stop": 3}, 400, "stop"),
        ({"messages": MSGS, "logprobs": True}, 400, "logprobs"),
        ({"messages": MSGS, "frobnicate": 1}, 400, "frobnicate"),
        ({"messages": MSGS, "tool_choice": "required"}, 400, "tool_choice"),
        ({"messages": MSGS, "tools": [{"type": "function"}]}, 400, "tools.0"),
        ({"messages": MSGS, "response_format": {"type": "yaml"}}, 400, "response_format"),
        ({"messages": MSGS, "model": "other"}, 404, "model"),
    ],
)
def test_bad_requests_are_refused_with_the_field_named(body, status, param):
    with pytest.raises(RequestError) as e:
        parse_request(body, "m")
    err = e.value.body()["error"]
    assert e.value.status == status and err["code"] == status and err["param"] == param and err["message"]
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_a_full_request_reads_every_field():
    req = parse_request(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                {"role": "tool", "content": "ok", "tool_call_id": "c1"},
            ],
            "tools": TOOLS,
            "n": 3,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": -1,
            "max_completion_tokens": 9,
            "stop": "END",
            "seed": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": {}}},
            "chat_template_kwargs": {"enable_thinking": False},
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "m",
    )
    assert req.messages[0]["content"] == "be brief" and req.messages[2]["content"] == ""
    assert req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert (req.n, req.temperature, req.top_p, req.top_k, req.max_tokens, req.stop, req.seed) == (
        3,
        0.7,
        0.8,
        0,
        9,
        ("END",),
        5,
    )
    assert req.response_format == "json_schema" and req.enable_thinking is False and req.stream and req.include_usage


def test_stop_strings_cut_the_text_at_the_earliest_one_and_streams_rebuild_the_message():
    assert cut_at_stop("abc END def STOP", ("STOP", "END")) == ("abc ", True)
    assert cut_at_stop("abc", ("x",)) == ("abc", False)
    req = ChatRequest(messages=MSGS, tools=TOOLS)
    msg, has = assistant_message('hi\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', req)
    body = {
        "id": "chatcmpl-1",
        "created": 0,
        "model": "m",
        "usage": {"total_tokens": 3},
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason("stop", has, req)}],
    }
    chunks = stream_chunks(body, include_usage=True)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks) and chunks[-1]["usage"] == {"total_tokens": 3}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content", "") for d in deltas) == "hi"
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert json.loads(calls[0]["function"]["arguments"]) == {} and calls[0]["index"] == 0
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
