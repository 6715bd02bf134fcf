"""How much RL can sharpen: greedy success and pass@k per task type and branch kind, against the real tools.

RL on a checklist reward raises the probability of behaviours the policy already samples; it does not invent
ones it never emits. pass@k at the training temperature measures that support: a task type whose pass@16 is
far above its greedy success is where RL has leverage; one whose pass@16 is near 0 is out of RL's reach
until more demonstrations put the behaviour into the support.

pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
arXiv 2107.03374): from ``n`` samples of a task with ``c`` successes, ``1 - C(n - c, k) / C(n, k)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from envace_jax.data.demo_tasks import BRANCHES


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` (``c`` correct)
    is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclasses.dataclass
class LeverageTable:
    """Per group (``all``, each branch kind, each task type): tasks, greedy success, mean pass@k."""

    ks: tuple[int, ...]
    temperature: float
    samples: int
    rows: dict[str, dict[str, float]]

    def to_markdown(self) -> str:
        head = ["group", "tasks", "greedy"] + [f"pass@{k} (T={self.temperature:g})" for k in self.ks]
        lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for name, r in self.rows.items():
            lines.append(
                f"| {name} | {int(r['tasks'])} | {r['greedy']:.3f} | "
                + " | ".join(f"{r[f'pass@{k}']:.3f}" for k in self.ks)
                + " |"
            )
        return "\n".join(lines) + "\n"


def leverage_table(
    tasks: Sequence[Mapping[str, Any]],
    greedy: Sequence[bool],
    sampled: Sequence[Sequence[bool]],
    ks: Sequence[int],
    temperature: float,
) -> LeverageTable:
    """``greedy[i]``: task i's greedy success; ``sampled[i]``: its successes over the sampled episodes."""
    if not (len(tasks) == len(greedy) == len(sampled)):
        raise ValueError(f"leverage_table: {len(tasks)} tasks, {len(greedy)} greedy results, {len(sampled)} samples")
    n = len(sampled[0]) if sampled else 0
    if any(len(s) != n for s in sampled):
        raise ValueError("leverage_table: every task needs the same number of samples")
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"leverage_table: every k must be in [1, {n}], got {list(ks)}")
    groups: dict[str, list[int]] = {"all": list(range(len(tasks)))}
    for b in BRANCHES:
        groups[f"branch {b}"] = [i for i, t in enumerate(tasks) if t.get("branch") == b]
    for ttype in sorted({str(t.get("task_type", "?")) for t in tasks}):
        groups[ttype] = [i for i, t in enumerate(tasks) if str(t.get("task_type", "?")) == ttype]
    rows = {}
    for name, idx in groups.items():
        if not idx:
            continue
        row = {"tasks": float(len(idx)), "greedy": sum(bool(greedy[i]) for i in idx) / len(idx)}
        for k in ks:
            row[f"pass@{k}"] = sum(pass_at_k(n, sum(map(bool, sampled[i])), k) for i in idx) / len(idx)
        rows[name] = row
    return LeverageTable(tuple(ks), temperature, n, rows)


def measure_leverage(
    run_real: Callable[[Sequence[Mapping[str, Any]], float, int], list[bool]],
    tasks: Sequence[Mapping[str, Any]],
    *,
    ks: Sequence[int] = (1, 4, 16),
    temperature: float,
    progress: Callable[[int], None] | None = None,
) -> LeverageTable:
    """``run_real(tasks, temperature, seed)`` plays each task once against the real tools and returns its
    successes (temperature 0 = greedy). Samples ``max(ks)`` episodes per task, each repeat with its own seed."""
    greedy = run_real(tasks, 0.0, 0)
    n = max(ks)
    per_repeat = []
    for j in range(n):
        per_repeat.append(run_real(tasks, temperature, 1 + j))
        if progress:
            progress(1)
    sampled = [[per_repeat[j][i] for j in range(n)] for i in range(len(tasks))]
    return leverage_table(tasks, greedy, sampled, ks, temperature)
