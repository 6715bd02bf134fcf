"""Checklist judges behind one batched interface.

``Judge.judge_many(requests)`` takes every (item, assistant step) pair of many episodes at once and
returns one ``Verdict`` per request, in order. Three judges:

- ``RuleJudge``: items that carry a machine-checkable ``rule`` (our extension of the CM2 item);
- ``HttpJudge``: an OpenAI-compatible ``/v1/chat/completions`` endpoint with the reference's strict
  JSON verdict schema, retries with backoff, per-request timeout and bounded concurrency;
- ``LocalModelJudge``: any ``generate_texts(list of chat message lists) -> list[str]`` callable
  (the rollout wires it to our sampler), same prompt, tolerant verdict parsing.

Host-side only; no jax.
"""

from __future__ import annotations

import abc
import dataclasses
import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from envace_jax.config import HttpJudgeConfig  # defined with every other knob
from envace_jax.data.records import validate_rule
from envace_jax.rl.judge_prompt import (
    VERDICT_RESPONSE_FORMAT,
    MalformedVerdict,
    build_judge_prompt,
    parse_verdict_text,
    user_visible_reply,
)


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """One checklist item judged against one assistant step.

    ``previous_messages``: everything before the current user message.
    ``current_messages``: the current user message up to assistant step i, plus the tool
    messages that answer step i (the reference's "Current Messages to Evaluate").
    """

    item: Mapping[str, Any]
    previous_messages: Sequence[Mapping[str, Any]]
    current_messages: Sequence[Mapping[str, Any]]
    tag: str = ""  # free-form origin (episode/checklist/item/step) for error messages and logs

    def step(self) -> tuple[Mapping[str, Any], list[Mapping[str, Any]]]:
        """(the step's assistant message, the tool messages after it)."""
        for i in range(len(self.current_messages) - 1, -1, -1):
            if self.current_messages[i].get("role") == "assistant":
                return self.current_messages[i], [m for m in self.current_messages[i + 1 :] if m.get("role") == "tool"]
        raise ValueError(f"judge request {self.tag!r} has no assistant message to judge")

    def prompt(self) -> str:
        return build_judge_prompt(self.item, self.previous_messages, self.current_messages)


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    ok: bool = True  # False: no usable verdict (the dialogue must terminate)
    api_failed: bool = False  # True: every attempt failed (HTTP error, timeout or malformed text)
    raw: Any = None  # the parsed verdict object, rule result, or last error text
    attempts: int = 1  # model calls spent on this verdict (0 for rule verdicts)

    @staticmethod
    def failure(raw: Any, attempts: int) -> "Verdict":
        return Verdict(passed=False, ok=False, api_failed=True, raw=raw, attempts=attempts)


