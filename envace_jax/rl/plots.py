"""Figures of a training run, drawn from its ``metrics.jsonl`` (matplotlib Agg; no display needed).

``training.png`` has one panel per quantity that the loop logged: reward per role, episode success,
policy loss and KL. A panel is drawn only when the run logged one of its series, so a run without a
reference model has no reference-KL curve, and the titles returned say what was drawn.
``rewards.png`` (the reward panel alone) is kept for scripts that read that file.

Series are matched by metric name. Runs that train ACT and REHEARSE with separate trainers (mode
``noshare``) log ``update_act/...`` and ``update_rehearse/...`` instead of ``update/...``, hence the
patterns.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Sequence

from envace_jax.metrics import plot_rewards, read_jsonl


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]  # (regex over metric names, legend label; "{tag}" = the match's tag)
    ylim: tuple[float, float] | None = None


# The names are those RLStep logs (rl/step.py rollout_metrics, rl/loss.py via the trainer).
PANELS = (
    Panel(
        "reward",
        "mean row reward",
        (("act/reward_mean", "ACT"), ("rehearse/reward_mean", "REHEARSE"), ("episode/score_mean", "episode score")),
    ),
    # rollout_metrics: a success is a full checklist score; "score > 0" is any credit at all.
    Panel(
        "success rate",
        "fraction of episodes",
        (("episode/success_frac", "full score"), ("episode/any_credit_frac", "score > 0")),
        ylim=(-0.03, 1.03),
    ),
    Panel(
        "loss",
        "loss",
        ((r"update(?P<tag>_[^/]+)?/loss", "total{tag}"), (r"update(?P<tag>_[^/]+)?/pg_loss", "policy gradient{tag}")),
    ),
    Panel(
        "KL",
        "KL",
        (
            (r"update(?P<tag>_[^/]+)?/ppo_kl", "to sampler (ppo_kl){tag}"),
            (r"update(?P<tag>_[^/]+)?/kl", "to reference{tag}"),
        ),
    ),
)


def panel_series(records: Sequence[dict[str, Any]], panel: Panel) -> list[tuple[str, list[int], list[float]]]:
    """(label, steps, values) of every series of ``panel`` that has at least one finite value."""
    names = sorted({k for r in records for k in r if k != "step"})
    out = []
    for pattern, label in panel.series:
        for name in names:
            m = re.fullmatch(pattern, name)
            if m is None:
                continue
            pts = [(int(r["step"]), float(r[name])) for r in records if r.get(name) is not None]
            if pts:
                xs, ys = zip(*pts)
                tag = m.groupdict().get("tag")
                out.append((label.format(tag=f" ({tag[1:]})" if tag else ""), list(xs), list(ys)))
    return out


def plot_training(jsonl_path: str, out_png: str, *, title: str = "training") -> list[str]:
    """Draws ``PANELS`` side by side from ``jsonl_path``; returns the titles of the panels drawn (none drawn:
    no file is written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(jsonl_path)
    drawn = [(p, s) for p in PANELS if (s := panel_series(records, p))]
    if not drawn:  # nothing logged yet: no figure rather than an empty one
        return []
    from matplotlib.ticker import MaxNLocator

    cols = min(2, len(drawn))
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows + 0.4), squeeze=False)
    for ax in axes.flat[len(drawn) :]:
        ax.set_visible(False)
    for ax, (panel, series) in zip(axes.flat, drawn):
        for label, xs, ys in series:
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return [p.title for p, _ in drawn]


def plot_run(run_dir: str, *, title: str) -> list[str]:
    """The end-of-run figures of ``run_dir``: ``training.png`` (panels) and ``rewards.png``."""
    jsonl = os.path.join(run_dir, "metrics.jsonl")
    titles = plot_training(jsonl, os.path.join(run_dir, "training.png"), title=title)
    plot_rewards(jsonl, os.path.join(run_dir, "rewards.png"), title=title)
    return titles
