"""What the rehearsals predicted against what the tools did (issue 36, test-time rehearsal).

Each imagined episode of a test-time rehearsal is a sequence of calls answered by REHEARSE. To judge those
answers, the calls are replayed in the same order on a fresh real world of the task (the state each
imagined answer should have reflected), and every imagined response is classed against the real one:

- ``exact``: the same payload (JSON compared after parsing; text otherwise);
- ``same_outcome``: both succeed or both fail, with another payload (a wrong balance, another error text);
- ``wrong_outcome``: one fails and the other does not (an imagined refusal the tool would have accepted, or
  an imagined success of a call the tool refuses): the kind of prediction a memory acts on.

``fidelity_split(run, tasks, make_env)`` counts these over the rehearsals whose memory reached the real
attempt ("used") and over all of them. No real call of the replay reaches the committed episode: each
replay builds its own world.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable, Mapping, Sequence

from envace_jax.chat.simulator import is_failed_result

KINDS = ("exact", "same_outcome", "wrong_outcome")


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


def replay_trace(task: Mapping[str, Any], trace, make_env: Callable[[Mapping[str, Any]], Any]) -> list[str]:
    """The class of each imagined step of one imagined episode (``eval.rehearsal.RehearsalTrace``), its calls
    replayed in order on a fresh real world of ``task``. Steps a real read answered (``StepTrace.real``) are
    replayed too, to keep the world in step, but not classed: nothing was imagined there."""
    env = make_env(task)
    out = []
    for step in trace.steps:
        real = env.execute(step.name, step.arguments if isinstance(step.arguments, Mapping) else {})
        if not getattr(step, "real", False):
            out.append(classify(step.response, real.content, real.error))
    return out


def fidelity_split(run, tasks: Sequence[Mapping[str, Any]], make_env) -> dict[str, Any]:
    """Counts of ``KINDS`` over the imagined steps of ``run`` (an ``eval.rehearsal.RehearsalRun``): ``used``
    (tasks whose memory was placed), ``all``, and the shares of each among ``used``."""
    by_uid = {str(t["uid"]): t for t in tasks}
    used: collections.Counter = collections.Counter()
    every: collections.Counter = collections.Counter()
    for reh in run.rehearsals:
        task = by_uid[reh.uid]
        for trace in reh.traces:
            kinds = collections.Counter(replay_trace(task, trace, make_env))
            every.update(kinds)
            if reh.memory:
                used.update(kinds)
    n_used = sum(used.values())
    return {
        "used": {k: used[k] for k in KINDS},
        "all": {k: every[k] for k in KINDS},
        "used_share": {k: (used[k] / n_used if n_used else float("nan")) for k in KINDS},
        "tasks_used": sum(bool(r.memory) for r in run.rehearsals),
    }
