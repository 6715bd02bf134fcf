"""Rehearsal-memory text and rows of the pretraining corpus (``demo.pretrain``; ``demo.wire_memory`` builds on it).

A memory in a row's system prompt is made by the test-time code's own template
(``eval.rehearsal.build_template_memory``), from imagined episodes of the model at that step
(``rehearsal_memories``) or from a reference conversation seen as one rehearsal (``reference_trace``: the shape
of a memory's text, for the tokenizer's training texts and for rows whose memory holds the right plan).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from envace_jax.demo import data as demo_data
from envace_jax.rl.types import Generation


def rehearsal_memories(model, codec, tasks: Sequence[Mapping[str, Any]], cfg, demo_cfg) -> dict[str, str]:
    """uid -> a rehearsal memory built by the test-time code (``TestTimeRehearsal.rehearse``) with ``model``;
    ``cfg`` is the ``PretrainConfig`` (its ``memory_*`` fields and seed).

    Each task gets N = 1 or 2 imagined episodes, parallel or sequential (alternating by task), sampled at
    ``memory_temperature``; REHEARSE sees no logged result (``grounding="none"``), as at test time.
    """
    from envace_jax.demo import stages
    from envace_jax.eval.rehearsal import RehearsalConfig, TestTimeRehearsal

    client = stages.make_client(model, codec)
    rollout_cfg = stages.rollout_config(demo_cfg, "real", greedy=True)  # the committed run's, as at test time
    out: dict[str, str] = {}
    plans = {}
    for i, t in enumerate(tasks):
        plans.setdefault((1 + i % 2, ("parallel", "sequential")[(i // 2) % 2]), []).append(t)
    for (n, mode), group in sorted(plans.items()):
        rcfg = RehearsalConfig(
            n=n, mode=mode, max_memory_chars=cfg.memory_max_chars, temperature=cfg.memory_temperature, seed=cfg.seed
        )
        ttr = TestTimeRehearsal(rcfg, rollout_cfg, codec, client, judge=None, make_env=None)
        for s in range(0, len(group), demo_cfg.eval_batch):
            chunk = [dict(t) for t in group[s : s + demo_cfg.eval_batch]]
            for t, r in zip(chunk, ttr.rehearse(chunk)):
                out[t["uid"]] = r.memory
            client.reset()
    return out


def reference_trace(task: Mapping[str, Any], index: int = 1):
    """The reference conversation seen as one rehearsal (its real responses in place of imagined ones): the
    shape of text a rehearsal memory holds, for the tokenizer's training texts."""
    from envace_jax.chat.simulator import is_failed_result
    from envace_jax.eval.rehearsal import RehearsalTrace, StepTrace

    ref = task["reference_messages"]
    answers = {m["tool_call_id"]: m["content"] for m in ref if m["role"] == "tool"}
    steps, final, turn = [], None, -1
    for m in ref:
        if m["role"] == "user":
            turn += 1
        elif m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                resp = answers[c["id"]]
                steps.append(
                    StepTrace(turn, c["function"]["name"], c["function"]["arguments"], resp, is_failed_result(resp))
                )
            if not m.get("tool_calls"):
                final = m["content"]
    return RehearsalTrace(index, steps, final, "", None)


def reference_memories(tasks: Sequence[Mapping[str, Any]], max_chars: int) -> list[str]:
    from envace_jax.eval.rehearsal import build_template_memory

    return [
        build_template_memory([reference_trace(t, k) for k in range(1, 1 + 1 + i % 2)], max_chars)
        for i, t in enumerate(tasks)
    ]


def memory_rows(
    tasks: Sequence[Mapping[str, Any]], memories: Mapping[str, str], codec, episode0: int = 0
) -> list[Generation]:
    """The ACT rows of ``tasks`` with each task's memory placed as the test-time run places it (task ``e`` is
    episode ``episode0 + e``; a task with no memory gives no row)."""
    from envace_jax.eval.rehearsal import with_memory

    rows = []
    for e, t in enumerate(tasks):
        memory = memories.get(t["uid"], "")
        if memory:
            rows += demo_data.act_rows(with_memory(t, memory), codec, episode0 + e)
    return rows
