"""Builders for small, valid CM2 checklist records used by the data and checkpoint tests."""

from __future__ import annotations

import copy
from typing import Any


def tool_schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }


def checklist_item(q: str, weight: float, focus: str = "assistant.tool_calls", **extra) -> dict[str, Any]:
    item = {
        "question": q,
        "focus_on": focus,
        "pass_condition": f"passes if {q}",
        "failure_examples": ["did something else"],
        "evidence": [{"snippet": "x", "turn": 0, "step": 0, "from": "user"}],
        "weight": weight,
        "required_for_next_turn": False,
    }
    item.update(extra)
    return item


def make_record(i: int, *, n_checklists: int = 2) -> dict[str, Any]:
    """A record with two turns, a tool call with arguments of several types, and a rule."""
    city = ["Paris", "Oslo", "Lima", "Kyiv"][i % 4]
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "weather", "arguments": {"city": city, "days": i % 5 + 1, "extra": {"u": [1, 2.5]}}},
    }
    ref = [
        {"role": "user", "content": f"Weather in {city}? #{i}"},
        {"role": "assistant", "content": "<think>look it up</think>", "tool_calls": [call]},
        {"role": "tool", "name": "weather", "tool_call_id": f"c{i}", "content": '{"temp": 12}'},
        {"role": "assistant", "content": "It is 12 degrees."},
        {"role": "user", "content": "Thanks, and tomorrow?"},
        {"role": "assistant", "content": "Same."},
    ]
    turn0 = [
        checklist_item(
            "calls weather", 0.6, rule={"type": "tool_called", "name": "weather", "arguments": {"city": city}}
        ),
        checklist_item(
            "reports temp",
            0.4,
            focus="assistant.content.user_visible_reply",
            rule={"type": "reply_contains", "values": ["12"]},
        ),
    ]
    turn1 = [checklist_item("answers", 1.0, focus="assistant.content.user_visible_reply", required_for_next_turn=True)]
    checklist = [copy.deepcopy([turn0, turn1]) for _ in range(n_checklists)]
    return {
        "uid": f"task-{i}",
        "data_source": "demo",
        "messages": [{"role": "system", "content": "You are helpful."}, ref[0]],
        "tools": [tool_schema("weather"), tool_schema("news")],
        "reference_messages": ref,
        "checklist": checklist,
        "env": {"name": "demo_weather", "state": {"seed": i}} if i % 2 == 0 else None,
    }


def make_records(n: int, **kw) -> list[dict[str, Any]]:
    return [make_record(i, **kw) for i in range(n)]
