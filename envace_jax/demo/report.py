"""Demo report files: summary.json, report.md, PNG plots, and the table printed at the end."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Mapping, Sequence

from envace_jax.eval import paired
from envace_jax.eval.results import (
    is_success,
    mean_ci,
    nan_to_none,
    wilson_ci,
)  # report.mean_ci / wilson_ci still resolve

REQUIRED_KEYS = (
    "real_success_before",
    "real_success_after",
    "real_success_ci_before",
    "real_success_ci_after",
    "fidelity_before",
    "fidelity_after",
    "test_episodes",
    "more_sft_success",
    "more_sft_success_ci",
    "success_by_branch_before",
    "success_by_branch_after",
    "fidelity_state_changing_before",
    "fidelity_state_changing_after",
    "fidelity_read_only_before",
    "fidelity_read_only_after",
    "optimistic_hallucination_before",
    "optimistic_hallucination_after",
)


def _lora_note(config: dict) -> str:
    r = config.get("lora_rank") or 0
    if not r:
        return ""
    return f", LoRA adapters of rank {r} (alpha {config.get('lora_alpha') or 2.0 * r:g}) on every projection"


# the demo's rl_algorithm as the report names it
ALGORITHM_LABELS = {"grpo": "GRPO", "gspo": "GSPO", "dapo": "DAPO", "dr_grpo": "Dr. GRPO"}


def _wins(scores: Sequence[float]) -> list[bool]:
    return [is_success(s) for s in scores]


def _success_rate(scores: Sequence[float]) -> float:
    return sum(_wins(scores)) / len(scores)


def _split(groups: Mapping[str, Sequence[float]], name: str) -> dict[str, Any]:
    """``success_by_<name>``, its Wilson CIs and ``episodes_by_<name>`` of a {group: scores} split."""
    wins = {g: _wins(v) for g, v in sorted(groups.items())}
    return {
        f"success_by_{name}": {g: sum(w) / len(w) for g, w in wins.items()},
        f"success_by_{name}_ci": {g: wilson_ci(sum(w), len(w)) for g, w in wins.items()},
        f"episodes_by_{name}": {g: len(w) for g, w in wins.items()},
    }


def eval_summary(res) -> dict[str, Any]:
    wins = sum(res.successes)
    n = max(1, res.n)
    return {
        "episodes": res.n,
        "success": wins / n,
        "success_ci": wilson_ci(wins, res.n),
        "score": sum(res.scores) / n,
        "score_ci": mean_ci(res.scores),
        "success_by_world": {w: _success_rate(v) for w, v in sorted(res.by_world.items())},
        **_split(res.by_branch, "branch"),
        "success_by_type": {t: _success_rate(v) for t, v in sorted(res.by_type.items())},
        **_split(res.by_push_back_kind, "push_back_kind"),
        "terminations": dict(sorted(res.terminations.items())),
        "tool_calls_mean": res.tool_calls_mean,
    }


def fidelity_summary(report) -> dict[str, Any]:
    from envace_jax.eval.fidelity_report import kind_headline

    s = report.summary()
    return {
        "overall": s["overall"],
        "by_domain": s["by_domain"],
        "by_kind": s["by_kind"],
        "by_kind_outcome": s["by_kind_outcome"],
        "kinds": kind_headline(s),
    }


def curve_point(step: int, ev: Mapping[str, Any]) -> dict[str, Any]:
    """A learning-curve point: success (with CI), score and the branch splits of an ``eval_summary``."""
    return {
        "step": step,
        **{k: ev[k] for k in ("success", "success_ci", "score", "success_by_branch", "success_by_push_back_kind")},
    }


def curve_rows(curve: Sequence[Mapping[str, Any]]) -> tuple[list[list[str]], list[str]]:
    branches = sorted({b for p in curve for b in p["success_by_branch"]})
    kinds = sorted({k for p in curve for k in p["success_by_push_back_kind"]})
    rows = [
        [str(p["step"]), f"{p['success']:.3f}", _fmt_ci(p["success_ci"])]
        + [f"{p['success_by_branch'].get(b, float('nan')):.3f}" for b in branches]
        + [f"{p['success_by_push_back_kind'].get(k, float('nan')):.3f}" for k in kinds]
        for p in curve
    ]
    return rows, ["RL step", "real success", "95% CI"] + branches + [f"push-back, {k}" for k in kinds]


@contextlib.contextmanager
def _figure(out_png: str, figsize: tuple[float, float], dpi: int):
    """An axes on a headless figure that is written to ``out_png`` and closed on leaving the block."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI hosts or TPU VMs
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    try:
        yield ax
        fig.tight_layout()
        fig.savefig(out_png, dpi=dpi)
    finally:
        plt.close(fig)


