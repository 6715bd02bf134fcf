"""Paired statistics of two evaluated arms on the same test tasks (host code: numpy and the standard library).

Every arm of the demo (the RL start, RL, more SFT, each RL mode of demo-compare, test-time rehearsal at N = 0,
1, 2) runs on the same held-out tasks, so two arms are compared task by task rather than through two separate
per-arm intervals, which ignore that most tasks succeed or fail under both arms alike:

- **success difference** A - B and its 95% **paired bootstrap** interval: tasks are resampled with
  replacement (``n_boot`` times, seeded), each resample keeping a task's two outcomes together; the interval
  is the 2.5th and 97.5th percentile of the resampled differences;
- **McNemar's exact test**: under "A and B succeed equally often", a task where exactly one of them succeeds
  (a discordant pair) is a win for A or for B with probability 1/2, so the wins are Binomial(wins + losses,
  1/2); the two-sided p-value doubles the smaller tail (capped at 1);
- **wins / losses / ties**: tasks A solved and B did not / the reverse / the same outcome under both;
- **mean checklist-score difference** with its paired bootstrap interval (the same resamples).

Across seeds (``pool``): each seed has its own tasks and its own pair of arms. The pooled difference is the
mean of the per-seed differences (each seed weighs the same), its interval a stratified bootstrap (tasks are
resampled within each seed, and the per-seed differences of one resample are averaged), and its p-value the
exact McNemar test on the discordant pairs summed over seeds: under the null each seed's wins are
Binomial(its discordant pairs, 1/2) independently, so their sum is Binomial(all discordant pairs, 1/2) (the
exact, conditional form of the stratified McNemar / Cochran-Mantel-Haenszel test for matched pairs).

Per-task outcomes live in ``RUN_DIR/eval_<arm>_tasks.jsonl``, one line per task: ``{"uid", "success",
"score"}`` (``write_outcomes`` / ``read_outcomes``); ``launch/paired_stats.py`` recomputes the tables from them.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import math
import os
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from envace_jax.eval.results import is_success

N_BOOT = 10_000
BOOT_CHUNK = 500  # resamples drawn at once: bounds the index array to BOOT_CHUNK x tasks
_ARM = re.compile(r"^eval_(.+)_tasks\.jsonl$")


# ----------------------------------------------------------------------------- per-task outcomes


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    uid: str
    success: bool  # envace_jax.eval.results.is_success(score): the report's success rate counts these
    score: float


def outcomes_of(uids: Sequence[str], scores: Sequence[float]) -> list[TaskOutcome]:
    """One outcome per task, success decided by ``is_success`` (the one success test of the reports)."""
    if len(uids) != len(scores):
        raise ValueError(f"outcomes_of: {len(uids)} uids but {len(scores)} scores")
    return [TaskOutcome(str(u), is_success(float(s)), float(s)) for u, s in zip(uids, scores)]


def tasks_path(run_dir: str, arm: str) -> str:
    return os.path.join(run_dir, f"eval_{arm}_tasks.jsonl")


def _check_unique(outcomes: Sequence[TaskOutcome], where: str) -> None:
    counts = collections.Counter(o.uid for o in outcomes)
    dup = sorted(u for u, c in counts.items() if c > 1)
    if dup:
        raise ValueError(f"{where}: task uid(s) {dup[:5]} appear more than once")


def write_outcomes(run_dir: str, arm: str, outcomes: Sequence[TaskOutcome]) -> str:
    """Writes ``RUN_DIR/eval_<arm>_tasks.jsonl`` (one ``{"uid", "success", "score"}`` line per task)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", arm):
        raise ValueError(f"arm name {arm!r}: use letters, digits, '_', '.' or '-'")
    _check_unique(outcomes, f"arm {arm!r}")
    path = tasks_path(run_dir, arm)
    with open(path, "w", encoding="utf-8") as f:
        for o in outcomes:
            f.write(json.dumps({"uid": o.uid, "success": bool(o.success), "score": float(o.score)}) + "\n")
    return path


