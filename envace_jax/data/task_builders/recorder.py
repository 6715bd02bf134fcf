"""Records an oracle plan played against a real demo world: the conversation and its checklist items."""

from __future__ import annotations

import json
from typing import Any

from envace_jax.envs.demo_worlds import DemoWorld, canonical_json

ANSWER_STYLE = "Use the tools, then answer in one short sentence."


class Reject(Exception):
    """The draw cannot make a valid task (e.g. a call repeats with a new response); draw again."""


class Recorder:
    """Runs an oracle plan against the real world and records messages and checklist items."""

    def __init__(self, env: DemoWorld):
        self.env = env
        self.messages: list[dict[str, Any]] = []
        self.turns: list[list[dict[str, Any]]] = []
        self.users: list[str] = []
        self.n_calls = 0
        self.push_back = False  # a tool refused or the user's condition failed (see ``branch_of``)
        self.types: list[str] = []  # the builder of each user turn (the task type)
        self._step = 0
        self._responses: dict[str, str] = {}

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.users.append(text)
        self.turns.append([])
        self._step = 0

    def call(self, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """One assistant step holding ``calls`` (executed in order); returns the parsed payloads."""
        turn, step = len(self.turns) - 1, self._step
        tool_calls, tool_msgs, payloads = [], [], []
        for name, args in calls:
            call_id = f"call_{self.n_calls}"
            self.n_calls += 1
            result = self.env.execute(name, args)
            self.push_back |= result.error
            key = canonical_json({"arguments": args, "name": name})
            if self._responses.setdefault(key, result.content) != result.content:
                raise Reject(f"{key} would appear twice with different responses")
            tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": dict(args)}})
            tool_msgs.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result.content})
            payloads.append(json.loads(result.content))
            self.turns[turn].append(_call_item(name, args, result.content, turn, step))
        self.messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        self.messages.extend(tool_msgs)
        self._step += 1
        return payloads

    def reply(self, text: str, values: list[Any], question: str) -> None:
        turn, step = len(self.turns) - 1, self._step
        self.messages.append({"role": "assistant", "content": text})
        self.turns[turn].append(_reply_item([str(v) for v in values], question, text, turn, step))
        self._step += 1


def _args_text(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={canonical_json(v)}" for k, v in args.items())


def _call_item(name: str, args: dict[str, Any], response: str, turn: int, step: int) -> dict[str, Any]:
    call = canonical_json({"arguments": args, "name": name})
    first = next(iter(args), None)
    return {
        "question": f"Does the assistant call {name} with {_args_text(args)}?",
        "focus_on": "assistant.tool_calls",
        "pass_condition": f"A tool call named {name} has arguments {_args_text(args)} (other keys may be absent).",
        "failure_examples": [
            f"No call to {name}.",
            f"{name} is called with a different {first}."
            if first
            else f"A different tool is called instead of {name}.",
        ],
        "evidence": [
            {"snippet": call, "turn": turn, "step": step, "from": "assistant.tool_calls"},
            {"snippet": response, "turn": turn, "step": step, "from": "tool.content"},
        ],
        "weight": 1.0,
        "required_for_next_turn": True,
        "rule": {"type": "tool_called", "name": name, "arguments": dict(args)},
    }


def _reply_item(values: list[str], question: str, reply: str, turn: int, step: int) -> dict[str, Any]:
    return {
        "question": question,
        "focus_on": "assistant.content.user_visible_reply",
        "pass_condition": "The user-visible reply contains "
        + ", ".join(repr(v) for v in values)
        + " (case-insensitive).",
        "failure_examples": ["The reply states a different value.", "There is no final reply."],
        "evidence": [{"snippet": reply, "turn": turn, "step": step, "from": "assistant.content.user_visible_reply"}],
        "weight": 1.0,
        "required_for_next_turn": False,
        "rule": {"type": "reply_contains", "values": values},
    }


def normalise_weights(items: list[dict[str, Any]]) -> None:
    # Rounded so the records stay readable; the last item absorbs rounding so each turn sums to 1.
    total = sum(it["weight"] for it in items)
    for it in items[:-1]:
        it["weight"] = round(it["weight"] / total, 6)
    items[-1]["weight"] = round(1.0 - sum(it["weight"] for it in items[:-1]), 6)
