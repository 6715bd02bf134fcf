"""The OpenAI chat-completions protocol as vLLM's server speaks it: reading a request, writing a completion, an
error, and the tool calls of Qwen3 text. Host-side only (no jax), so clients and tests can use it alone.

Request fields read: ``model``, ``messages``, ``tools``, ``tool_choice`` (``auto`` / ``none`` / ``required``),
``parallel_tool_calls``, ``n``, ``temperature``, ``top_p``, ``top_k``, ``max_tokens`` (or
``max_completion_tokens``), ``stop`` (a string or a list), ``seed``, ``response_format`` (``text`` /
``json_object`` / ``json_schema``), ``chat_template_kwargs`` (``enable_thinking``) and ``stream``. Fields the
server does not act on (``logprobs``, ``presence_penalty`` ...) are refused by name rather than ignored, unless they
ask for the default, so a client never gets an answer to a question it did not ask.

Responses follow vLLM's with its ``hermes`` tool parser (Qwen3 writes ``<tool_call>{json}</tool_call>`` blocks):
each call ``{"id": "chatcmpl-tool-<hex>", "type": "function", "function": {"name", "arguments": <JSON string>}}``;
the text before the first call is ``content`` (null when empty); ``finish_reason`` is ``tool_calls`` when calls
were found under ``auto`` / ``required``; a turn whose blocks do not all parse is returned as plain content with
no calls, as vLLM does. Errors are ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status
``code``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from typing import Any, Mapping

from envace_jax.chat.tool_parser import parse_tool_calls, split_assistant_text

ROLES = ("system", "user", "assistant", "tool")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("auto", "none", "required")
# Accepted only at their default value: the server has no code path for anything else.
DEFAULT_ONLY = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "echo": (None, False),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "min_tokens": (None, 0),
}
KNOWN = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "response_format",
    "chat_template_kwargs",
    "stream",
    "stream_options",
    "user",
    *DEFAULT_ONLY,
}


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx), ``message``, the offending ``param`` (dotted path)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(
            status, "BadRequestError" if status < 500 else "InternalServerError"
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.status, self.param)


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request (see the module docstring for the fields)."""

    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_format: str = "text"
    enable_thinking: bool | None = None
    stream: bool = False
    include_usage: bool = False


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param)


def _number(body: Mapping, key: str, default, lo: float, hi: float, *, integer: bool = False, lo_open=False):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{key}' must be a number, got {json.dumps(value)[:60]}", key)
    if integer and int(value) != value:
        raise _bad(f"'{key}' must be an integer, got {value}", key)
    if value < lo or value > hi or (lo_open and value == lo):
        interval = f"{'(' if lo_open else '['}{lo}, {hi}]"
        raise _bad(f"'{key}' must be in {interval}, got {value}", key)
    return int(value) if integer else float(value)


def _messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list of chat messages", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(ROLES)}, got {json.dumps(role)}", f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text parts only
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"{where}.content.{j}: only text content parts are supported", f"{where}.content")
                texts.append(part["text"])
            content = "".join(texts)
        if content is not None and not isinstance(content, str):
            raise _bad(f"{where}.content must be a string, a list of text parts or null", f"{where}.content")
        msg = {"role": role, "content": content or ""}
        calls = m.get("tool_calls")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise _bad(f"{where}.tool_calls: only an assistant message holds a list of tool calls", where)
            msg["tool_calls"] = [_history_call(c, f"{where}.tool_calls.{j}") for j, c in enumerate(calls)]
        for key in ("name", "tool_call_id", "reasoning_content"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def _history_call(call: Any, where: str) -> dict:
    """An assistant message's past tool call, in the shape the chat template renders (arguments a dict)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise _bad(f"{where}.function.arguments is not JSON: {e}", f"{where}.function.arguments") from None
    if not isinstance(args, dict):
        raise _bad(f"{where}.function.arguments must be a JSON object", f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _tools(raw: Any) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list of function tools", "tools")
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise _bad(f"tools.{i} must be {{'type': 'function', 'function': {{...}}}}", f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools.{i}.function.name must be a non-empty string", f"tools.{i}.function.name")
    return raw or None


def check_envelope(body: Any, known: set[str], served_model: str) -> None:
    """What every endpoint checks first: a JSON object, only ``known`` fields, ``DEFAULT_ONLY`` fields at their
    default, and the served model's name (404 for another)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        raise _bad(f"unsupported field(s): {', '.join(unknown)}", unknown[0])
    for key, defaults in DEFAULT_ONLY.items():
        if key in body and body[key] not in defaults:
            raise _bad(f"'{key}' is not supported by this server (only its default)", key)
    model = body.get("model")
    if model is not None and model != served_model:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")


def read_stop(body: Mapping) -> tuple[str, ...]:
    """``stop``: a string or a list of at most 16 non-empty strings."""
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise _bad("'stop' must be a non-empty string or a list of at most 16 of them", "stop")
    return tuple(stop)


def sampling_fields(body: Mapping) -> dict[str, Any]:
    """``n``, ``temperature``, ``top_p``, ``top_k`` and ``seed``, each range-checked (vLLM's ``top_k: -1`` is off,
    as our 0)."""
    return {
        "n": _number(body, "n", 1, 1, 64, integer=True),
        "temperature": _number(body, "temperature", 1.0, 0.0, 100.0),
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        "top_k": max(0, _number(body, "top_k", 0, -1, 1 << 20, integer=True)),
        "seed": _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True),
    }


