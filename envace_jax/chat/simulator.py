"""The REHEARSE role: its prompt (spec 2.6, our own wording) and the parser of its output.

The prompt is two chat messages, rendered with the same chat template as the ACT role:

* system: how to validate the call (format in the caller's raw message, whitelist, argument schema),
  what to output for each failure, and the output format ``<execution_result>\\n{json}\\n</execution_result>``;
* user: sections separated by blank lines: candidate tools, few-shot of logged calls, history,
  the caller's raw latest message, the call to simulate, and an optional ``/think`` line.

Few-shot leak (``few_shot=True``, the reference default): the examples are every (tool, arguments,
result) triple of the task's whole reference conversation, including calls the caller has not made yet
and results of later turns, and the instruction says to reuse a logged result when name and arguments
match. Rehearsed responses are therefore grounded in logged real executions; only the loss, not the
prompt, is free of environment data. Turn it off to measure rehearsal without that grounding.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from envace_jax.chat.tool_parser import ERROR_KEY, sanitize_text, strip_think

EMPTY_SIMULATOR_OUTPUT = "EMPTY_SIMULATOR_OUTPUT"
NO_EXECUTION_RESULT_TAG_FOUND = "NO_EXECUTION_RESULT_TAG_FOUND"
EXECUTION_RESULT_TAG_MALFORMED = "EXECUTION_RESULT_TAG_MALFORMED"
SIMULATOR_JSON_DECODE_ERROR = "SIMULATOR_JSON_DECODE_ERROR"
INVALID_EXECUTION_RESULT_TYPE = "INVALID_EXECUTION_RESULT_TYPE"
NON_SERIALIZABLE_EXECUTION_RESULT = "NON_SERIALIZABLE_EXECUTION_RESULT"
SIMULATOR_ERROR_CODES = (
    EMPTY_SIMULATOR_OUTPUT,
    NO_EXECUTION_RESULT_TAG_FOUND,
    EXECUTION_RESULT_TAG_MALFORMED,
    SIMULATOR_JSON_DECODE_ERROR,
    INVALID_EXECUTION_RESULT_TYPE,
    NON_SERIALIZABLE_EXECUTION_RESULT,
)

_RESULT_RE = re.compile(r"\n<execution_result>\n(.*?)\n</execution_result>", re.DOTALL)
UNAVAILABLE = "<unavailable>"


def simulator_error(code: str, message: str, details: Any = None) -> dict[str, dict[str, Any]]:
    return {ERROR_KEY: {"code": code, "message": message, "details": details}}


def parse_simulator_output(text: str) -> tuple[str | None, dict | None]:
    """Returns (result_json_string, None) or (None, {"error_tool_call": {"code", "message", "details"}}).

    The result is re-dumped with ``ensure_ascii=False`` so equal JSON gives equal strings. Never raises.
    """
    if not isinstance(text, str) or not text.strip():
        return None, simulator_error(EMPTY_SIMULATOR_OUTPUT, "the simulator produced no text")
    body = strip_think(text)
    if not body.strip():
        return None, simulator_error(EMPTY_SIMULATOR_OUTPUT, "the simulator produced only thinking")
    if "<execution_result>" not in body:
        return None, simulator_error(
            NO_EXECUTION_RESULT_TAG_FOUND, "no <execution_result> tag in the output", body[:200]
        )
    match = _RESULT_RE.search(body)
    if match is None:
        return None, simulator_error(
            EXECUTION_RESULT_TAG_MALFORMED,
            "expected '\\n<execution_result>\\n<JSON>\\n</execution_result>'",
            body[:200],
        )
    raw = match.group(1)
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, simulator_error(SIMULATOR_JSON_DECODE_ERROR, "execution result is not valid JSON", str(exc)[:200])
    if not ((isinstance(value, dict) and value) or isinstance(value, list)):
        return None, simulator_error(
            INVALID_EXECUTION_RESULT_TYPE,
            "execution result must be a non-empty JSON object or a JSON array",
            type(value).__name__,
        )
    try:
        # Lone surrogates (from \ud800-style escapes) cannot be tokenised; U+FFFD as in the reference.
        return sanitize_text(json.dumps(value, ensure_ascii=False, allow_nan=False)), None
    except (ValueError, TypeError, RecursionError) as exc:
        return None, simulator_error(
            NON_SERIALIZABLE_EXECUTION_RESULT, "execution result cannot be re-serialised", str(exc)[:200]
        )


# ----------------------------------------------------------------------------- is this response an error?
# The one home of these questions; they differ on purpose:
#   is_error_result      a verdict that ENDS an episode: the simulator's / parser's ``error_tool_call``
#                        (a real tool's ordinary ``{"error": ...}`` reply is just a response the caller reads)
#   is_failed_result     a call that did not work, either way (rehearsal memory, fidelity views)
#   is_error_tool_message the judge's test on a whole tool message (reference: the content *contains*
#                        ``error_tool_call``, or the message is the parse-error message)


def _as_json(content: Any) -> Any:
    if isinstance(content, str):
        try:
            return json.loads(content)
        except (ValueError, RecursionError):
            return None
    return content


def is_error_result(content: Any) -> bool:
    """True iff the tool content is (or parses as) a JSON object with an ``error_tool_call`` key."""
    content = _as_json(content)
    return isinstance(content, dict) and ERROR_KEY in content


def is_failed_result(content: Any) -> bool:
    """True iff the tool content is (or parses as) a JSON object reporting a failure: an ``error_tool_call``
    verdict or a real tool's ``error`` reply."""
    content = _as_json(content)
    return isinstance(content, dict) and (ERROR_KEY in content or "error" in content)


