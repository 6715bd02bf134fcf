r"""Parsing the ACT role's text into tool calls: the one parse path of training, evaluation and test-time
rehearsal (the rollout engine, the benchmark harness and the imagined episodes all call it).

Contract: ``parse_tool_calls(text) -> (calls, error)``. ``calls`` is a list of
``{"name": str, "arguments": dict}``; ``error`` is None or ``{"error_tool_call": "<CODE>: <message>"}``.
``split_assistant_text(text)`` is the assistant message content (the text before the first call) and
``make_assistant_message`` builds the whole message. The functions never raise on model text, whatever it
contains.

Two syntaxes (``syntax=``), which differ only in the whitespace a block needs around its JSON:

* ``"qwen3"`` (default): a block is ``<tool_call>`` ... ``</tool_call>`` wherever it starts, its JSON
  surrounded by any whitespace. Real Qwen3 with thinking off starts its turn with ``<tool_call>`` right
  after the generation prompt's "\n\n"; with thinking on it writes "\n\n<tool_call>" after
  ``</think>``. Both parse the same, one call or several.
* ``"reference"`` (faithful, ``RolloutConfig.tool_call_syntax``): the reference's regex
  ``\n<tool_call>\n(.*?)\n</tool_call>``, newlines required, so a turn that starts with ``<tool_call>``
  gives NO_TOOL_CALL_FOUND (one call) or loses its first call (several), and the content is the text
  before the first "\n<tool_call>\n".

Faithful to the reference in both syntaxes:
* no ``<tool_call>`` anywhere -> ([], None): a final answer; a ``<tool_call>`` but no block ->
  NO_TOOL_CALL_FOUND;
* a block's JSON may be one object or a list of objects; ``parameters`` is read before ``arguments``;
* any bad block invalidates every call of the turn;
* by default the scan includes the ``<think>`` part (``ignore_think=True`` skips calls written there).

Our choices where the reference leaves it open (each named here so callers can rely on them):
* arguments that are present but not a JSON object (a string, a list, a number) -> NO_ARGUMENTS, since our
  records carry arguments as a dict; the reference would pass them on and let the simulator reject them;
* a block whose JSON is neither an object nor a list of objects (or a list holding a non-object) ->
  JSON_DECODE_ERROR; an empty list -> NO_TOOL_CALL_FOUND;
* NaN/Infinity in arguments -> NON_SERIALIZABLE_ARGUMENTS (they are not JSON); lone surrogates are replaced
  by U+FFFD (the reference's sanitiser does the same for invalid code points);
* nesting deep enough to exhaust Python's recursion -> JSON_DECODE_ERROR;
* ``"qwen3"`` content drops the one newline that separates it from the first call, so content plus the
  calls rendered by Qwen3's template (which puts "\n" before a call only after non-empty content) gives
  the sampled text back.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from envace_jax.chat.template import THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from envace_jax.config import TOOL_CALL_SYNTAXES

NO_TOOL_CALL_FOUND = "NO_TOOL_CALL_FOUND"
JSON_DECODE_ERROR = "JSON_DECODE_ERROR"
NO_ARGUMENTS = "NO_ARGUMENTS"
NON_SERIALIZABLE_ARGUMENTS = "NON_SERIALIZABLE_ARGUMENTS"
INVALID_TOOL_NAME = "INVALID_TOOL_NAME"
TOOL_CALL_ERROR_CODES = (
    NO_TOOL_CALL_FOUND,
    JSON_DECODE_ERROR,
    NO_ARGUMENTS,
    NON_SERIALIZABLE_ARGUMENTS,
    INVALID_TOOL_NAME,
)

ERROR_KEY = "error_tool_call"
CALL_SEPARATOR = "\n<tool_call>\n"
QWEN3, REFERENCE = TOOL_CALL_SYNTAXES
# Each syntax: the regex of one block (group 1 is the JSON), and the text whose first occurrence ends the content.
_BLOCK_RE = {
    REFERENCE: re.compile(r"\n<tool_call>\n(.*?)\n</tool_call>", re.DOTALL),
    QWEN3: re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL),
}
_CONTENT_END = {REFERENCE: CALL_SEPARATOR, QWEN3: TOOL_CALL_OPEN}
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


def _think_spans(text: str) -> list[tuple[int, int]]:
    """Where ``strip_think`` finds thinking, as [start, end) ranges of ``text``."""
    spans = [(m.start(), m.end()) for m in _THINK_RE.finditer(text)]

    def outside(i: int) -> bool:
        return not any(a <= i < b for a, b in spans)

    closes = [i for i in _find_all(text, THINK_CLOSE) if outside(i)]
    if closes:
        spans.append((0, closes[-1] + len(THINK_CLOSE)))
    opens = [i for i in _find_all(text, THINK_OPEN) if outside(i)]
    if opens:
        spans.append((opens[0], len(text)))
    return spans


def _find_all(text: str, needle: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(needle), text)]


def sanitize_text(text: str) -> str:
    """Replaces code points that cannot be encoded (lone surrogates) with U+FFFD."""
    return _SURROGATE_RE.sub("\ufffd", text)


def tool_call_error(code: str, message: str) -> dict[str, str]:
    return {ERROR_KEY: f"{code}: {message}"}


def _call_from_item(item: Any, block_index: int) -> dict[str, Any]:
    where = f"tool_call block {block_index}"
    if not isinstance(item, dict):
        raise _BadCall(
            JSON_DECODE_ERROR, f"{where} must be a JSON object or a list of objects, got {type(item).__name__}"
        )
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


def _check_syntax(syntax: str) -> None:
    if syntax not in TOOL_CALL_SYNTAXES:
        raise ValueError(f"tool-call syntax {syntax!r}: choose one of {TOOL_CALL_SYNTAXES}")


class _Scan(NamedTuple):
    content_end: int | None  # where the content ends: the first call start that counts (None: no call start)
    mentions_call: bool  # a "<tool_call>" tag that counts is somewhere in the text
    bodies: list[str]  # the JSON text of each block that counts, in order


def _scan(text: str, ignore_think: bool, syntax: str) -> _Scan:
    """Finds the blocks of ``syntax``; with ``ignore_think``, anything that starts inside thinking does not count.
    A qwen3 block starts at its tag; a reference block at the newline before it, where the regex matches."""
    _check_syntax(syntax)
    skip = _think_spans(text) if ignore_think else []
    lead = 1 if syntax == REFERENCE else 0

    def counts(i: int) -> bool:
        return not any(a <= i < b for a, b in skip)

    bodies = [m.group(1) for m in _BLOCK_RE[syntax].finditer(text) if counts(m.start() + lead)]
    starts = [i for i in _find_all(text, _CONTENT_END[syntax]) if counts(i + lead)]
    mentions = any(counts(i) for i in _find_all(text, TOOL_CALL_OPEN))
    return _Scan(starts[0] if starts else None, mentions, bodies)


def parse_tool_calls(
    text: str, ignore_think: bool = False, *, syntax: str = QWEN3
) -> tuple[list[dict[str, Any]], dict | None]:
    """Parses ``<tool_call>`` blocks. Returns (calls, None), ([], None) for a final answer, or ([], error)."""
    if not isinstance(text, str):
        _check_syntax(syntax)
        return [], tool_call_error(NO_TOOL_CALL_FOUND, f"caller output is {type(text).__name__}, not text")
    scan = _scan(text, ignore_think, syntax)
    if not scan.mentions_call:
        return [], None
    if not scan.bodies:
        form = "'\\n<tool_call>\\n{...}\\n</tool_call>'" if syntax == REFERENCE else "'<tool_call>{...}</tool_call>'"
        return [], tool_call_error(NO_TOOL_CALL_FOUND, f"found '<tool_call>' but no block of the form {form}")
    calls: list[dict[str, Any]] = []
    try:
        for b, block in enumerate(scan.bodies):
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


def split_assistant_text(text: str, ignore_think: bool = False, *, syntax: str = QWEN3) -> str:
    """The assistant message content: the text before the first tool call, think included (as the
    reference stores it). ``"qwen3"`` drops the one newline before the call, whether or not it is there;
    ``"reference"`` cuts at the first "\\n<tool_call>\\n" as the reference does."""
    end = _scan(text, ignore_think, syntax).content_end
    if end is None:
        return text
    content = text[:end]
    return content[:-1] if syntax == QWEN3 and content.endswith("\n") else content


def make_assistant_message(
    text: str, *, call_id_prefix: str = "call", ignore_think: bool = False, syntax: str = QWEN3
) -> tuple[dict[str, Any], dict | None]:
    """Builds the assistant message dict for one sampled turn; returns (message, parse_error).

    On a parse error the message carries the content and no tool calls; the caller appends the error
    as a ``{"role": "tool", "name": "error_tool_call"}`` message and ends the episode (spec 2.3).
    Call ids are ``{call_id_prefix}_{i}``; the reference uses ``call_{uuid}_{turn}_{i}``.
    """
    calls, error = parse_tool_calls(text, ignore_think=ignore_think, syntax=syntax)
    message: dict[str, Any] = {"role": "assistant", "content": split_assistant_text(text, ignore_think, syntax=syntax)}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"{call_id_prefix}_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for i, c in enumerate(calls)
        ]
    return message, error


def error_message(error: dict, *, name: str = ERROR_KEY) -> dict[str, str]:
    """The tool message that records a parse error in the episode (reference layout)."""
    return {"role": "tool", "name": name, "content": json.dumps(error, ensure_ascii=False)}