class Judge(abc.ABC):
    @abc.abstractmethod
    def judge_many(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        """One verdict per request, in request order. Never raises for model/API trouble."""

    def judge(self, request: JudgeRequest) -> Verdict:
        return self.judge_many([request])[0]

    def describe(self) -> str:
        """Names the judge in warnings and errors (its kind, and where it is reached)."""
        return type(self).__name__


# ----------------------------------------------------------------------------- rule judge


def _values_equal(a: Any, b: Any) -> bool:
    # bool is an int subclass in Python; a rule asking for True must not accept 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _call_name_args(call: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):  # tolerate OpenAI wire format (a JSON string)
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return fn.get("name"), None
    return fn.get("name"), args if isinstance(args, Mapping) else None


def evaluate_rule(
    rule: Mapping[str, Any], assistant: Mapping[str, Any], tool_messages: Sequence[Mapping[str, Any]] = ()
) -> bool:
    """Evaluates a validated rule on one assistant step (its message and its tool responses)."""
    kind = rule["type"]
    if kind in ("tool_called", "tool_not_called"):
        calls = [_call_name_args(c) for c in assistant.get("tool_calls") or []]
        if kind == "tool_not_called":
            return all(name != rule["name"] for name, _ in calls)
        want = rule.get("arguments", {})
        return any(
            name == rule["name"]
            and args is not None
            and all(k in args and _values_equal(args[k], v) for k, v in want.items())
            for name, args in calls
        )
    if kind == "reply_contains":
        reply = user_visible_reply(assistant.get("content")).lower()
        return all(v.lower() in reply for v in rule["values"])
    results = (evaluate_rule(sub, assistant, tool_messages) for sub in rule["rules"])
    return all(results) if kind == "all" else any(results)


class RuleJudge(Judge):
    """Judges items by their ``rule``.

    Items without a rule go to ``fallback`` if one is given; otherwise ``missing_rule="false"``
    counts them False with ok=True (the dialogue goes on), and ``"raise"`` raises ValueError.
    """

    def __init__(self, *, missing_rule: str = "false", fallback: Judge | None = None):
        if missing_rule not in ("false", "raise"):
            raise ValueError(f"missing_rule must be 'false' or 'raise', got {missing_rule!r}")
        self.missing_rule = missing_rule
        self.fallback = fallback

    def describe(self) -> str:
        if self.fallback is None:
            return "rule judge"
        return f"rule judge, {self.fallback.describe()} for items without a rule"

    def judge_many(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        out: list[Verdict | None] = [None] * len(requests)
        deferred: list[int] = []
        for i, req in enumerate(requests):
            where = f"checklist item {req.tag or i} ({str(req.item.get('question', ''))[:60]!r})"
            rule = req.item.get("rule")
            if rule is None:
                if self.fallback is not None:
                    deferred.append(i)
                    continue
                if self.missing_rule == "raise":
                    raise ValueError(f"{where} has no 'rule' and the rule judge has no fallback")
                out[i] = Verdict(passed=False, ok=True, raw="no rule", attempts=0)
                continue
            validate_rule(rule, where)
            assistant, tools = req.step()
            out[i] = Verdict(passed=evaluate_rule(rule, assistant, tools), raw=rule, attempts=0)
        if deferred:
            for i, v in zip(deferred, self.fallback.judge_many([requests[i] for i in deferred])):
                out[i] = v
        return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------- local model judge


class LocalModelJudge(Judge):
    """Judges with a local model through ``generate_texts`` (chat message lists -> completions).

    A malformed completion is re-generated, only for the failed requests, up to ``max_attempts``
    times (the reference retries parse failures too); after that it counts as an API failure.
    """

    def __init__(self, generate_texts: Callable[[list[list[dict]]], list[str]], *, max_attempts: int = 5):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.generate_texts = generate_texts
        self.max_attempts = max_attempts

    def describe(self) -> str:
        return f"local model judge ({getattr(self.generate_texts, '__qualname__', 'generate_texts')})"

    def judge_many(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        prompts = [[{"role": "user", "content": r.prompt()}] for r in requests]
        out: list[Verdict | None] = [None] * len(requests)
        last_error: dict[int, str] = {}
        pending = list(range(len(requests)))
        for attempt in range(1, self.max_attempts + 1):
            if not pending:
                break
            texts = self.generate_texts([prompts[i] for i in pending])
            if len(texts) != len(pending):
                raise ValueError(f"generate_texts returned {len(texts)} texts for {len(pending)} prompts")
            still: list[int] = []
            for i, text in zip(pending, texts):
                try:
                    obj = parse_verdict_text(text)
                except MalformedVerdict as e:
                    last_error[i] = str(e)
                    still.append(i)
                    continue
                out[i] = Verdict(passed=obj["answer"], raw=obj, attempts=attempt)
            pending = still
        for i in pending:
            out[i] = Verdict.failure(last_error[i], self.max_attempts)
        return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------- HTTP judge


class HttpJudge(Judge):
    """Blocking, thread-pooled client; at most ``max_concurrency`` HTTP requests in flight."""

    def __init__(self, config: HttpJudgeConfig):
        config.validate()
        self.config = config
        self._url = config.base_url.rstrip("/") + "/v1/chat/completions"
        self._inflight = threading.BoundedSemaphore(config.max_concurrency)
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "http_attempts": 0, "failed_attempts": 0, "api_failed": 0}

    def describe(self) -> str:
        return f"HTTP judge {self._url} (model {self.config.model!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env)
            if not key:
                raise ValueError(
                    f"HttpJudgeConfig.api_key_env names {self.config.api_key_env!r}, "
                    "which is not set in the environment"
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def request_body(self, request: JudgeRequest) -> dict[str, Any]:
        c = self.config
        body = {
            "model": c.model,
            "messages": [{"role": "user", "content": request.prompt()}],
            "temperature": c.temperature,
            "top_p": c.top_p,
            "max_tokens": c.max_tokens,
        }
        if c.use_response_format:
            body["response_format"] = VERDICT_RESPONSE_FORMAT
        return body

    def _attempt(self, payload: bytes, headers: dict[str, str]) -> dict[str, Any]:
        req = urllib.request.Request(self._url, data=payload, headers=headers, method="POST")
        with self._inflight:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                raw = resp.read()
        try:
            reply = json.loads(raw)
            text = reply["choices"][0]["message"]["content"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
            raise MalformedVerdict(f"not a chat completion ({type(e).__name__}): {raw[:200]!r}") from None
        return parse_verdict_text(text)

    def _one(self, request: JudgeRequest, headers: dict[str, str]) -> Verdict:
        c = self.config
        payload = json.dumps(self.request_body(request)).encode()
        last = ""
        for attempt in range(1, c.max_attempts + 1):
            with self._lock:
                self.stats["http_attempts"] += 1
            try:
                obj = self._attempt(payload, headers)
                return Verdict(passed=obj["answer"], raw=obj, attempts=attempt)
            except (OSError, http.client.HTTPException, ValueError) as e:
                # HTTPError, timeouts, refused connections and malformed verdicts are all retried.
                last = f"{type(e).__name__}: {e}"
                if isinstance(e, urllib.error.HTTPError):
                    try:  # keep the server's reason for the log; closing frees the socket
                        last += f" {e.read(300)!r}"
                    except OSError:
                        pass
                    finally:
                        e.close()
                with self._lock:
                    self.stats["failed_attempts"] += 1
            if attempt < c.max_attempts:
                time.sleep(min(c.backoff_base_s * 2 ** (attempt - 1), c.backoff_max_s))
        with self._lock:
            self.stats["api_failed"] += 1
        return Verdict.failure(last, c.max_attempts)

    def judge_many(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        if not requests:
            return []
        headers = self._headers()
        with self._lock:
            self.stats["requests"] += len(requests)
        # Threads only wait on sockets and backoff sleeps; the semaphore, not the pool size,
        # bounds in-flight requests, so several callers sharing this judge stay within the bound.
        workers = min(len(requests), self.config.max_concurrency)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="http-judge") as pool:
            return list(pool.map(lambda r: self._one(r, headers), requests))
