"""Parsing the ACT role's text into tool calls, with the reference's strictness (spec 2.5).

Contract: ``parse_tool_calls(text) -> (calls, error)``. ``calls`` is a list of
``{"name": str, "arguments": dict}``; ``error`` is None or ``{"error_tool_call": "<CODE>: <message>"}``.
The functions never raise on model text, whatever it contains.

Faithful to the reference:
* no ``<tool_call>`` anywhere -> ([], None): a final answer;
* blocks must match ``\\n<tool_call>\\n(.*?)\\n</tool_call>`` (newlines required); none -> NO_TOOL_CALL_FOUND;
* a block's JSON may be one object or a list of objects; ``parameters`` is read before ``arguments``;
* any bad block invalidates every call of the turn;
* by default the scan includes the ``<think>`` part (``ignore_think=True`` strips it first).

Our choices where the reference leaves it open (each named here so callers can rely on them):
* arguments that are present but not a JSON object (a string, a list, a number) -> NO_ARGUMENTS, since our
  records carry arguments as a dict; the reference would pass them on and let the simulator reject them;
* a block whose JSON is neither an object nor a list of objects (or a list holding a non-object) ->
  JSON_DECODE_ERROR; an empty list -> NO_TOOL_CALL_FOUND;
* NaN/Infinity in arguments -> NON_SERIALIZABLE_ARGUMENTS (they are not JSON); lone surrogates are replaced
  by U+FFFD (the reference's sanitiser does the same for invalid code points);
* nesting deep enough to exhaust Python's recursion -> JSON_DECODE_ERROR.
"""

from __future__ import annotations

import json
import re
from typing import Any

from envace_jax.chat.template import THINK_CLOSE, THINK_OPEN

NO_TOOL_CALL_FOUND = "NO_TOOL_CALL_FOUND"
JSON_DECODE_ERROR = "JSON_DECODE_ERROR"
NO_ARGUMENTS = "NO_ARGUMENTS"
NON_SERIALIZABLE_ARGUMENTS = "NON_SERIALIZABLE_ARGUMENTS"
INVALID_TOOL_NAME = "INVALID_TOOL_NAME"
TOOL_CALL_ERROR_CODES = (NO_TOOL_CALL_FOUND, JSON_DECODE_ERROR, NO_ARGUMENTS, NON_SERIALIZABLE_ARGUMENTS,
                         INVALID_TOOL_NAME)

ERROR_KEY = "error_tool_call"
CALL_SEPARATOR = "\n<tool_call>\n"
_BLOCK_RE = re.compile(r"\n<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_THINK_RE = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.DOTALL)
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")


class _BadCall(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def strip_think(text: str) -> str:
    """Removes thinking: closed ``<think>...</think>`` blocks, text up to an orphan ``</think>``
    (a generation prompt that opened the block itself), and an unclosed ``<think>`` to the end."""
    text = _THINK_RE.sub("", text)
    if THINK_CLOSE in text:
        text = text.split(THINK_CLOSE)[-1]
    if THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[0]
    return text


def sanitize_text(text: str) -> str:
    """Replaces code points that cannot be encoded (lone surrogates) with U+FFFD."""
    return _SURROGATE_RE.sub("\ufffd", text)


def tool_call_error(code: str, message: str) -> dict[str, str]:
    return {ERROR_KEY: f"{code}: {message}"}


def _call_from_item(item: Any, block_index: int) -> dict[str, Any]:
    where = f"tool_call block {block_index}"
    if not isinstance(item, dict):
        raise _BadCall(JSON_DECODE_ERROR, f"{where} must be a JSON object or a list of objects, "
                                          f"got {type(item).__name__}")
    args = item.get("parameters")
    if args is None:
        args = item.get("arguments")
    if args is None:
        raise _BadCall(NO_ARGUMENTS, f"{where} has no 'arguments' (or 'parameters') field")
    if not isinstance(args, dict):
        raise _BadCall(NO_ARGUMENTS, f"{where}: 'arguments' must be a JSON object, got {type(args).__name__}")
    try:
        dumped = json.dumps(args, ensure_ascii=False, allow_nan=False)
        args = json.loads(sanitize_text(dumped))
    except (ValueError, TypeError, RecursionError) as exc:
        raise _BadCall(NON_SERIALIZABLE_ARGUMENTS, f"{where}: arguments cannot be serialised as JSON ({exc})")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _BadCall(INVALID_TOOL_NAME, f"{where}: 'name' must be a non-empty string, got {name!r:.80}")
    return {"name": sanitize_text(name), "arguments": args}


def parse_tool_calls(text: str, ignore_think: bool = False) -> tuple[list[dict[str, Any]], dict | None]:
    """Parses ``<tool_call>`` blocks. Returns (calls, None), ([], None) for a final answer, or ([], error)."""
    if not isinstance(text, str):
        return [], tool_call_error(NO_TOOL_CALL_FOUND, f"caller output is {type(text).__name__}, not text")
    if ignore_think:
        text = strip_think(text)
    if "<tool_call>" not in text:
        return [], None
    blocks = _BLOCK_RE.findall(text)
    if not blocks:
        return [], tool_call_error(NO_TOOL_CALL_FOUND, "found '<tool_call>' but no block of the form "
                                                       "'\\n<tool_call>\\n{...}\\n</tool_call>'")
    calls: list[dict[str, Any]] = []
    try:
        for b, block in enumerate(blocks):
            try:
                obj = json.loads(block)
            except (ValueError, RecursionError) as exc:
                raise _BadCall(JSON_DECODE_ERROR, f"tool_call block {b} is not valid JSON ({exc})")
            items = obj if isinstance(obj, list) else [obj]
            if not items:
                raise _BadCall(NO_TOOL_CALL_FOUND, f"tool_call block {b} is an empty list")
            calls.extend(_call_from_item(item, b) for item in items)
    except _BadCall as bad:
        return [], tool_call_error(bad.code, bad.message)
    return calls, None


def split_assistant_text(text: str) -> str:
    """The assistant message content: the text before the first "\\n<tool_call>\\n", think included
    (as the reference stores it), so content + rendered calls reproduces a well-formed turn."""
    return text.split(CALL_SEPARATOR, 1)[0]


def make_assistant_message(text: str, *, call_id_prefix: str = "call", ignore_think: bool = False
                           ) -> tuple[dict[str, Any], dict | None]:
    """Builds the assistant message dict for one sampled turn; returns (message, parse_error).

    On a parse error the message carries the content and no tool calls; the caller appends the error
    as a ``{"role": "tool", "name": "error_tool_call"}`` message and ends the episode (spec 2.3).
    Call ids are ``{call_id_prefix}_{i}``; the reference uses ``call_{uuid}_{turn}_{i}``.
    """
    calls, error = parse_tool_calls(text, ignore_think=ignore_think)
    message: dict[str, Any] = {"role": "assistant", "content": split_assistant_text(text)}
    if calls:
        message["tool_calls"] = [
            {"id": f"{call_id_prefix}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)]
    return message, error


def error_message(error: dict, *, name: str = ERROR_KEY) -> dict[str, str]:
    """The tool message that records a parse error in the episode (reference layout)."""
    return {"role": "tool", "name": name, "content": json.dumps(error, ensure_ascii=False)}