def parse_request(body: Any, served_model: str) -> ChatRequest:
    """A ``ChatRequest`` from a decoded JSON body, or a ``RequestError`` naming what is wrong."""
    check_envelope(body, KNOWN, served_model)
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice", "auto" if tools else "none")
    if isinstance(choice, dict):
        raise _bad("a named tool_choice is not supported; use 'auto', 'required' or 'none'", "tool_choice")
    if choice not in TOOL_CHOICES:
        raise _bad(f"'tool_choice' must be one of {', '.join(TOOL_CHOICES)}, got {json.dumps(choice)}", "tool_choice")
    if choice == "required" and not tools:
        raise _bad("tool_choice 'required' needs 'tools'", "tool_choice")
    stop = read_stop(body)
    fmt = body.get("response_format") or {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") not in RESPONSE_FORMATS:
        raise _bad(f"'response_format.type' must be one of {', '.join(RESPONSE_FORMATS)}", "response_format")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
        raise _bad("response_format 'json_schema' needs a 'json_schema' object", "response_format.json_schema")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
        raise _bad("'chat_template_kwargs' may hold 'enable_thinking' only", "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise _bad("chat_template_kwargs.enable_thinking must be a boolean", "chat_template_kwargs.enable_thinking")
    for key in ("stream", "parallel_tool_calls"):
        if key in body and not isinstance(body[key], bool):
            raise _bad(f"'{key}' must be a boolean", key)
    max_key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=_messages(body.get("messages")),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        **sampling_fields(body),
        max_tokens=_number(body, max_key, None, 1, 1 << 20, integer=True),
        stop=stop,
        response_format=fmt["type"],
        enable_thinking=thinking,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """(text up to the earliest stop string, whether one was found); the stop string itself is not returned."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def assistant_message(text: str, request: ChatRequest) -> tuple[dict[str, Any], bool]:
    """(the choice's message, whether it holds tool calls) for a sampled assistant ``text``."""
    if request.tools and request.tool_choice != "none":
        calls, error = parse_tool_calls(text)
        if calls and error is None:
            if not request.parallel_tool_calls:
                calls = calls[:1]
            content = split_assistant_text(text)
            tool_calls = [
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
                }
                for c in calls
            ]
            return {"role": "assistant", "content": content or None, "tool_calls": tool_calls}, True
    return {"role": "assistant", "content": text, "tool_calls": []}, False


def finish_reason(engine_reason: str, has_calls: bool, request: ChatRequest) -> str:
    """The OpenAI finish reason from the sampler's (``stop`` / ``length`` / ...) and the parsed calls."""
    if has_calls or (request.tool_choice == "required" and engine_reason == "stop"):
        return "tool_calls"
    return "length" if engine_reason in ("length", "cache_full") else "stop"


def completion_body(
    model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int, request_id: str
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished completion as the chunks of a stream: per choice a role chunk, its content, its tool calls,
    and its finish reason; then a usage chunk when asked. (The server answers streams once sampling is done: a
    client that reads streams gets the protocol, not early tokens.)"""
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    out = []
    for c in body["choices"]:
        msg = c["message"]
        out.append(head | {"choices": [{"index": c["index"], "delta": {"role": "assistant"}, "finish_reason": None}]})
        if msg.get("content"):
            delta = {"content": msg["content"]}
            out.append(head | {"choices": [{"index": c["index"], "delta": delta, "finish_reason": None}]})
        for j, call in enumerate(msg.get("tool_calls") or []):
            delta = {"tool_calls": [{"index": j, **call}]}
            out.append(head | {"choices": [{"index": c["index"], "delta": delta, "finish_reason": None}]})
        out.append(head | {"choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}]})
    if include_usage:
        out.append(head | {"choices": [], "usage": body["usage"]})
    return out
