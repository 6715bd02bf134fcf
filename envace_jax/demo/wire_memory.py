"""Rows that teach ACT to act on a rehearsal memory in the wire world (the ``wire_memory`` pretraining preset).

A policy that never met a trap's way out cannot take it, however well a rehearsal foresees the refusal
(docs/results.md, "Tasks where rehearsing can prevent a mistake": with the ``wire`` base every trap task
scores 0 at N = 0, 1 and 2). These rows show it a memory of a failed attempt and then the right plan, the
retry an agent makes after a real mistake:

* **retry rows**: a single-turn trap task of the train split, whose system prompt carries a memory, in the
  test-time template (``eval.rehearsal.build_template_memory``), of the rule-blind attempt run for real on a
  fresh world of the task (``data.wire_corpus.rule_blind_attempt``); the targets are the reference plan's ACT
  turns. Three shapes, in turn: that attempt alone; two such attempts (the two ``close_and_move`` orders);
  the attempt and then the reference plan as a second rehearsal, whose steps the memory lists as the plan that
  ran without errors (what a sequential N = 2 gives when its second rehearsal learned from the first);
* **plain rows with a memory**: single-turn ``plain`` tasks whose memory is their own reference plan, so a
  memory is no cue by itself that the task is a trap.

A trap's way out appears only after a memory that shows the rule being broken; with no memory in the prompt
the corpus still never shows one. So what rehearsal adds at test time is the memory: whether REHEARSE foresees
the refusal and the policy reads it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from envace_jax.chat.simulator import is_failed_result
from envace_jax.data import wire_corpus
from envace_jax.demo.memory_corpus import memory_rows, reference_memories, reference_trace
from envace_jax.eval.rehearsal import RehearsalTrace, StepTrace, build_template_memory
from envace_jax.rl.types import Generation


def attempt_trace(steps: Sequence[tuple[str, Mapping[str, Any], str]], reply: str, index: int) -> RehearsalTrace:
    """One attempt (``(name, arguments, response)`` steps and the final reply) as the memory's trace."""
    return RehearsalTrace(
        index, [StepTrace(0, n, dict(a), r, is_failed_result(r)) for n, a, r in steps], reply, "", None
    )


def retry_memory(task: Mapping[str, Any], shape: int, max_chars: int) -> str:
    """The memory of a trap task in one of three shapes (``shape % 3``; module doc)."""
    first = attempt_trace(*wire_corpus.rule_blind_attempt(dict(task), 0), 1)
    if shape % 3 == 0:
        traces = [first]
    elif shape % 3 == 1:
        traces = [first, attempt_trace(*wire_corpus.rule_blind_attempt(dict(task), 1), 2)]
    else:
        traces = [first, reference_trace(task, 2)]
    return build_template_memory(traces, max_chars)


def rows(
    traps: Sequence[Mapping[str, Any]],
    plain: Sequence[Mapping[str, Any]],
    codec,
    max_chars: int,
    episode0: int = 0,
) -> list[Generation]:
    """ACT rows of ``traps`` after a failed attempt's memory and of ``plain`` after their own plan's memory
    (normalized task records; the two share no uid), each memory placed as the test-time run places it."""
    memories = {t["uid"]: retry_memory(t, e, max_chars) for e, t in enumerate(traps)}
    memories |= {t["uid"]: m for t, m in zip(plain, reference_memories(plain, max_chars))}
    return memory_rows([*traps, *plain], memories, codec, episode0)