def read_outcomes(path: str) -> list[TaskOutcome]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                o = TaskOutcome(str(rec["uid"]), rec["success"], float(rec["score"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{path}:{i}: expected {{'uid', 'success', 'score'}}, got {line.strip()[:120]!r} ({e})"
                ) from e
            if not isinstance(o.success, bool):
                raise ValueError(f"{path}:{i}: 'success' must be true or false, got {o.success!r}")
            out.append(o)
    _check_unique(out, path)
    return out


def find_arms(run_dir: str) -> dict[str, str]:
    """arm -> path of every ``eval_<arm>_tasks.jsonl`` in ``run_dir``."""
    found = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "eval_*_tasks.jsonl"))):
        m = _ARM.match(os.path.basename(path))
        if m:
            found[m.group(1)] = path
    return found


# ----------------------------------------------------------------------------- tests and intervals


def mcnemar_exact_p(wins: int, losses: int) -> float:
    """Two-sided exact McNemar p-value: twice the smaller Binomial(wins + losses, 1/2) tail, at most 1 (1 when
    no pair is discordant: nothing tells the arms apart)."""
    if wins < 0 or losses < 0:
        raise ValueError(f"mcnemar_exact_p: counts must be >= 0, got wins={wins}, losses={losses}")
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    # exact integer tail, divided once: no float underflow for thousands of pairs
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def _boot_means(columns: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each column ([tasks]), its mean over ``n_boot`` resamples of the tasks; every column is resampled
    with the same indices, so a task's values stay together."""
    n = len(columns[0])
    outs: list[list[np.ndarray]] = [[] for _ in columns]
    done = 0
    while done < n_boot:
        k = min(BOOT_CHUNK, n_boot - done)
        idx = rng.integers(0, n, size=(k, n))
        for out, col in zip(outs, columns):
            out.append(col[idx].mean(axis=1))
        done += k
    return [np.concatenate(o) for o in outs]


def _interval(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [0.025, 0.975])
    return float(lo), float(hi)


@dataclasses.dataclass(frozen=True)
class PairedResult:
    """Arm A against arm B on the same tasks (A - B; a win is a task A solved and B did not)."""

    a: str
    b: str
    tasks: int
    success_a: float
    success_b: float
    success_diff: float
    success_diff_ci: tuple[float, float]
    wins: int
    losses: int
    ties: int
    mcnemar_p: float
    score_a: float
    score_b: float
    score_diff: float
    score_diff_ci: tuple[float, float]
    seeds: int = 1  # > 1: pooled over that many seeds (``pool``)

    @property
    def significant(self) -> bool:
        """The 95% paired interval of the success difference excludes 0."""
        lo, hi = self.success_diff_ci
        return lo > 0 or hi < 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PairedResult":
        """The inverse of ``as_dict`` (extra keys such as ``label`` and ``significant`` are ignored)."""
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        kw["success_diff_ci"], kw["score_diff_ci"] = tuple(kw["success_diff_ci"]), tuple(kw["score_diff_ci"])
        return cls(**kw)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["success_diff_ci"], d["score_diff_ci"] = list(self.success_diff_ci), list(self.score_diff_ci)
        d["significant"] = self.significant
        return d


def align(
    a: Sequence[TaskOutcome], b: Sequence[TaskOutcome], name_a: str = "A", name_b: str = "B"
) -> tuple[list[TaskOutcome], list[TaskOutcome]]:
    """The two arms' outcomes in one task order (A's), joined by uid; an error names the uids that only one
    arm has (a paired comparison needs the same tasks on both sides)."""
    _check_unique(a, f"arm {name_a!r}")
    _check_unique(b, f"arm {name_b!r}")
    by_b = {o.uid: o for o in b}
    only_a = [o.uid for o in a if o.uid not in by_b]
    only_b = sorted(set(by_b) - {o.uid for o in a})
    if only_a or only_b:
        raise ValueError(
            f"arms {name_a!r} and {name_b!r} were not evaluated on the same tasks: "
            f"{len(only_a)} uid(s) only in {name_a!r} {only_a[:5]}, {len(only_b)} only in {name_b!r} {only_b[:5]}"
        )
    if not a:
        raise ValueError(f"arms {name_a!r} and {name_b!r}: no tasks to compare")
    return list(a), [by_b[o.uid] for o in a]


def _arrays(a: Sequence[TaskOutcome], b: Sequence[TaskOutcome]):
    sa = np.array([o.success for o in a], np.float64)
    sb = np.array([o.success for o in b], np.float64)
    xa = np.array([o.score for o in a], np.float64)
    xb = np.array([o.score for o in b], np.float64)
    return sa, sb, xa, xb


def compare(
    a: Sequence[TaskOutcome],
    b: Sequence[TaskOutcome],
    name_a: str = "A",
    name_b: str = "B",
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> PairedResult:
    """Arm ``a`` against arm ``b`` on the same tasks (see the module docstring)."""
    return pool([(a, b)], name_a, name_b, n_boot=n_boot, seed=seed)


def pool(
    seeds: Sequence[tuple[Sequence[TaskOutcome], Sequence[TaskOutcome]]],
    name_a: str = "A",
    name_b: str = "B",
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> PairedResult:
    """A against B pooled over seeds (each item: one seed's two arms on that seed's tasks): the mean of the
    per-seed differences, a bootstrap over tasks within each seed, and the exact McNemar test on the summed
    discordant pairs. With one seed this is ``compare``."""
    if not seeds:
        raise ValueError("pool: no seeds")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    per_seed, boots = [], []
    wins = losses = ties = tasks = 0
    for k, (a, b) in enumerate(seeds):
        where = (name_a, name_b) if len(seeds) == 1 else (f"{name_a} (seed item {k})", f"{name_b} (seed item {k})")
        a, b = align(a, b, *where)
        sa, sb, xa, xb = _arrays(a, b)
        ds, dx = sa - sb, xa - xb
        wins += int(np.sum(ds > 0))
        losses += int(np.sum(ds < 0))
        ties += int(np.sum(ds == 0))
        tasks += len(a)
        per_seed.append((sa.mean(), sb.mean(), ds.mean(), xa.mean(), xb.mean(), dx.mean()))
        boots.append(_boot_means([ds, dx], n_boot, rng))
    m = np.mean(np.array(per_seed), axis=0)
    boot_ds = np.mean([bs[0] for bs in boots], axis=0)
    boot_dx = np.mean([bs[1] for bs in boots], axis=0)
    return PairedResult(
        a=name_a,
        b=name_b,
        tasks=tasks,
        success_a=float(m[0]),
        success_b=float(m[1]),
        success_diff=float(m[2]),
        success_diff_ci=_interval(boot_ds),
        wins=wins,
        losses=losses,
        ties=ties,
        mcnemar_p=mcnemar_exact_p(wins, losses),
        score_a=float(m[3]),
        score_b=float(m[4]),
        score_diff=float(m[5]),
        score_diff_ci=_interval(boot_dx),
        seeds=len(seeds),
    )


# ----------------------------------------------------------------------------- tables


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


PAIRED_HEADER = [
    "comparison (A vs B)",
    "tasks",
    "success A",
    "success B",
    "A - B [95% paired CI]",
    "McNemar p",
    "wins / losses / ties",
    "score A - B [95% CI]",
]


def paired_row(label: str, r: PairedResult) -> list[str]:
    lo, hi = r.success_diff_ci
    slo, shi = r.score_diff_ci
    return [
        label,
        str(r.tasks),
        f"{r.success_a:.3f}",
        f"{r.success_b:.3f}",
        f"{_signed(r.success_diff)} [{_signed(lo)}, {_signed(hi)}]" + (" *" if r.significant else ""),
        _p(r.mcnemar_p),
        f"{r.wins} / {r.losses} / {r.ties}",
        f"{_signed(r.score_diff)} [{_signed(slo)}, {_signed(shi)}]",
    ]


def markdown_table(rows: Iterable[Sequence[str]], header: Sequence[str] = PAIRED_HEADER) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


PAIRED_NOTE = (
    "A - B: success-rate difference on the same tasks, 95% paired bootstrap interval (tasks resampled "
    f"{N_BOOT:,} times, seeded; * = the interval excludes 0); McNemar p: exact two-sided test on the tasks "
    "only one arm solved; wins / losses / ties: tasks A solved and B did not / the reverse / the same outcome. "
    "Per-task outcomes: eval_<arm>_tasks.jsonl (launch/paired_stats.py recomputes this table)."
)


def compare_arms(
    arms: Mapping[str, Sequence[TaskOutcome]],
    pairs: Sequence[tuple[str, str, str]],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> list[tuple[str, PairedResult]]:
    """``(label, result)`` for each ``(label, arm A, arm B)`` of ``pairs`` whose two arms are both in ``arms``."""
    return [
        (label, compare(arms[a], arms[b], a, b, n_boot=n_boot, seed=seed))
        for label, a, b in pairs
        if a in arms and b in arms
    ]
