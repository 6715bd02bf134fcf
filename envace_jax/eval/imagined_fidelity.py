"""What the rehearsals predicted against what the tools did (issue 36, test-time rehearsal).

Each imagined episode of a test-time rehearsal is a sequence of calls answered by REHEARSE. To judge those
answers, the calls are replayed in the same order on a fresh real world of the task (the state each
imagined answer should have reflected), and every imagined response is classed against the real one:

- ``exact``: the same payload (JSON compared after parsing; text otherwise);
- ``same_outcome``: both succeed or both fail, with another payload (a wrong balance, another error text);
- ``wrong_outcome``: one fails and the other does not (an imagined refusal the tool would have accepted, or
  an imagined success of a call the tool refuses): the kind of prediction a memory acts on.

``fidelity_split(run, tasks, make_env)`` counts these over the rehearsals whose memory reached the real
attempt ("used") and over all of them, and, per tool, what the used steps predicted (success or refusal)
against what the tool did (``OUTCOMES``). No real call of the replay reaches the committed episode: each
replay builds its own world.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Sequence

from envace_jax.chat.simulator import ERROR_KEY, is_failed_result

KINDS = ("exact", "same_outcome", "wrong_outcome")
# imagined outcome -> real outcome of one step; "ok" is a response the tool did not fail
OUTCOMES = ("ok->ok", "ok->refused", "refused->ok", "refused->refused")


@dataclasses.dataclass(frozen=True)
class StepVerdict:
    """One imagined step judged against the real tool: its tool, the two outcomes and its class (``KINDS``)."""

    name: str
    imagined_error: bool
    real_error: bool
    kind: str
    imagined_reason: str = "ok"  # ``reason`` of each response
    real_reason: str = "ok"

    @property
    def outcome(self) -> str:
        return f"{'refused' if self.imagined_error else 'ok'}->{'refused' if self.real_error else 'ok'}"


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return " ".join(str(text).split())


def classify(imagined: str, real: str, real_error: bool) -> str:
    """One of ``KINDS`` for an imagined response against the real tool's response to the same call."""
    if _payload(imagined) == _payload(real):
        return "exact"
    return "same_outcome" if is_failed_result(imagined) == real_error else "wrong_outcome"


def reason(text: str, failed: bool) -> str:
    """Why a response failed: its message with quoted names and numbers masked, so that the same rule broken on
    other accounts or amounts reads the same ("insufficient funds in '…'; fee of # charged"); "ok" for a success."""
    if not failed:
        return "ok"
    payload = _payload(text)
    if isinstance(payload, dict) and "error" in payload:
        message = str(payload["error"])
    elif isinstance(payload, dict) and ERROR_KEY in payload:
        verdict = payload[ERROR_KEY]
        message = f"{ERROR_KEY}: {verdict.get('code', verdict) if isinstance(verdict, dict) else verdict}"
    else:
        message = str(payload)
    message = re.sub(r"\d+(?:\.\d+)?", "#", re.sub(r"'[^']*'", "'…'", message))
    return message if len(message) <= 60 else message[:59] + "…"


def replay_steps(task: Mapping[str, Any], trace, make_env: Callable[[Mapping[str, Any]], Any]) -> list[StepVerdict]:
    """The verdict on each imagined step of one imagined episode (``eval.rehearsal.RehearsalTrace``), its calls
    replayed in order on a fresh real world of ``task``. Steps a real read answered (``StepTrace.real``) are
    replayed too, to keep the world in step, but not judged: nothing was imagined there."""
    env = make_env(task)
    out = []
    for step in trace.steps:
        real = env.execute(step.name, step.arguments if isinstance(step.arguments, Mapping) else {})
        if not getattr(step, "real", False):
            kind, imagined_error = classify(step.response, real.content, real.error), is_failed_result(step.response)
            out.append(
                StepVerdict(
                    str(step.name),
                    imagined_error,
                    bool(real.error),
                    kind,
                    reason(step.response, imagined_error),
                    reason(real.content, bool(real.error)),
                )
            )
    return out


def replay_trace(task: Mapping[str, Any], trace, make_env: Callable[[Mapping[str, Any]], Any]) -> list[str]:
    """The class (``KINDS``) of each imagined step of one imagined episode (see ``replay_steps``)."""
    return [v.kind for v in replay_steps(task, trace, make_env)]


def fidelity_split(run, tasks: Sequence[Mapping[str, Any]], make_env) -> dict[str, Any]:
    """Counts of ``KINDS`` over the imagined steps of ``run`` (an ``eval.rehearsal.RehearsalRun``): ``used``
    (tasks whose memory was placed), ``all``, and the shares of each among ``used``; ``by_tool``: per tool,
    the used steps' ``OUTCOMES`` and how many of them were ``exact``."""
    by_uid = {str(t["uid"]): t for t in tasks}
    used: collections.Counter = collections.Counter()
    every: collections.Counter = collections.Counter()
    by_tool: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    for reh in run.rehearsals:
        task = by_uid[reh.uid]
        for trace in reh.traces:
            verdicts = replay_steps(task, trace, make_env)
            kinds = collections.Counter(v.kind for v in verdicts)
            every.update(kinds)
            if reh.memory:
                used.update(kinds)
                for v in verdicts:
                    by_tool[v.name][v.outcome] += 1
                    by_tool[v.name]["exact"] += v.kind == "exact"
                    if v.imagined_error or v.real_error:
                        reasons[(v.name, v.imagined_reason, v.real_reason)] += 1
    n_used = sum(used.values())
    return {
        "used": {k: used[k] for k in KINDS},
        "all": {k: every[k] for k in KINDS},
        "used_share": {k: (used[k] / n_used if n_used else float("nan")) for k in KINDS},
        "tasks_used": sum(bool(r.memory) for r in run.rehearsals),
        "by_tool": {name: {k: c[k] for k in OUTCOMES + ("exact",)} for name, c in sorted(by_tool.items())},
        # (tool, imagined reason, real reason, count) of the used steps where either side failed, most first
        "reasons": [[*key, n] for key, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))],
    }


def reason_table(reasons: Sequence[Sequence[Any]], top: int = 10) -> str:
    """Markdown: the ``top`` most frequent (tool, imagined reason, real reason) of the used steps where the
    imagined response or the tool's failed (``fidelity_split``'s ``reasons``)."""
    lines = ["| tool | imagined | tool's | steps |", "|---|---|---|---:|"]
    for name, imagined, real, n in reasons[:top]:
        lines.append(f"| {name} | {imagined.replace('|', '/')} | {real.replace('|', '/')} | {n} |")
    return "\n".join(lines) + "\n"


def outcome_section(fidelity: Mapping[str, Any], top: int = 10) -> str:
    """Markdown of a ``fidelity_split``: the per-tool table, then the ``top`` most frequent failure reasons."""
    return (
        outcome_table(fidelity["by_tool"])
        + "\nThe most frequent failures among them, imagined or real (names and numbers masked):\n\n"
        + reason_table(fidelity["reasons"], top)
    )


def outcome_table(by_tool: Mapping[str, Mapping[str, int]]) -> str:
    """Markdown: per tool, what the used imagined steps predicted against what the tool did."""
    lines = [
        "| tool | steps | predicted ok, tool ok | predicted ok, tool refused | predicted refusal, tool ok "
        "| predicted refusal, tool refused | exact payload |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in by_tool.items():
        cells = " | ".join(str(c[k]) for k in OUTCOMES)
        lines.append(f"| {name} | {sum(c[k] for k in OUTCOMES)} | {cells} | {c['exact']} |")
    return "\n".join(lines) + "\n"
