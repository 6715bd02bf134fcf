"""Paired statistics of a demo run's arms, recomputed from its per-task outcomes (``eval_<arm>_tasks.jsonl``).

    python launch/paired_stats.py runs/demo                          # the table of report.md
    python launch/paired_stats.py runs/demo runs/demo_seed{1,2,3,4}  # per seed, and pooled over the seeds
    python launch/paired_stats.py runs/demo --pair=after:more_sft    # chosen comparisons (arm A:arm B)
    python launch/paired_stats.py runs/demo-compare --json=paired.json

Without ``--pair``, every comparison the demo's reports make (``envace_jax/demo/arms.py``) whose two arms a
run directory holds. With several run directories (one per seed), each comparison gets a row per directory
and a pooled row: the mean of the per-seed differences, a bootstrap over tasks within each seed, and the
exact McNemar test on the summed discordant pairs (``envace_jax/eval/paired.py`` says why).
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

_PAIRS = flags.DEFINE_multi_string("pair", [], "a comparison A:B of two arm names (repeatable); default: the demo's")
_N_BOOT = flags.DEFINE_integer("n_boot", 10_000, "bootstrap resamples of the tasks")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the bootstrap resampling")
_JSON = flags.DEFINE_string("json", None, "also write the results to this JSON file")


def _pairs(specs: list[str]) -> list[tuple[str, str, str]]:
    from envace_jax.cli.entrypoint import UsageError

    from envace_jax.demo.arms import all_pairs

    if not specs:
        return all_pairs()
    out = []
    for spec in specs:
        a, sep, b = spec.partition(":")
        if not sep or not a or not b:
            raise UsageError(f"--pair={spec!r}: expected two arm names as A:B (e.g. after:before)")
        out.append((f"{a} vs {b}", a, b))
    return out


def main(argv: list[str]) -> int:
    from envace_jax.cli.entrypoint import UsageError

    from envace_jax.eval import paired

    run_dirs = argv[1:]
    if not run_dirs:
        raise UsageError("name one or more run directories (each holding eval_<arm>_tasks.jsonl files)")
    found = {}
    for d in run_dirs:
        if not os.path.isdir(d):
            raise FileNotFoundError(2, "no such run directory", d)
        found[d] = paired.find_arms(d)
        if not found[d]:
            raise UsageError(f"{d}: no eval_<arm>_tasks.jsonl files (run the demo with this version first)")
    pairs = _pairs(_PAIRS.value)
    if _PAIRS.value:  # asked for by name: every arm must exist in every directory
        for d, arms in found.items():
            missing = sorted({x for _, a, b in pairs for x in (a, b)} - set(arms))
            if missing:
                raise UsageError(f"{d}: no outcomes of arm(s) {missing}; it has {sorted(arms)}")
    outcomes = {d: {arm: paired.read_outcomes(p) for arm, p in arms.items()} for d, arms in found.items()}
    report, blocks = [], []
    for label, a, b in pairs:
        dirs = [d for d in run_dirs if a in outcomes[d] and b in outcomes[d]]
        if not dirs:
            continue
        rows, sig = [], 0
        for d in dirs:
            r = paired.compare(outcomes[d][a], outcomes[d][b], a, b, n_boot=_N_BOOT.value, seed=_SEED.value)
            rows.append(paired.paired_row(d, r))
            report.append(dict(r.as_dict(), label=label, run_dir=d))
            sig += r.significant
        if len(dirs) > 1:
            r = paired.pool(
                [(outcomes[d][a], outcomes[d][b]) for d in dirs], a, b, n_boot=_N_BOOT.value, seed=_SEED.value
            )
            rows.append(paired.paired_row(f"pooled ({len(dirs)} seeds)", r))
            report.append(dict(r.as_dict(), label=label, run_dir="pooled", run_dirs=dirs))
        header = ["run directory"] + paired.PAIRED_HEADER[1:]
        blocks.append(
            f"## {label} (A = {a}, B = {b})"
            + (f": 95% paired interval excludes 0 on {sig} of {len(dirs)} run(s)" if len(dirs) > 1 else "")
            + "\n\n"
            + paired.markdown_table(rows, header)
        )
    if not blocks:
        raise UsageError(f"no comparison has both its arms in {run_dirs}; arms found: {found}")
    print("\n\n".join(blocks))
    print("\n" + paired.PAIRED_NOTE.replace(f"{paired.N_BOOT:,}", f"{_N_BOOT.value:,}"))
    if _JSON.value:
        with open(_JSON.value, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {_JSON.value}", file=sys.stderr)
    return 0


def cli() -> None:
    """``envace-paired-stats`` and ``launch/paired_stats.py``."""
    from envace_jax.cli.entrypoint import run

    run(main, config_flag=None)
