"""The user's side of a live tau2 episode: tools the user runs on its own phone (telecom), and the scripted user
that follows a task's known user actions.

How tau2's orchestrator routes a user's tool call (``tau2/orchestrator/orchestrator.py``, fact, not code): the
call runs on the user's toolkit, its result goes back to the user only, and the agent never sees either; tau2's
evaluator replays every state-changing call of the trajectory, the user's included, so the phone's final state
decides most telecom rewards. Here the same: ``run_user_calls`` executes the calls in the episode's ``Tau2Env``
with ``requestor="user"``, appends them to the user's view (its own turn, then the tool results) and to the
trajectory tau2 grades (a user message with ``tool_calls``, tool messages with ``"requestor": "user"``), and not
to the agent's view. A user turn is either tool calls or text for the agent; text beside calls is not sent.

``ScriptedUser`` (``tau2.user="scripted"``): the opening (reason for the call and known info); then, whenever it
has the turn, the next of the task's user actions whose preceding agent actions (in the task's action list) the
agent has already performed, one call per turn, then a message that it did so; it ends the dialogue (tau2's stop
token) when it has reported everything it did and no user action is left. It answers no questions, so it measures
an agent's actions and not its conversation.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Sequence


def task_actions(task: Any) -> list[Any]:
    crit = getattr(task, "evaluation_criteria", None)
    return list(crit.actions or []) if crit is not None else []


def _same_call(a: Any, name: str, args: dict[str, Any]) -> bool:
    return a.name == name and dict(a.arguments) == dict(args)


def performed(trajectory: Sequence[dict[str, Any]], requestor: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of every tool call ``requestor`` made in a graded trajectory, in order."""
    role = "assistant" if requestor == "assistant" else "user"
    out = []
    for m in trajectory:
        if m.get("role") == role:
            for c in m.get("tool_calls") or []:
                out.append((c["function"]["name"], c["function"]["arguments"]))
    return out


def run_user_calls(env, user_view: list[dict], trajectory: list[dict], msg: dict, calls) -> list[str]:
    """Executes a user turn's ``calls`` (``[(name, arguments)]``; ``msg`` the parsed turn with numbered
    ``tool_calls``) on the user's toolkit; returns the results' contents (see the module docstring)."""
    user_view.append({"role": "assistant", "content": msg.get("content") or "", "tool_calls": msg["tool_calls"]})
    trajectory.append({"role": "user", "content": "", "tool_calls": copy.deepcopy(msg["tool_calls"])})
    results = []
    for (name, args), tc in zip(calls, msg["tool_calls"]):
        res = env.execute(name, copy.deepcopy(args), requestor="user")
        tool = {"role": "tool", "name": name, "tool_call_id": tc["id"], "content": res.content, "error": res.error}
        user_view.append(dict(tool))
        trajectory.append(dict(tool, requestor="user"))
        results.append(res.content)
    return results


class ScriptedUser:
    """The scripted user of one episode (see the module docstring)."""

    def __init__(self, task: Any, opening: str, stop_token: str):
        self.actions = task_actions(task)
        self.opening, self.stop_token = opening, stop_token
        self.said_opening = False
        self.unreported: list[str] = []  # results of calls not yet told to the agent

    def _done(self, k: int, calls: Sequence[tuple[str, dict[str, Any]]]) -> bool:
        """Whether action ``k`` is done: ``calls`` (its requestor's, in order) hold as many copies of it as the
        actions up to ``k`` do (a task may reboot the phone twice)."""
        a = self.actions[k]
        wanted = sum(b.requestor == a.requestor and _same_call(a, b.name, b.arguments) for b in self.actions[: k + 1])
        return sum(_same_call(a, n, args) for n, args in calls) >= wanted

    def _next_ready(self, trajectory: Sequence[dict[str, Any]]) -> Any | None:
        """The first user action not yet done, when the agent actions before it are done."""
        done_user = performed(trajectory, "user")
        done_agent = performed(trajectory, "assistant")
        for k, a in enumerate(self.actions):
            if a.requestor != "user" or self._done(k, done_user):
                continue
            ready = all(self._done(i, done_agent) for i in range(k) if self.actions[i].requestor != "user")
            return a if ready else None  # later user actions wait behind it
        return None

    def pending(self, trajectory: Sequence[dict[str, Any]]) -> bool:
        done_user = performed(trajectory, "user")
        return any(a.requestor == "user" and not self._done(k, done_user) for k, a in enumerate(self.actions))

    def turn(self, trajectory: Sequence[dict[str, Any]], last_results: Sequence[str] = ()) -> str:
        """The user's next turn as Qwen3 text: a ``<tool_call>`` block, a message, or the stop token."""
        self.unreported += list(last_results)
        if not self.said_opening:
            self.said_opening = True
            return self.opening
        action = self._next_ready(trajectory)
        if action is not None:
            block = json.dumps({"name": action.name, "arguments": dict(action.arguments)}, ensure_ascii=False)
            return f"<tool_call>\n{block}\n</tool_call>"
        if self.unreported:
            done, self.unreported = self.unreported, []
            return "I did that on my phone. It shows: " + " | ".join(r.strip()[:300] for r in done)
        if self.pending(trajectory):
            return "What should I do next?"
        return self.stop_token
