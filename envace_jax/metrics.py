"""Run metrics: JSONL (one line per step), TensorBoard scalars, and a PNG of reward curves per role.

Only process 0 writes. The JSONL file is the source of truth: a resumed run appends to it, and
``read_jsonl`` keeps the last record of each step, so steps repeated after a crash are not counted
twice in the plot.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

REWARD_KEYS = (
    ("act/reward_mean", "ACT"),
    ("rehearse/reward_mean", "REHEARSE"),
    ("episode/score_mean", "episode score"),
)


def _clean(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        out[k] = f if math.isfinite(f) else None  # JSON has no NaN; keep the key, mark it missing
    return out


class MetricsWriter:
    """Appends ``{"step": s, **metrics}`` lines to ``<run_dir>/metrics.jsonl`` and TensorBoard."""

    def __init__(self, run_dir: str, *, tensorboard: bool = True, enabled: bool = True):
        self.run_dir = run_dir
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._tb = None
        if enabled:
            os.makedirs(run_dir, exist_ok=True)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tb"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        clean = _clean(metrics)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), **clean}, sort_keys=True) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, int(step))
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Records sorted by step; the last line written for a step wins (resumed runs repeat steps)."""
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not JSON ({e})") from e
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def plot_rewards(jsonl_path: str, out_png: str, *, title: str = "reward per role") -> str:
    """Draws the per-role reward curves of a run (matplotlib Agg, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(jsonl_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for key, label in REWARD_KEYS:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn += 1
    ax.set_xlabel("step")
    ax.set_ylabel("mean row reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
