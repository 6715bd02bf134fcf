"""Run metrics: JSONL (one line per step), TensorBoard scalars, and a PNG of reward curves per role.

Only process 0 writes. The JSONL file is the source of truth: a resumed run appends to it, and
``read_jsonl`` keeps the last record of each step, so steps repeated after a crash are not counted
twice in the plot. A process killed while appending leaves a torn last line; the next writer cuts it off
(its step is run again: a step's checkpoint is saved after its line is written) and readers skip it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping

logger = logging.getLogger(__name__)

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


def _cut_torn_tail(path: str) -> int:
    """Truncates ``path`` after its last newline; returns the number of bytes cut (0 when it ends whole)."""
    if not os.path.exists(path):
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Scan back in blocks for the last newline (a line is a few KB; a file may be large).
        end, keep = size, 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            end = start
        f.truncate(keep)
        return size - keep


class MetricsWriter:
    """Appends ``{"step": s, **metrics}`` lines to ``<run_dir>/metrics.jsonl`` and TensorBoard."""

    def __init__(self, run_dir: str, *, tensorboard: bool = True, enabled: bool = True):
        self.run_dir = run_dir
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._tb = None
        if enabled:
            os.makedirs(run_dir, exist_ok=True)
            cut = _cut_torn_tail(self.path)
            if cut:
                logger.warning("%s: cut a torn last line (%d bytes) left by a killed run", self.path, cut)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tb"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        clean = _clean(metrics)
        line = (json.dumps({"step": int(step), **clean}, sort_keys=True) + "\n").encode("utf-8")
        # One write() on an O_APPEND descriptor: a reader or a kill sees at most one torn line, at the end.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
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
    """Records sorted by step; the last line written for a step wins (resumed runs repeat steps).

    A last line without its newline (a writer mid-append, or killed) is skipped; any other line that is
    not JSON is an error naming it.
    """
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                if not raw.endswith("\n"):
                    break  # the torn tail: the only line that can lack its newline
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
