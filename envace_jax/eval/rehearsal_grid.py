"""The grid of a test-time rehearsal sweep: one summary row per setting (N, mode), and the sweep over them.

Split from ``eval.rehearsal`` (which re-exports these names): the rows are plain statistics of finished runs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

from envace_jax.eval.config import REHEARSAL_MODES as MODES
from envace_jax.eval.config import RehearsalConfig
from envace_jax.eval.results import is_success, mean_ci, wilson_ci


def summarize_run(run) -> dict[str, Any]:
    """The summary row of one setting's ``eval.rehearsal.RehearsalRun``."""
    scores = run.scores
    wins = sum(is_success(s) for s in scores)
    n = max(1, len(scores))
    mean, ci = (sum(scores) / len(scores) if scores else float("nan")), mean_ci(scores)
    return {
        "mode": run.config.mode,
        "n": run.config.n,
        "rehearser": run.config.rehearser,
        "memory": run.config.memory,
        "place_memory": run.config.place_memory,
        "tasks": len(scores),
        "score": mean,
        "score_ci95": ci,
        "success": wins / n,
        "success_ci95": wilson_ci(wins, len(scores)),
        "extra_generated_tokens": sum(o.generated_tokens for o in run.rehearsals) / n,
        "extra_prompt_tokens": sum(o.prompt_tokens for o in run.rehearsals) / n,
        "memory_chars": sum(len(o.memory) for o in run.rehearsals) / n,
        "memory_placed": sum(bool(o.memory) for o in run.rehearsals) / n,
    }


@dataclasses.dataclass
class SweepResult:
    rows: list[dict[str, Any]]

    def to_json(self) -> str:
        return json.dumps({"rows": self.rows}, indent=2)

    def to_markdown(self) -> str:
        lines = [
            "| mode | N | memory placed | tasks | score (95% CI) | success (95% CI) | extra gen tokens/task | "
            "extra prompt tokens/task | memory chars |",
            "|---|---:|---|---:|---|---|---:|---:|---:|",
        ]
        for r in self.rows:
            placed = "-" if r["n"] == 0 else f"{r.get('place_memory', 'always')}: {r.get('memory_placed', 0):.0%}"
            lines.append(
                f"| {r['mode']} | {r['n']} | {placed} | {r['tasks']} | {r['score']:.3f} "
                f"[{r['score_ci95'][0]:.3f}, {r['score_ci95'][1]:.3f}] | {r['success']:.3f} "
                f"[{r['success_ci95'][0]:.3f}, {r['success_ci95'][1]:.3f}] | "
                f"{r['extra_generated_tokens']:.1f} | {r['extra_prompt_tokens']:.1f} | {r['memory_chars']:.0f} |"
            )
        return "\n".join(lines) + "\n"


def rehearsal_sweep(
    run: Callable[[RehearsalConfig], Any],
    base: RehearsalConfig = RehearsalConfig(),
    ns: Sequence[int] = (0, 1, 2, 4),
    modes: Sequence[str] = MODES,
) -> SweepResult:
    """Score versus N and versus extra tokens: ``run(cfg)`` executes one setting (typically
    ``TestTimeRehearsal(cfg, ...).run(records)``). N = 0 does not depend on the mode: it runs once and
    is reported under every mode."""
    rows: list[dict[str, Any]] = []
    zero: dict[str, Any] | None = None
    for mode in modes:
        for n in ns:
            if n == 0 and zero is not None:
                rows.append(dict(zero, mode=mode))
                continue
            row = summarize_run(run(dataclasses.replace(base, mode=mode, n=n)))
            row["mode"] = mode
            if n == 0:
                zero = row
            rows.append(row)
    return SweepResult(rows)
