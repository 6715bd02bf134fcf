"""Checklist-judge prompt text, message serialization and verdict parsing.

Host-side only. The section layout follows the reference's ``get_input_prompt_v2`` and
``get_messages_str_v2`` (spec section 4.1); the wording is ours. Both the HTTP judge and the
local-model judge send exactly the prompt built here, so a verdict from either is comparable.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence


VERDICT_STRING_FIELDS = (
    "high_level_understanding_of_the_question",
    "analysis_of_if_focus_on",
    "analysis_of_pass_condition",
    "analysis_of_failure_examples",
)

# The OpenAI ``response_format`` the reference sends; a strict schema makes vLLM/SGLang
# constrain decoding so that ``answer`` is always a JSON boolean.
VERDICT_RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "evaluation_verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                **{f: {"type": "string"} for f in VERDICT_STRING_FIELDS},
                "answer": {"type": "boolean"},
            },
            "required": [*VERDICT_STRING_FIELDS, "answer"],
            "additionalProperties": False,
        },
    },
}

_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def split_think(content: str | None) -> tuple[str, str | None]:
    """Returns (thinking, user_visible_reply) of an assistant content string.

    Without a ``<think>`` block the reference counts the whole content as thinking and the
    reply as absent; an unclosed ``<think>`` likewise is all thinking.
    """
    text = content or ""
    end = text.find("</think>")
    if end < 0:
        return text.replace("<think>", "", 1).strip(), None
    start = text.find("<think>")
    thinking = text[start + len("<think>") : end] if 0 <= start < end else text[:end]
    return thinking.strip(), text[end + len("</think>") :].strip()


def user_visible_reply(content: str | None) -> str:
    """The text after ``</think>``, or all of it when there is no think block (rule-judge view)."""
    text = content or ""
    end = text.find("</think>")
    return text if end < 0 else text[end + len("</think>") :]


def _tool_calls_json(tool_calls: Any) -> str:
    if not tool_calls:
        return "None"
    return json.dumps(tool_calls, ensure_ascii=False)


def serialize_messages(messages: Sequence[Mapping[str, Any]], *, first_turn: int = 1) -> str:
    """Renders messages the way the judge reads them.

    A user message opens ``# Turn: t`` (counted from ``first_turn``); assistant messages are
    numbered ``## Step: s`` from 1 within their turn, so the current section can continue the
    numbering of the previous one.
    """
    blocks: list[str] = []
    turn = first_turn - 1
    step = 0
    for m in messages:
        role = m.get("role")
        if role == "user":
            turn += 1
            step = 0
            blocks.append(f"# Turn: {turn}\nRole: user\ncontent: {m.get('content') or ''}")
        elif role == "assistant":
            step += 1
            thinking, reply = split_think(m.get("content"))
            blocks.append(
                f"## Step: {step}\nRole: assistant\ncontent.thinking: {thinking}\n"
                f"content.user_visible_reply: {reply if reply else 'None'}\n"
                f"tool_call: {_tool_calls_json(m.get('tool_calls'))}"
            )
        elif role == "tool":
            blocks.append(f"Role: tool\ncontent: {m.get('content') or ''}")
        elif role == "system":
            blocks.append(f"Role: system\ncontent: {m.get('content') or ''}")
        else:
            raise ValueError(f"message has unknown role {role!r}: {dict(m)!r}"[:300])
    return "\n\n".join(blocks)


def build_judge_prompt(
    item: Mapping[str, Any], previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> str:
    """The single user message a judge model receives for one (item, step) pair."""
    snippets = [e.get("snippet", e) if isinstance(e, Mapping) else e for e in item.get("evidence") or []]
    n_prev_turns = sum(1 for m in previous if m.get("role") == "user")
    prev_text = serialize_messages(previous) if previous else "None"
    cur_text = serialize_messages(current, first_turn=n_prev_turns + 1)
    return f"""# Role
You are a precise checklist evaluator. You read one checklist item and a slice of a conversation
between a user, an assistant that may call tools, and those tools, and you decide whether the
assistant satisfied that single item.

# Objective
Judge the current messages against the criteria below and reply with one strict JSON object and
nothing else.

# Criteria
**Question:** {item.get("question", "")}
**Focus on:** {item.get("focus_on", "")}
**Pass condition:** {item.get("pass_condition", "")}
**Failure examples:**
{json.dumps(list(item.get("failure_examples") or []), ensure_ascii=False, indent=2)}
**Reference snippet:**
{json.dumps(snippets, ensure_ascii=False, indent=2)}

# Previous Messages
{prev_text}

# Current Messages to Evaluate
{cur_text}

# Special rule of tool call
A tool call counts only when it appears in the assistant's tool_call field; a call that is only
written inside the thinking text was never made. When a tool response reports an error, the
latest assistant step's tool calls count as failed.

# Evaluation process
1. high_level_understanding_of_the_question: restate what the item checks, in your own words.
2. analysis_of_if_focus_on: find the part of the current messages named by "Focus on" and say
   whether it is present.
3. analysis_of_pass_condition: check the pass condition against that part, point by point.
4. analysis_of_failure_examples: check whether any failure example, or the same pattern, occurs.
5. answer: true only if the focus-on part is present, the pass condition is fully met and no
   failure pattern is triggered; otherwise false.

# Output format
{{"high_level_understanding_of_the_question": "...", "analysis_of_if_focus_on": "...",
"analysis_of_pass_condition": "...", "analysis_of_failure_examples": "...", "answer": true or false}}
"""


class MalformedVerdict(ValueError):
    """The judge's text is not a usable verdict (counted as an API failure after retries)."""


def parse_verdict_text(text: str | None) -> dict[str, Any]:
    """Extracts the verdict JSON object from a judge completion.

    Tolerates a leading ``<think>`` block and a Markdown code fence, since an unconstrained local
    model often adds them. Only ``answer`` is required (a JSON boolean); a string "true" is not
    accepted because strict decoding never produces one and guessing would hide a broken judge.
    """
    if text is None:
        raise MalformedVerdict("judge returned no text")
    body = text
    end = body.rfind("</think>")
    if end >= 0:
        body = body[end + len("</think>") :]
    start, stop = body.find("{"), body.rfind("}")
    if start < 0 or stop <= start:
        raise MalformedVerdict(f"no JSON object in judge text: {text[:200]!r}")
    try:
        obj = json.loads(body[start : stop + 1])
    except json.JSONDecodeError as e:
        raise MalformedVerdict(f"judge JSON does not parse ({e}): {text[:200]!r}") from None
    if not isinstance(obj, dict):
        raise MalformedVerdict(f"judge JSON is not an object: {text[:200]!r}")
    if "answer" not in obj:
        raise MalformedVerdict(f"judge JSON has no 'answer' field: {text[:200]!r}")
    if not isinstance(obj["answer"], bool):
        raise MalformedVerdict(f"judge 'answer' is not a boolean: {obj['answer']!r}")
    return obj
