"""The RL objectives side by side on the demo (``launch/demo.py --compare_algorithms=grpo,gspo,dapo,dr_grpo``):
the same start, the same RL steps and prompt stream, one objective after another (``rl.recipes``), each evaluated
on the same held-out tasks with the real tools; ``algorithms.md`` / ``algorithms.json`` hold one row per objective
(success, its interval, the rollouts it sampled, its RL wall time) and the paired table of each against the start
and against GRPO."""

from __future__ import annotations

from typing import Any, Sequence

from envace_jax.config import ConfigError
from envace_jax.demo import arms
from envace_jax.demo import report as rep
from envace_jax.demo.config import DemoConfig
from envace_jax.demo.pipeline import Demo
from envace_jax.rl.recipes import ALGORITHMS

LABELS = rep.ALGORITHM_LABELS


def algorithm_arm(name: str) -> str:
    return f"after_{name}"


def algorithm_pairs(names: Sequence[str]) -> list[tuple[str, str, str]]:
    """Each objective against the start, and each other one against GRPO when GRPO is among them."""
    pairs = [(f"{LABELS[a]} vs the start", algorithm_arm(a), arms.START) for a in names]
    if "grpo" in names:
        pairs += [(f"{LABELS[a]} vs GRPO", algorithm_arm(a), algorithm_arm("grpo")) for a in names if a != "grpo"]
    return pairs


def parse_algorithms(text: Sequence[str] | str) -> tuple[str, ...]:
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [n for n in names if n not in ALGORITHMS]
    if bad or not names or len(set(names)) != len(names):
        raise ConfigError(f"--compare_algorithms must be distinct names of {ALGORITHMS}, got {','.join(names)!r}")
    return tuple(names)


def run_compare_algorithms(
    cfg: DemoConfig, run_dir: str, algorithms: Sequence[str], *, progress: bool = True
) -> dict[str, Any]:
    """RL from one start with each of ``algorithms``, evaluated after each; writes algorithms.md/.json."""
    algorithms = parse_algorithms(algorithms)
    d = Demo(cfg, run_dir, progress)
    d.prepare()
    d.sft()
    ev_b, _ = d.evaluate("before")
    out: dict[str, Any] = {"before": ev_b, "algorithms": {}}
    rows = [["start", "-", "-", f"{ev_b['success']:.3f}", rep._fmt_ci(ev_b["success_ci"]), f"{ev_b['score']:.3f}"]]
    for name in algorithms:
        d.cfg = cfg.replace(rl_algorithm=name)  # the recipe the RL stage reads (loss and rl knobs)
        log = d.rl(cfg.rl_mode, tag=f"rl_{name}")
        ev, fid = d.evaluate(algorithm_arm(name))
        wall = d.timing[f"rl_{name}"].wall
        # rollouts sampled: the step's prompts, more with DAPO's dynamic sampling
        prompts = sum(m.get("dynamic/prompts_sampled", cfg.prompts_per_step) for m in log)
        out["algorithms"][name] = {"eval": ev, "fidelity": fid, "rl_wall_s": wall, "prompts_sampled": prompts}
        rows.append(
            [
                LABELS[name],
                f"{prompts:.0f}",
                f"{wall:.0f}",
                f"{ev['success']:.3f}",
                rep._fmt_ci(ev["success_ci"]),
                f"{ev['score']:.3f}",
            ]
        )
    d.cfg = cfg
    header = ["objective", "prompts rolled out", "RL wall s", "real success", "95% CI", "score"]
    text = rep.table(rows, header)
    paired_text, out["paired"] = arms.paired_section(d.outcomes, algorithm_pairs(algorithms))
    title = (
        f"RL objectives from one start ({cfg.eval_split} split, {len(d.eval_tasks)} real-tool episodes, "
        f"{cfg.rl_steps} RL steps each, mode {cfg.rl_mode})"
    )
    arms.write_comparison(run_dir, "algorithms", title, text, paired_text, out)
    return out