def is_error_tool_message(message: Mapping[str, Any]) -> bool:
    """A tool message that reports a parse/simulation failure (the reference's error payload)."""
    if message.get("role") != "tool":
        return False
    return message.get("name") == ERROR_KEY or ERROR_KEY in str(message.get("content") or "")


# ----------------------------------------------------------------------------- prompt


@dataclasses.dataclass(frozen=True)
class SimulatorPromptOptions:
    few_shot: bool = True  # logged calls of the reference conversation (leaks future calls; see module doc)
    append_think: bool = True  # "\n\n/think" at the end of the user message (reference default)
    compact: bool = False  # shorter instruction and one-line sections, for tiny models
    # the compact prompt's tool lines carry each tool's description too (the full prompt always does): the
    # rules and the state a description states (a limit, a fee, the accounts that exist) are then in front of
    # REHEARSE instead of only in what its training rows showed
    tool_descriptions: bool = False


_SYSTEM_FULL = """You act as a tool: you receive one tool call made by an AI assistant and you return exactly what \
the tool would return.

You are given:
- the candidate tools of this task (their JSON schemas): the only tools that exist;
- logged calls of these tools with their real results, when available;
- the conversation so far between the user and the assistant;
- the assistant's latest raw message, exactly as it was written;
- the call to answer: tool name, its input schema and the parsed arguments.

Check the call in this order and stop at the first failure:
1. Format. The latest raw message must write each call as a JSON object with "name" and "arguments" between \
<tool_call> and </tool_call> tags. If it does not, output
{"error_tool_call": {"code": "INVALID_TOOL_CALL_FORMAT", "message": "<what is wrong>"}}
2. Availability. The tool name must be one of the candidate tools. If it is not, output
{"error_tool_call": {"code": "TOOL_NOT_AVAILABLE", "message": "<the unknown name>"}}
3. Arguments. Every required argument must be present, no unknown argument may appear, and each value must \
have the type and allowed values its schema gives. If not, output
{"error_tool_call": {"code": "INVALID_PARAMETERS", "message": "<which argument and why>"}}
4. Result. Only when all checks pass, produce the tool's result. If a logged call has the same tool name and \
the same arguments, return its logged result unchanged. Otherwise write the result the tool would give, \
consistent with its schema, the logged results and the conversation.

Output only this, with no other text before or after it:
<execution_result>
<a non-empty JSON object or a JSON array>
</execution_result>"""

_SYSTEM_COMPACT = """You are a tool. Answer the call with the tool's result.
Unknown tool: {"error_tool_call": {"code": "TOOL_NOT_AVAILABLE"}}. Bad arguments: \
{"error_tool_call": {"code": "INVALID_PARAMETERS"}}. Bad call format: \
{"error_tool_call": {"code": "INVALID_TOOL_CALL_FORMAT"}}.
If a logged call matches name and arguments, repeat its result.
Output only:
<execution_result>
<JSON>
</execution_result>"""


