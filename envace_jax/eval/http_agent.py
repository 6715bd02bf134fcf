"""``policy=http``: a served model as a suite's agent (the ``Agent`` of ``eval.harness``).

Each turn of each conversation is one ``POST /v1/chat/completions`` with the conversation so far (assistant tool
calls with their arguments as JSON strings, as OpenAI clients send them) and its tools, at the eval's sampling
settings. The reply's ``content`` and ``tool_calls`` become Qwen3 text again (``harness.tool_call_text``), which
the suite parses with our parser, as it parses an in-process model's turn; a reply whose calls the server could
not parse comes back as content and fails our parser the same way. Conversations of a batch are sent
concurrently (``http.max_concurrency``); a request that gets no answer or a 5xx is tried again, a 4xx is an error
naming the server's message, except a prompt past the server's context, which ends the conversation as
``length_budget`` as the in-process agent does.

Unlike the in-process agent, which continues each row's KV cache with the ids it sampled, the server renders
the whole conversation from messages every turn (as BFCL's and tau2's own served-model clients do), so a turn
whose text does not re-render to the sampled ids can be continued differently.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from envace_jax.config import RoleSampling
from envace_jax.eval.config import HttpPolicySpec
from envace_jax.eval.harness import LENGTH_BUDGET, AgentTurn, Conversation, tool_call_text

_MESSAGE_KEYS = ("role", "content", "tool_call_id", "name", "reasoning_content")


def wire_message(m: dict[str, Any]) -> dict[str, Any]:
    """A conversation message as an OpenAI client sends it (tool-call arguments as a JSON string)."""
    out = {k: m[k] for k in _MESSAGE_KEYS if m.get(k) is not None}
    out.setdefault("content", "")
    if m.get("tool_calls"):
        out["tool_calls"] = []
        for i, c in enumerate(m["tool_calls"]):
            fn = c.get("function", c)
            args = fn.get("arguments", {})
            out["tool_calls"].append(
                {
                    "id": c.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": fn.get("name"),
                        "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                    },
                }
            )
    return out


def reply_text(message: dict[str, Any]) -> str:
    """A completion's message as Qwen3 text: the content, then one ``<tool_call>`` block per call."""
    content = message.get("content") or ""
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:  # a server that passes bad arguments on: keep them for our parser to reject
            block = f'{{"name": {json.dumps(fn.get("name"))}, "arguments": {fn.get("arguments")}}}'
            return f"{content}\n<tool_call>\n{block}\n</tool_call>"
        calls.append((fn.get("name"), args))
    return tool_call_text(calls, content) if calls else content


def sampling_body(s: RoleSampling, seed: int) -> dict[str, Any]:
    """A role's sampling settings as OpenAI request fields (``top_k`` only when set: not every server takes it)."""
    body = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_new_tokens, "seed": int(seed)}
    if s.top_k:
        body["top_k"] = s.top_k
    return body


def request_headers(spec: HttpPolicySpec) -> dict[str, str]:
    """JSON, and the bearer key of ``spec.api_key_env`` when it names one (an error when that variable is unset)."""
    headers = {"Content-Type": "application/json"}
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ValueError(f"config.http.api_key_env names {spec.api_key_env!r}, which is not set")
        headers["Authorization"] = f"Bearer {key}"
    return headers


def post_json(url: str, body: dict[str, Any], headers: dict[str, str], spec: HttpPolicySpec) -> tuple[int, dict]:
    """(status, JSON reply) of one POST; no answer or a 5xx is tried again (``spec.max_attempts``), a 4xx is
    returned as it came."""
    data = json.dumps(body, ensure_ascii=False).encode()
    last = ""
    for attempt in range(spec.max_attempts):
        if attempt:
            time.sleep(min(2.0**attempt, 30.0))
        req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=spec.timeout_s) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            if e.code < 500:
                try:
                    return e.code, json.loads(raw)
                except json.JSONDecodeError:
                    return e.code, {"error": {"message": raw[:300].decode(errors="replace")}}
            last = f"HTTP {e.code}: {raw[:300]!r}"
        except (OSError, json.JSONDecodeError) as e:
            last = f"{type(e).__name__}: {e}"
    raise RuntimeError(f"policy=http: no answer from {url} after {spec.max_attempts} tries ({last})")


def error_message(reply: dict[str, Any]) -> str:
    err = reply.get("error")
    return err.get("message", "") if isinstance(err, dict) else str(err)


def past_context(status: int, message: str) -> bool:
    """Is this refusal a prompt longer than the server's context (which ends a conversation, not the run)?"""
    return status == 400 and ("max_model_len" in message or "context" in message)


class HttpAgent:
    """A served model as an ``Agent`` (see the module docstring)."""

    def __init__(self, spec: HttpPolicySpec, sampling: RoleSampling, *, enable_thinking: bool = True, seed: int = 0):
        self.spec, self.sampling, self.enable_thinking, self.seed = spec, sampling, enable_thinking, seed
        self.url = spec.base_url.rstrip("/") + "/v1/chat/completions"
        self.headers = request_headers(spec)
        self._calls = 0

    def body(self, c: Conversation, seed: int) -> dict[str, Any]:
        body = {
            "model": self.spec.model,
            "messages": [wire_message(m) for m in c.messages],
            **sampling_body(self.sampling, seed),
            "chat_template_kwargs": {"enable_thinking": self.enable_thinking},
        }
        if c.tools:
            body["tools"] = c.tools
        return body

    def _post(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return post_json(self.url, body, self.headers, self.spec)

    def _one(self, c: Conversation, seed: int) -> AgentTurn:
        status, reply = self._post(self.body(c, seed))
        if status != 200:
            msg = error_message(reply)
            if past_context(status, msg):  # the prompt outgrew the server
                return AgentTurn("", LENGTH_BUDGET, 0, 0)
            raise ValueError(f"policy=http: {self.url} refused conversation {c.key!r} with {status}: {msg}")
        choice = reply["choices"][0]
        usage = reply.get("usage") or {}
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return AgentTurn(
            reply_text(choice["message"]), reason, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        )

    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]:
        if not conversations:
            return []
        self._calls += 1
        seeds = [(self.seed * 1_000_003 + self._calls * 7919 + i) % (2**31 - 1) for i in range(len(conversations))]
        with ThreadPoolExecutor(min(len(conversations), self.spec.max_concurrency), "http-agent") as pool:
            return list(pool.map(self._one, conversations, seeds))

    def release(self, keys: Sequence[str]) -> None:
        del keys  # the server keeps nothing between requests
