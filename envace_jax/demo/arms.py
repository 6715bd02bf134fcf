"""The demo's evaluated arms, by the names their per-task outcomes are written under
(``RUN_DIR/eval_<arm>_tasks.jsonl``), and the paired comparisons its reports make between them.

- ``make demo`` (``pipeline.run_demo``): ``before`` (the RL start: the shipped base or the SFT warm start),
  ``after`` (RL in ``rl_mode``), ``more_sft`` (more SFT for RL's wall time).
- ``make demo-compare`` (``pipeline.run_compare``): ``before``, ``after_real`` (RL against the real tools),
  ``after_simulator`` (RL, a frozen copy of the start plays the tools), ``after_noshare`` (RL, ACT and
  REHEARSE as two separately trained models), ``after_rehearsal`` (world-rehearsal RL), ``more_sft``.
- ``--rehearsal_sweep`` (``rehearsal_table``): ``n0`` (no rehearsal), ``n1`` / ``n2`` (N parallel
  rehearsals), ``n1_sequential`` / ``n2_sequential``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from envace_jax.eval import paired
from envace_jax.eval.results import nan_to_none

START, RL, MORE_SFT = "before", "after", "more_sft"
COMPARE_MODES = ("real", "simulator", "noshare", "rehearsal")
MODE_LABELS = {
    "real": "RL, real tools",
    "simulator": "RL, frozen simulator",
    "noshare": "RL, no sharing (two models)",
    "rehearsal": "RL, world rehearsal",
}


def compare_arm(mode: str) -> str:
    return f"after_{mode}"


def rehearsal_arm(n: int, mode: str) -> str:
    """``n0`` for no rehearsal (it does not depend on the mode), ``n<N>`` for parallel (EnvACE's), else
    ``n<N>_<mode>``."""
    return "n0" if n == 0 else (f"n{n}" if mode == "parallel" else f"n{n}_{mode}")


DEMO_PAIRS = [
    ("RL vs its start", RL, START),
    ("RL vs more SFT", RL, MORE_SFT),
    ("more SFT vs the start", MORE_SFT, START),
]
COMPARE_PAIRS = (
    [(f"{MODE_LABELS[m]} vs the start", compare_arm(m), START) for m in COMPARE_MODES]
    + [("more SFT vs the start", MORE_SFT, START)]
    + [
        ("world rehearsal vs real tools", compare_arm("rehearsal"), compare_arm("real")),
        ("world rehearsal vs more SFT", compare_arm("rehearsal"), MORE_SFT),
        # the paper's two ablations, each against the full method
        ("world rehearsal vs frozen simulator", compare_arm("rehearsal"), compare_arm("simulator")),
        ("world rehearsal vs no sharing", compare_arm("rehearsal"), compare_arm("noshare")),
    ]
)
REHEARSAL_PAIRS = [
    (f"N={n} {mode} vs N=0", rehearsal_arm(n, mode), "n0") for mode in ("parallel", "sequential") for n in (1, 2, 4)
]


def all_pairs() -> list[tuple[str, str, str]]:
    """Every comparison above, once (``launch/paired_stats.py`` makes those whose arms a run directory holds)."""
    out, seen = [], set()
    for label, a, b in DEMO_PAIRS + COMPARE_PAIRS + REHEARSAL_PAIRS:
        if (a, b) not in seen:
            seen.add((a, b))
            out.append((label, a, b))
    return out


def paired_section(
    arms: Mapping[str, Sequence[paired.TaskOutcome]], pairs: Sequence[tuple[str, str, str]], seed: int = 0
) -> tuple[str, list[dict]]:
    """The markdown table (with its note) of ``pairs`` among ``arms``, and the same results as dicts (for the
    summary JSON); an empty table when no pair's two arms were evaluated. The bootstrap's ``seed`` is fixed
    (0, as ``launch/paired_stats.py``'s default), not the run's, so the script reproduces the reports' rows."""
    results = paired.compare_arms(arms, pairs, seed=seed)
    if not results:
        return "", []
    text = paired.markdown_table([paired.paired_row(label, r) for label, r in results])
    return text + "\n\n" + paired.PAIRED_NOTE, [dict(r.as_dict(), label=label) for label, r in results]


def write_comparison(run_dir: str, stem: str, title: str, text: str, paired_text: str, out: dict[str, Any]) -> None:
    """``<stem>.md`` (``title``, the table ``text``, the paired table) and ``<stem>.json`` (``out``) in ``run_dir``;
    ``out["table"]`` becomes the two tables as printed."""
    with open(os.path.join(run_dir, f"{stem}.md"), "w") as f:
        f.write(
            f"# {title}\n\n"
            + text
            + "\n"
            + (f"\nPaired comparisons on the same test tasks (A - B):\n\n{paired_text}\n" if paired_text else "")
        )
    with open(os.path.join(run_dir, f"{stem}.json"), "w") as f:
        json.dump(nan_to_none(out), f, indent=1, allow_nan=False)
    out["table"] = text + ("\n\n" + paired_text if paired_text else "")
