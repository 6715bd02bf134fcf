"""Per-category evaluation results: the record, confidence intervals, and the results files.

``DIR/results.json`` is ``{"suite": str, "policy": str, "config": {...}, "categories": {name: row}}``
where every row holds at least ``count``, ``valid`` (judged correct by the benchmark's own checker)
and ``accuracy`` = valid / count, plus its 95% Wilson interval. ``DIR/results.md`` is the same table
in markdown. Per-entry outcomes go to ``DIR/<category>.jsonl`` when asked for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Sequence

# the one success test of every suite, the demo and its report (defined beside the checklist reward, which the RL
# step's metrics count with it too)
from envace_jax.rl.reward import SUCCESS_TOLERANCE, is_success  # noqa: F401


def wilson_ci(successes: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a binomial proportion ([nan, nan] when n == 0)."""
    if n == 0:
        return [float("nan"), float("nan")]
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def mean_ci(xs: Sequence[float], z: float = 1.96) -> list[float]:
    """Normal-approximation 95% interval of a mean score (checklist scores are not binomial), clipped to
    [0, 1] where scores live; [nan, nan] with fewer than two scores (no spread to estimate)."""
    n = len(xs)
    if n < 2:
        return [float("nan"), float("nan")]
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = z * sd / math.sqrt(n)
    return [max(0.0, m - h), min(1.0, m + h)]


@dataclasses.dataclass
class EntryResult:
    """One benchmark entry: whether the benchmark's checker accepted it, and why not."""

    id: str
    valid: bool
    error_type: str | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)  # score parts, counts, termination


@dataclasses.dataclass
class CategoryResult:
    name: str
    entries: list[EntryResult]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # suite-specific means (e.g. checklist score)

    @property
    def count(self) -> int:
        return len(self.entries)

    @property
    def valid(self) -> int:
        return sum(e.valid for e in self.entries)

    def row(self) -> dict[str, Any]:
        n, v = self.count, self.valid
        errors: dict[str, int] = {}
        for e in self.entries:
            if not e.valid:
                key = e.error_type or "unknown"
                errors[key] = errors.get(key, 0) + 1
        out = {
            "count": n,
            "valid": v,
            "accuracy": (v / n) if n else float("nan"),
            "accuracy_ci95": wilson_ci(v, n),
            "errors": dict(sorted(errors.items())),
        }
        out.update(self.extra)
        return out


def nan_to_none(x: Any) -> Any:
    """JSON has no NaN: empty categories report null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [nan_to_none(v) for v in x]
    if isinstance(x, dict):
        return {k: nan_to_none(v) for k, v in x.items()}
    return x


_finite = nan_to_none


def results_dict(
    suite: str, policy: str, categories: Sequence[CategoryResult], config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    names = [c.name for c in categories]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate category names in results: {names}")
    return _finite(
        {
            "suite": suite,
            "policy": policy,
            "config": dict(config or {}),
            "categories": {c.name: c.row() for c in categories},
        }
    )


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def to_markdown(results: Mapping[str, Any]) -> str:
    cats = results["categories"]
    extra_keys: list[str] = []
    for row in cats.values():
        for k, v in row.items():
            if (
                k not in ("count", "valid", "accuracy", "accuracy_ci95", "errors")
                and k not in extra_keys
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
            ):
                extra_keys.append(k)
    head = ["category", "count", "valid", "accuracy", "95% CI"] + extra_keys + ["top failure"]
    lines = [
        f"# {results['suite']} ({results['policy']} policy)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, row in cats.items():
        ci = row.get("accuracy_ci95") or [None, None]
        errs = row.get("errors") or {}
        top = max(errs.items(), key=lambda kv: kv[1]) if errs else None
        cells = [
            name,
            str(row["count"]),
            str(row["valid"]),
            _fmt(row["accuracy"]),
            f"[{_fmt(ci[0])}, {_fmt(ci[1])}]",
        ] + [_fmt(row.get(k)) for k in extra_keys]
        cells.append(f"{top[0]} ({top[1]})" if top else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(
    out_dir: str, results: Mapping[str, Any], per_entry: Mapping[str, Sequence[EntryResult]] | None = None
) -> tuple[str, str]:
    """Writes results.json, results.md (and <category>.jsonl per-entry files); returns both paths."""
    os.makedirs(out_dir, exist_ok=True)
    jpath, mpath = os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")
    with open(jpath, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=False, default=str)
    with open(mpath, "w", encoding="utf-8") as f:
        f.write(to_markdown(results))
    for name, entries in (per_entry or {}).items():
        with open(os.path.join(out_dir, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for e in entries:
                f.write(json.dumps(_finite(dataclasses.asdict(e)), default=str) + "\n")
    return jpath, mpath


def load_results(out_dir: str) -> dict[str, Any]:
    """Reads DIR/results.json and checks the per-category fields every consumer relies on."""
    path = os.path.join(out_dir, "results.json")
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    for name, row in res.get("categories", {}).items():
        for key in ("count", "valid", "accuracy"):
            if key not in row:
                raise ValueError(f"{path}: category {name!r} lacks {key!r}")
    return res