def _dump(value: Any, compact: bool) -> str:
    if compact:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def _function(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return schema.get("function", schema)


def find_tool(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The function schema named ``name`` among OpenAI tool schemas (or bare function schemas), or None."""
    return next((_function(t) for t in tools if _function(t).get("name") == name), None)


def logged_tool_calls(reference_messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any, str]]:
    """(tool name, arguments, result) for every call of a reference conversation, in order.

    A tool message is matched to its call by ``tool_call_id``; without ids, tool messages answer the
    calls of the preceding assistant message in order.
    """
    triples: list[tuple[str, Any, str]] = []
    pending: list[tuple[str | None, str, Any]] = []
    for msg in reference_messages:
        role = msg.get("role")
        if role == "assistant":
            pending = []
            for call in msg.get("tool_calls") or []:
                fn = _function(call)
                pending.append((call.get("id"), fn.get("name", ""), fn.get("arguments", {})))
        elif role == "tool" and pending:
            cid = msg.get("tool_call_id")
            idx = next((i for i, p in enumerate(pending) if cid is not None and p[0] == cid), 0)
            _, name, args = pending.pop(idx)
            content = msg.get("content")
            triples.append((name, args, content if isinstance(content, str) else _dump(content, False)))
    return triples


def serialize_history(messages: Sequence[Mapping[str, Any]]) -> str:
    """``User: ...`` / ``Assistant: ...`` (think and inline <tool_call> JSON) / ``Tool[name]: ...``;
    system messages are skipped."""
    lines: list[str] = []
    for msg in messages:
        role = msg.get("role")
        content = msg.get("content")
        content = content if isinstance(content, str) else ("" if content is None else _dump(content, False))
        if role == "user":
            lines.append(f"User: {content}")
        elif role == "assistant":
            calls = "".join(
                "\n<tool_call>\n"
                + _dump({"name": _function(c).get("name"), "arguments": _function(c).get("arguments")}, False)
                + "\n</tool_call>"
                for c in msg.get("tool_calls") or []
            )
            lines.append(f"Assistant: {content}{calls}")
        elif role == "tool":
            lines.append(f"Tool[{msg.get('name', '')}]: {content}")
    return "\n".join(lines)


def build_simulator_messages(
    *,
    tools: Sequence[Mapping[str, Any]],
    history: Sequence[Mapping[str, Any]],
    caller_text: str,
    call_name: str,
    call_arguments: Any,
    reference_messages: Sequence[Mapping[str, Any]] = (),
    options: SimulatorPromptOptions = SimulatorPromptOptions(),
) -> list[dict[str, str]]:
    """The REHEARSE prompt as [system, user] chat messages.

    ``history`` is the episode's messages *before* the current assistant message (the reference passes
    ``messages[:-1]``); ``caller_text`` is that assistant message's raw text, think included.
    """
    if not isinstance(call_name, str):
        raise ValueError(f"call_name must be a string, got {type(call_name).__name__}")
    compact = options.compact
    schema = find_tool(tools, call_name)
    input_schema = (schema or {}).get("parameters", UNAVAILABLE)
    examples = logged_tool_calls(reference_messages) if options.few_shot else []
    sections: list[str] = []
    if compact:
        keys = ("name", "description", "parameters") if options.tool_descriptions else ("name", "parameters")
        tool_lines = "\n".join(
            _dump({k: _function(t).get(k, {} if k == "parameters" else "") for k in keys}, True) for t in tools
        )
        sections.append(f"Tools:\n{tool_lines}")
        # Each logged call and the call to answer sit on lines of their own, written the same way,
        # and each logged result is a line of its own: a matching call's result is then a copy of
        # whole lines that tokenise exactly as the expected output does (easy for tiny models).
        if options.few_shot:
            shots = "\n".join(f"{n}({_dump(a, True)})\n{r}" for n, a, r in examples) or UNAVAILABLE
            sections.append(f"Logged calls:\n{shots}")
        sections.append(f"History:\n{serialize_history(history)}")
        sections.append(f"Latest assistant message:\n{caller_text}")
        sections.append(f"Call:\n{call_name}({_dump(call_arguments, True)})")
    else:
        tools_json = json.dumps(list(tools), ensure_ascii=False, indent=0)
        sections.append(f"Candidate tools (the only tools available in this task):\n{tools_json}")
        if options.few_shot:
            if examples:
                shots = "\n\n".join(
                    f"Tool name:\n{n}\nTool arguments:\n{_dump(a, False)}\nTool execution result:\n{r}"
                    for n, a, r in examples
                )
                sections.append(f"Logged tool calls and their real results:\n{shots}")
            else:
                sections.append(f"Logged tool calls and their real results: {UNAVAILABLE}")
        sections.append(f"Conversation so far:\n{serialize_history(history)}")
        sections.append(f"The assistant's latest raw message:\n{caller_text}")
        schema_text = input_schema if isinstance(input_schema, str) else _dump(input_schema, False)
        sections.append(
            f"Call to answer:\n- name: {call_name}\n- input schema (JSON Schema):\n{schema_text}\n"
            f"- arguments (JSON, parsed from the assistant's tool_call):\n"
            f"{_dump(call_arguments, False)}"
        )
    user = "\n\n".join(sections)
    if options.append_think:
        user += "\n\n/think"
    return [
        {"role": "system", "content": _SYSTEM_COMPACT if compact else _SYSTEM_FULL},
        {"role": "user", "content": user},
    ]