def plot_curve(curve: Sequence[Mapping[str, Any]], out_png: str, title: str) -> None:
    steps = [p["step"] for p in curve]
    with _figure(out_png, (6, 3.5), 110) as ax:
        lo, hi = zip(*(p["success_ci"] for p in curve))
        ax.fill_between(steps, lo, hi, alpha=0.2, label="95% CI")
        ax.plot(steps, [p["success"] for p in curve], "o-", label="all")
        for b in sorted({b for p in curve for b in p["success_by_branch"]}):
            ax.plot(steps, [p["success_by_branch"].get(b, float("nan")) for p in curve], ".--", label=b)
        ax.set_xlabel("RL step")
        ax.set_ylabel("real success (greedy)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)


def _fmt_ci(ci: Sequence[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def cis_separate(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[1] < b[0] or b[1] < a[0]


def plot_rewards(steps: Sequence[Mapping[str, Any]], out_png: str, title: str) -> None:
    with _figure(out_png, (7, 4), 100) as ax:
        for key, label in (
            ("act/reward_mean", "ACT rows"),
            ("rehearse/reward_mean", "REHEARSE rows"),
            ("episode/score_mean", "episode score"),
        ):
            pts = [(m["step"], m[key]) for m in steps if m.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_xlabel("RL step")
        ax.set_ylabel("mean reward (training rollouts)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()


def plot_success(bars: Sequence[tuple[str, float, Sequence[float]]], out_png: str, title: str) -> None:
    names = [b[0] for b in bars]
    vals = [b[1] for b in bars]
    lo = [max(0.0, b[1] - b[2][0]) for b in bars]
    hi = [max(0.0, b[2][1] - b[1]) for b in bars]
    with _figure(out_png, (7, 4), 100) as ax:
        ax.bar(names, vals, yerr=[lo, hi], capsize=6, color=["#888888", "#2a7ab9", "#d9822b", "#5a9e4b"][: len(bars)])
        for i, v in enumerate(vals):
            ax.text(i, v + 0.01, f"{v:.3f}", ha="center", va="bottom")
        ax.set_ylabel("real-environment success (95% Wilson CI)")
        ax.set_ylim(0, 1)
        ax.set_title(title)


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _start_name(summary: Mapping[str, Any]) -> str:
    return "base (pretrained, shipped)" if summary.get("start") == "base" else "SFT warm start"


def results_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, key in (
        (_start_name(summary), "before"),
        (f"after RL ({summary['rl_mode']})", "after"),
        ("more SFT (equal wall time)", "more_sft"),
    ):
        ev = summary["eval"].get(key)
        if ev is None:
            continue
        fid = summary["fidelity"].get(key, {}).get("overall", {})
        rows.append(
            [
                name,
                f"{ev['success']:.3f}",
                _fmt_ci(ev["success_ci"]),
                f"{ev['score']:.3f}",
                _fmt_ci(ev["score_ci"]),
                f"{fid.get('exact', float('nan')):.3f}",
                f"{fid.get('field', float('nan')):.3f}",
            ]
        )
    return rows


RESULT_HEADER = ["model", "real success", "95% CI", "checklist score", "95% CI", "REHEARSE exact", "REHEARSE field"]


def branch_rows(summary: Mapping[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Success per branch kind, and per kind of push-back (announced by a tool error, or silent), with
    Wilson CIs, for each evaluated model."""
    before = summary["eval"]["before"]
    branches = sorted({b for ev in summary["eval"].values() for b in ev.get("success_by_branch", {})})
    kinds = sorted({k for ev in summary["eval"].values() for k in ev.get("success_by_push_back_kind", {})})
    header = [f"{b} (n={before.get('episodes_by_branch', {}).get(b, 0)})" for b in branches] + [
        f"push-back, {k} (n={before.get('episodes_by_push_back_kind', {}).get(k, 0)})" for k in kinds
    ]
    rows = []
    for name, key in (
        (_start_name(summary), "before"),
        (f"after RL ({summary['rl_mode']})", "after"),
        ("more SFT (equal wall time)", "more_sft"),
    ):
        ev = summary["eval"].get(key)
        if ev is None:
            continue
        cells = [(ev["success_by_branch"], ev["success_by_branch_ci"], b) for b in branches]
        cells += [
            (ev.get("success_by_push_back_kind", {}), ev.get("success_by_push_back_kind_ci", {}), k) for k in kinds
        ]
        rows.append([name] + [f"{rate[k]:.3f} {_fmt_ci(ci[k])}" if k in rate else "-" for rate, ci, k in cells])
    return rows, ["model"] + header


def fidelity_kind_rows(summary: Mapping[str, Any]) -> tuple[list[list[str]], list[str]]:
    """REHEARSE exact match on read-only vs state-changing calls, and the hallucination rates."""
    header = [
        "model",
        "read-only exact",
        "state-changing exact",
        "optimistic hallucination",
        "pessimistic hallucination",
    ]
    rows = []
    for name, key in (
        (_start_name(summary), "before"),
        (f"after RL ({summary['rl_mode']})", "after"),
        ("more SFT (equal wall time)", "more_sft"),
    ):
        k = summary["fidelity"].get(key, {}).get("kinds")
        if k:
            rows.append(
                [name]
                + [
                    f"{k[f]:.3f}"
                    for f in (
                        "fidelity_read_only",
                        "fidelity_state_changing",
                        "optimistic_hallucination",
                        "pessimistic_hallucination",
                    )
                ]
            )
    return rows, header


def write_report(run_dir: str, summary: dict[str, Any], rl_steps: Sequence[Mapping[str, Any]]) -> str:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        # strict JSON: a rate over an empty group (NaN) is written as null
        json.dump(nan_to_none(summary), f, indent=1, sort_keys=True, allow_nan=False)
    plot_rewards(rl_steps, os.path.join(run_dir, "rewards.png"), f"RL ({summary['rl_mode']}) training reward per role")
    start = "base" if summary.get("start") == "base" else "SFT"
    bars = [
        (start, summary["real_success_before"], summary["real_success_ci_before"]),
        (f"{start}+RL", summary["real_success_after"], summary["real_success_ci_after"]),
    ]
    if summary.get("more_sft_success") is not None:
        bars.append(("more SFT", summary["more_sft_success"], summary["more_sft_success_ci"]))
    plot_success(
        bars,
        os.path.join(run_dir, "success.png"),
        f"{summary['eval_split']} split, {summary['test_episodes']} real-tool episodes",
    )
    verdict = _verdict(summary)
    curve = summary["rl"].get("curve") or []
    curve_md = []
    if len(curve) > 2:  # points between the start and the end (rl_eval_every)
        plot_curve(
            curve,
            os.path.join(run_dir, "success_curve.png"),
            f"learning curve, {summary['eval_split']} split, {summary['test_episodes']} real-tool episodes",
        )
        curve_md = [
            "Learning curve (greedy real-tool success on the same held-out tasks during RL):",
            "",
            table(*curve_rows(curve)),
            "",
            "![learning curve](success_curve.png)",
            "",
        ]
    timing = table(
        [[k, f"{v['wall_s']:.1f}", f"{v['cpu_s']:.1f}"] for k, v in summary["timing"].items()],
        ["stage", "wall s", "CPU s"],
    )
    start = ""
    if summary.get("start") == "base":
        b = summary["base"]
        init = (b.get("pretrain_config") or {}).get("init_from")
        made = f"{b['pretrain_steps']} pretraining steps" + (f" continuing `{init}`" if init else "")
        start = (
            f"Start: the shipped base `{b['dir']}` ({made} by `launch/pretrain.py`, "
            "train-split tasks only); the demo's wall time counts from it. Branch mix (push-back share): "
            + ", ".join(f"{k} {v.get('push_back', 0):.2f}" for k, v in summary["data"]["branch_share"].items())
            + "."
        )
    md = [
        f"# EnvACE demo report ({summary['eval_split']} split)",
        "",
        start,
        "",
        f"Model: {summary['model']['params']:,} parameters ({summary['model']['layers']} layers, hidden "
        f"{summary['model']['hidden']}), demo tokenizer of {summary['model']['vocab']} tokens, thinking off.",
        f"Data: {summary['data']['sft_tasks']} demonstration tasks -> {summary['data']['sft_rows']} SFT rows "
        f"({summary['data']['sft_rows_by_role']}); {summary['data']['rl_tasks']} fresh RL prompts; "
        f"{summary['test_episodes']} held-out {summary['eval_split']} tasks run against the real tools.",
        f"RL: mode `{summary['rl_mode']}`, {summary['rl']['steps']} steps x {summary['rl']['prompts_per_step']} "
        f"prompts x {summary['rl']['n_rollouts']} rollouts at temperature {summary['config'].get('temperature')}, "
        f"Adam lr {summary['rl']['lr']}, {summary['rl'].get('replay_batches', 0)} SFT replay batch(es) "
        f"({summary['rl'].get('replay_roles', 'act+rehearse')} rows of the corpus) after each RL step, rule judge, "
        f"role-wise {ALGORITHM_LABELS[summary['config'].get('rl_algorithm', 'grpo')]} (rl/recipes.py)"
        + _lora_note(summary["config"])
        + ".",
        "",
        "## Results",
        "",
        table(results_rows(summary), RESULT_HEADER),
        "",
        verdict,
        "",
        *paired_md(summary.get("paired") or []),
        "Success by branch kind (happy: every tool answers; push_back: a tool errs or a returned value makes the "
        "user's condition fail, so the right reply depends on what the tool said):",
        "",
        table(*branch_rows(summary)),
        "",
        "REHEARSE fidelity by kind of call (state-changing: the real call changed the world's state) and "
        "hallucination rates (optimistic: a real error rehearsed as a success; pessimistic: the reverse):",
        "",
        table(*fidelity_kind_rows(summary)),
        "",
        *curve_md,
        "Success = every checklist item of every user turn passed, with real tools and greedy decoding. "
        "Success CIs are 95% Wilson intervals; score CIs are normal-approximation intervals of the mean.",
        "REHEARSE fidelity is teacher-forced on the held-out tasks' logged calls: `exact` = the rehearsed "
        "JSON equals the real response; `field` = share of matching leaves.",
        "",
        _train_line(summary["rl"].get("train", {})),
        "",
        "![reward per role](rewards.png)",
        "",
        "![real success](success.png)",
        "",
        "## Time",
        "",
        timing,
        "",
        f"More-SFT baseline: {summary.get('more_sft_steps', 0)} extra SFT steps in the RL stage's wall time.",
        "",
    ]
    path = os.path.join(run_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path


def paired_md(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's paired table (``summary["paired"]``: dicts of ``eval.paired.PairedResult`` with a
    ``label``), as markdown lines; none when there is nothing to compare."""
    if not results:
        return []
    rows = [paired.paired_row(r["label"], paired.PairedResult.from_dict(r)) for r in results]
    return [
        "Paired comparisons on the same test tasks (A - B):",
        "",
        paired.markdown_table(rows),
        "",
        paired.PAIRED_NOTE,
        "",
    ]


def _paired(s: Mapping[str, Any], a: str, b: str) -> paired.PairedResult | None:
    for r in s.get("paired") or []:
        if r["a"] == a and r["b"] == b:
            return paired.PairedResult.from_dict(r)
    return None


def _paired_words(r: paired.PairedResult) -> str:
    lo, hi = r.success_diff_ci
    return (
        f"paired difference {r.success_diff:+.3f} [{lo:+.3f}, {hi:+.3f}], McNemar p = {paired._p(r.mcnemar_p)}, "
        f"{r.wins} tasks won / {r.losses} lost"
    )


def _train_line(t: Mapping[str, Any]) -> str:
    if not t:
        return ""
    terms = ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in t.items() if k.startswith("termination/"))
    return (
        f"RL training rollouts (means over steps): episode score {t.get('episode/score_mean', 0):.3f} "
        f"(first half {t['score_first_half']:.3f}, second half {t['score_second_half']:.3f}); rows per step "
        f"ACT {t.get('act/rows', 0):.1f}, REHEARSE {t.get('rehearse/rows', 0):.1f}; episode endings: {terms}."
    )


def _verdict(s: Mapping[str, Any]) -> str:
    b, a = s["real_success_before"], s["real_success_after"]
    sep = cis_separate(s["real_success_ci_before"], s["real_success_ci_after"])
    fb = s["fidelity_before"]
    fa = s["fidelity_after"]
    rl_start = _paired(s, "after", "before")
    if rl_start is not None:  # the tasks are the same: the paired interval is the one that says it
        gain = rl_start.success_diff > 0 and rl_start.significant
        verb = "raised" if a > b else "did not raise"
        head = f"RL {verb} real success ({b:.3f} -> {a:.3f}; {_paired_words(rl_start)}): " + (
            "a significant gain at 95%." if gain else "not a significant gain at 95%."
        )
    elif a > b and sep:
        head = f"RL raised real success from {b:.3f} to {a:.3f}; the 95% CIs do not overlap."
    elif a > b:
        head = f"RL raised real success from {b:.3f} to {a:.3f}, but the 95% CIs overlap: not a significant gain."
    else:
        head = f"RL did not raise real success ({b:.3f} -> {a:.3f})."
    ms = s.get("more_sft_success")
    tail = ""
    rl_sft = _paired(s, "after", "more_sft")
    if ms is not None and rl_sft is not None:
        tail = (
            f" More SFT for the same wall time reached {ms:.3f} (RL against it: {_paired_words(rl_sft)}; "
            f"{'significant' if rl_sft.significant else 'not significant'} at 95%)."
        )
    elif ms is not None:
        apart = cis_separate(s["real_success_ci_after"], s["more_sft_success_ci"])
        tail = (
            f" More SFT for the same wall time reached {ms:.3f} "
            f"({'CIs apart from' if apart else 'CIs overlapping'} RL's)."
        )
    return f"{head} REHEARSE exact fidelity {fb:.3f} before, {fa:.3f} after RL.{tail}"


def check_summary(summary: Mapping[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in summary]
    if missing:
        raise KeyError(f"summary.json lacks {missing}")
