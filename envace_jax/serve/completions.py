"""The OpenAI completions protocol (``POST /v1/completions``) as vLLM's server speaks it: a prompt continued as it
is, with no chat template. Host-side only (no jax).

It is the endpoint of clients that render prompts themselves: test-time rehearsal with a served policy
(``eval.http_policy_client``) sends the token ids our codec rendered, and asks for the sampled ids back.

Request fields read: ``model``, ``prompt`` (one prompt: a string, or a list of token ids), ``n``, ``temperature``,
``top_p``, ``top_k``, ``max_tokens`` (default 16, as OpenAI's and vLLM's), ``stop`` (strings), ``stop_token_ids``
and ``return_token_ids`` (vLLM's extensions), ``seed``. A batch of prompts, ``stream``, ``echo``, ``logprobs`` and
``suffix`` are refused by name. Each choice is ``{"index", "text", "logprobs": null, "finish_reason"}`` plus, with
``return_token_ids``, ``token_ids`` (the sampled ids, a stop token included) and ``prompt_token_ids``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from envace_jax.serve.protocol import DEFAULT_ONLY, _bad, _number, check_envelope, read_stop, sampling_fields

KNOWN = {
    "model",
    "prompt",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "return_token_ids",
    "seed",
    "stream",
    "suffix",
    "user",
    *DEFAULT_ONLY,
}
DEFAULT_MAX_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A validated completions request: the fields ``ServeEngine`` samples with, and the prompt."""

    prompt_ids: tuple[int, ...] | None  # a prompt given as token ids
    prompt_text: str | None  # or as text (encoded with the served tokenizer, no template)
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    return_token_ids: bool = False
    seed: int | None = None


def _prompt(raw: Any, vocab_size: int) -> tuple[tuple[int, ...] | None, str | None]:
    if isinstance(raw, str):
        if not raw:
            raise _bad("'prompt' is empty", "prompt")
        return None, raw
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        bad = [t for t in raw if not 0 <= t < vocab_size]
        if bad:
            raise _bad(f"'prompt' holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "prompt")
        return tuple(raw), None
    if isinstance(raw, list) and raw and all(isinstance(p, (str, list)) for p in raw):
        raise _bad("one prompt per request: send a batch of prompts as separate requests", "prompt")
    raise _bad("'prompt' must be a string or a non-empty list of token ids", "prompt")


def parse_completion_request(body: Any, served_model: str, vocab_size: int) -> CompletionRequest:
    """A ``CompletionRequest`` from a decoded JSON body, or a ``RequestError`` naming what is wrong."""
    check_envelope(body, KNOWN, served_model)
    for key in ("stream", "suffix"):
        if body.get(key):
            raise _bad(f"'{key}' is not supported on /v1/completions by this server", key)
    ids, text = _prompt(body.get("prompt"), vocab_size)
    stop = read_stop(body)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and 0 <= t < vocab_size for t in stop_ids):
        raise _bad(f"'stop_token_ids' must be a list of token ids in [0, {vocab_size})", "stop_token_ids")
    if "return_token_ids" in body and not isinstance(body["return_token_ids"], bool):
        raise _bad("'return_token_ids' must be a boolean", "return_token_ids")
    return CompletionRequest(
        prompt_ids=ids,
        prompt_text=text,
        **sampling_fields(body),
        max_tokens=_number(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, 1 << 20, integer=True),
        stop=stop,
        stop_token_ids=tuple(stop_ids),
        return_token_ids=bool(body.get("return_token_ids", False)),
    )


def text_completion_body(
    model: str,
    request: CompletionRequest,
    prompt: list[int],
    choices: list[Mapping[str, Any]],
    request_id: str,
) -> dict[str, Any]:
    """The response body; ``choices``: per choice ``text``, ``finish_reason``, ``token_ids``."""
    out = []
    for i, c in enumerate(choices):
        choice = {"index": i, "text": c["text"], "logprobs": None, "finish_reason": c["finish_reason"]}
        if request.return_token_ids:
            choice["token_ids"] = list(c["token_ids"])
            choice["prompt_token_ids"] = list(prompt)
        out.append(choice)
    completion = sum(len(c["token_ids"]) for c in choices)
    # the prompt counted once, whatever ``n``, as the chat endpoint and vLLM count it
    return {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion,
            "total_tokens": len(prompt) + completion,
        },
    }


__all__ = ["CompletionRequest", "parse_completion_request", "text_completion_body"]
