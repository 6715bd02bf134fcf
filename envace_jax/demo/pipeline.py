"""The demo end to end: data -> tokenizer -> SFT -> eval before -> RL -> eval after -> more-SFT
baseline -> report. ``run_compare`` runs the same RL budget in modes real, simulator and rehearsal."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
from typing import Any

import numpy as np

from envace_jax.demo import arms
from envace_jax.demo import data as demo_data
from envace_jax.demo import pretrain
from envace_jax.demo import report as rep
from envace_jax.demo import rl_memory
from envace_jax.demo import stages
from envace_jax.demo.config import REPLAY_ROLES, DemoConfig
from envace_jax.data.demo_tasks import BRANCHES
from envace_jax.eval import paired
from envace_jax.eval.results import nan_to_none
from envace_jax.rl.types import REHEARSE, ROLES


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, disable=not enabled, file=sys.stderr)


class Demo:
    """Holds the shared pieces (data, codec, model, SFT trainer) of one run directory."""

    def __init__(self, cfg: DemoConfig, run_dir: str, progress: bool = True):
        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.timing: dict[str, stages.Clock] = collections.OrderedDict()
        self.curves: dict[str, list[dict[str, Any]]] = {}  # RL tag -> learning-curve points (rl_eval_every)
        self.outcomes: dict[str, list[paired.TaskOutcome]] = {}  # evaluated arm -> per-task outcomes
        # the model that plays REHEARSE when it is not the policy (after a noshare RL run): its fidelity is measured
        self.rehearse_model = None
        os.makedirs(run_dir, exist_ok=True)

    def clock(self, name: str) -> stages.Clock:
        return self.timing.setdefault(name, stages.Clock())

    # ------------------------------------------------------------------ stages
    def prepare(self) -> None:
        cfg = self.cfg
        with self.clock("data+tokenizer"), _bar(4, "data+tokenizer", self.progress) as bar:
            corpus_uids: set[str] = set()
            if cfg.from_base:
                # the base's pretraining corpus, regenerated from its manifest: the rows of the more-SFT
                # baseline and of RL's replay batches, and the tasks RL prompts must not repeat
                self.base = pretrain.load_base(cfg.base_dir)
                self.tok = self.base.tokenizer
                self.codec = demo_data.make_codec(self.tok, self.base.config.rehearse_tool_descriptions)
                self.demos = self.base.demonstrations()
                self.rows = self.base.corpus_rows(self.demos, self.codec)
                corpus_uids = self.base.corpus_uids(self.rows, self.demos)
                self.base.copy_tokenizer(os.path.join(self.run_dir, "tokenizer"))
            bar.update(1)
            splits = demo_data.generate_splits(cfg, exclude_uids=corpus_uids)
            bar.update(1)
            self.splits = demo_data.write_and_read(splits, os.path.join(self.run_dir, "data"))
            bar.update(1)
            train = self.splits["train"]
            if cfg.from_base:
                self.rl_tasks = train
            else:
                self.demos, self.rl_tasks = train[: cfg.sft_tasks], train[cfg.sft_tasks :]
                self.tok = demo_data.build_tokenizer(
                    self.demos + self.rl_tasks, os.path.join(self.run_dir, "tokenizer"), cfg.vocab_size
                )
                self.codec = demo_data.make_codec(self.tok)
            bar.update(1)
        self.eval_tasks = self.splits[cfg.eval_split]
        if cfg.from_base:
            self.model = self.base.model()
        else:
            self.model = stages.build_model(cfg, len(self.tok))
            self.rows = demo_data.sft_rows(
                self.demos, self.codec, cfg.world_model_rows, cfg.seed, exclude_uids={t["uid"] for t in self.rl_tasks}
            )
        self.max_len = cfg.train_len

    def _sft_stream(self, seed: int, roles: tuple[str, ...] = ROLES):
        """Role-balanced batches of the warm-start rows of ``roles`` (the SFT stage and RL's replay batches)."""
        rows = [r for r in self.rows if r.role in roles]
        return stages.sft_batches(rows, min(self.cfg.sft_batch_rows, len(rows)), seed)

    def replay_stream(self):
        """RL's replay batches (``rl_replay_batches`` after each step) of the corpus rows of ``rl_replay_roles``."""
        cfg = self.cfg
        if not cfg.rl_replay_batches:
            return None
        return self._sft_stream(cfg.rl_stream_seed + 2, REPLAY_ROLES[cfg.rl_replay_roles])

    def sft(self) -> None:
        """The SFT stage (``sft_steps`` on the warm-start rows; none when RL starts from a base). Its end
        is the start of RL and of the more-SFT baseline."""
        cfg = self.cfg
        lr = (cfg.more_sft_lr or cfg.sft_lr) if cfg.from_base else cfg.sft_lr
        self.sft_trainer = stages.make_trainer(self.model, cfg, lr, 0 if cfg.from_base else cfg.sft_warmup)
        self.sft_stream = self._sft_stream(cfg.seed)
        self.sft_log = []
        if cfg.sft_steps:
            with self.clock("sft"), _bar(cfg.sft_steps, "sft", self.progress) as bar:

                def on_step(k, m):
                    self.sft_log.append({"step": k, **m})
                    bar.update(1)
                    bar.set_postfix(nll_act=f"{m.get('nll/act', 0):.3f}", nll_reh=f"{m.get('nll/rehearse', 0):.3f}")

                stages.run_sft(self.sft_trainer, self.sft_stream, self.max_len, steps=cfg.sft_steps, on_step=on_step)
        self.sft_params = stages.snapshot(self.model)
        self.sft_state = stages.host_copy(self.sft_trainer.state_dict())

    def evaluate(self, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
        cfg = self.cfg
        with self.clock(f"eval {tag}"), _bar(len(self.eval_tasks), f"eval {tag} (real tools)", self.progress) as bar:
            res = stages.evaluate_real(cfg, self.model, self.codec, self.eval_tasks, progress=bar.update)
            # per-task outcomes, so any two arms can be compared task by task (eval.paired)
            self.outcomes[tag] = paired.outcomes_of(res.uids, res.scores)
            paired.write_outcomes(self.run_dir, tag, self.outcomes[tag])
            # the fidelity tasks keep the split's branch mix, so error responses are represented
            fid = stages.evaluate_fidelity(
                cfg, self.rehearse_model or self.model, self.codec, self.eval_tasks[: cfg.fidelity_tasks]
            )
        with open(os.path.join(self.run_dir, f"fidelity_{tag}.md"), "w") as f:
            f.write(fid.to_markdown())
        with open(os.path.join(self.run_dir, f"fidelity_{tag}.json"), "w") as f:
            f.write(fid.to_json(with_calls=True))
        with open(os.path.join(self.run_dir, f"eval_{tag}_samples.json"), "w") as f:
            json.dump(res.samples, f, indent=1, ensure_ascii=False, default=str)
        return rep.eval_summary(res), rep.fidelity_summary(fid)

    def rl(self, mode: str, tag: str = "rl") -> list[dict[str, Any]]:
        """RL from the SFT start in ``mode``; the model is left at the RL result."""
        from envace_jax.data.pipeline import PipelineConfig, PromptIterator

        cfg = self.cfg
        stages.restore(self.model, self.sft_params)
        if cfg.lora_rank:  # adapters on the start; folded into its weights when RL ends (finally, below)
            from envace_jax.models import lora

            lora.add_adapters(self.model, cfg.lora_rank, cfg.lora_alpha or 2.0 * cfg.lora_rank, seed=cfg.rl_stream_seed)
        trainer = stages.make_trainer(self.model, cfg, cfg.rl_lr, 0, rl=True)
        trainers: dict[str, Any] = {role: trainer for role in ROLES}
        sim_model = None
        if mode in ("simulator", "noshare"):
            # simulator: the frozen simulator is a copy of the start; noshare: that copy plays REHEARSE and is
            # trained on REHEARSE rows by its own optimizer, while the policy learns ACT only
            sim_model = stages.build_model(cfg, len(self.tok))
            stages.restore(sim_model, self.sft_params)
        if mode == "noshare":
            trainers[REHEARSE] = stages.make_trainer(sim_model, cfg, cfg.rl_lr, 0, rl=True)
        self.rehearse_model = sim_model if mode == "noshare" else None
        step, client = stages.make_rl_step(
            cfg.replace(seed=cfg.rl_stream_seed),
            mode,
            self.model,
            self.codec,
            trainers if mode == "noshare" else trainer,
            sim_model,
        )
        prompts = PromptIterator(
            self.rl_tasks,
            PipelineConfig(
                batch_size=cfg.prompts_per_step,
                seed=cfg.rl_stream_seed,
                shuffle=True,
                num_epochs=None,
                shard_index=0,
                shard_count=1,
                read_threads=0,
                prefetch=0,
            ),
            decode=None,
        )
        step.next_records = lambda: next(prompts)  # rl_algorithm="dapo": dynamic sampling's extra batches
        # a share of the prompts with the memory test-time rehearsal would build (demo.rl_memory; off by default)
        rl_cfg = cfg.replace(seed=cfg.rl_stream_seed)
        memory = rl_memory.from_demo(cfg, self.codec, client, stages.rollout_config(rl_cfg, mode, greedy=False))
        replay = self.replay_stream()

        def replay_after(_k: int) -> dict[str, float]:
            out: dict[str, float] = {}
            for _ in range(cfg.rl_replay_batches):
                out.update(self._replay(next(replay), trainers))
            return out

        # rl_max_staleness >= 1: later steps' rollouts run while this one trains (rl.async_pipeline); the replay
        # batches go in before the new weights are copied out, as they would between synchronous steps
        pipe = None
        if cfg.rl_max_staleness:
            from envace_jax.rl.async_pipeline import AsyncPipeline

            pipe = AsyncPipeline(
                step,
                max_staleness=cfg.rl_max_staleness,
                next_records=lambda: next(prompts),
                make_client=lambda model, programs_of: stages.make_client(
                    model, self.codec, rl_cfg, programs_of=programs_of
                ),
                total_steps=cfg.rl_steps,
                after_update=replay_after,
            )
        log = []
        self.curves[tag] = []
        clock = self.clock(tag)
        try:
            with _bar(cfg.rl_steps, f"RL [{mode}]", self.progress) as bar:
                for it in range(cfg.rl_steps):
                    with clock:
                        if pipe is not None:
                            m = {"step": it + 1, **pipe(it).metrics}
                        else:
                            batch, memory_metrics = next(prompts), {}
                            if memory is not None:
                                batch, memory_metrics = memory(batch, it)
                                client.reset()  # the imagined episodes' cached rows are of no use to the rollouts
                            res = step(batch, it)
                            client.reset()
                            m = {"step": it + 1, **res.metrics, **memory_metrics}
                            m.update(replay_after(it))
                    log.append(m)
                    bar.update(1)
                    post = dict(act=f"{m.get('act/reward_mean', 0):.3f}", reh=f"{m.get('rehearse/reward_mean', 0):.3f}")
                    if cfg.rl_eval_every and (it + 1) % cfg.rl_eval_every == 0 and it + 1 < cfg.rl_steps:
                        point = self.curve_point(it + 1, tag)
                        post["success"] = f"{point['success']:.3f}"
                    bar.set_postfix(**post)
        finally:
            if pipe is not None:
                pipe.close()
            if cfg.lora_rank:  # a plain model again: evaluation, the more-SFT baseline and exports read it as such
                from envace_jax.models import lora

                lora.merge_into_base(self.model)
        with open(os.path.join(self.run_dir, f"metrics_{tag}.jsonl"), "w") as f:
            for m in log:
                f.write(json.dumps({k: (v if v == v else None) for k, v in m.items()}) + "\n")
        return log

    def _replay(self, rows, trainers) -> dict[str, float]:
        """One replay batch: each role's rows update the model that plays that role (one model but in
        ``noshare``)."""
        out = {}
        by_trainer: dict[int, list] = {}
        for r in rows:
            by_trainer.setdefault(id(trainers[r.role]), []).append(r)
        for key, part in by_trainer.items():
            trainer = next(t for t in trainers.values() if id(t) == key)
            roles = {r.role for r in part}
            res = trainer.update(stages.sft_batch(part, self.max_len), kind="sft")
            # a role's NLL from the update that saw its rows (the other update has none of them)
            out.update({f"replay/{k}": v for k, v in res.items() if k.startswith("nll/") and k[4:] in roles})
        return out

    def curve_point(self, step: int, tag: str) -> dict[str, Any]:
        """Greedy real-tool success of the current model on the eval split after ``step`` RL steps (a point of
        the learning curve), timed apart from the RL stage. Evaluation samples greedily with its own client,
        so RL's sampling and updates are the same with or without it."""
        with self.clock(f"{tag} curve"):
            ev = rep.eval_summary(stages.evaluate_real(self.cfg, self.model, self.codec, self.eval_tasks))
        point = rep.curve_point(step, ev)
        self.curves[tag].append(point)
        return point

    def curve(self, tag: str, before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
        """The learning curve of RL run ``tag``: the start, the points of ``rl_eval_every``, the end."""
        return [rep.curve_point(0, before)] + self.curves.get(tag, []) + [rep.curve_point(self.cfg.rl_steps, after)]

    def more_sft(self, seconds: float) -> int:
        self.rehearse_model = None
        stages.restore(self.model, self.sft_params)
        self.sft_trainer.load_state_dict(
            stages.jax.tree.map(lambda x: stages.jnp.asarray(x) if isinstance(x, np.ndarray) else x, self.sft_state)
        )
        with self.clock("more sft"):
            out = stages.run_sft(self.sft_trainer, self.sft_stream, self.max_len, seconds=seconds)
        return len(out)

    # ------------------------------------------------------------------ summary
    def base_summary(self) -> dict[str, Any]:
        cfg, mc = self.cfg, self.model.config
        by_role = collections.Counter(r.role for r in self.rows)
        branch_share = lambda tasks: {
            b: sum(t.get("branch") == b for t in tasks) / max(1, len(tasks)) for b in BRANCHES
        }
        return {
            "config": cfg.__dict__,
            "eval_split": cfg.eval_split,
            "rl_mode": cfg.rl_mode,
            "start": ("base" if cfg.from_base else "sft"),
            "base": (
                None
                if not cfg.from_base
                else {
                    "dir": cfg.base_dir,
                    "pretrain_steps": self.base.config.steps,
                    "pretrain_config": dataclasses.asdict(self.base.config),
                    "validation": self.base.manifest.get("validation"),
                }
            ),
            "model": {
                "params": int(mc.num_params()),
                "layers": mc.num_layers,
                "hidden": mc.hidden_size,
                "vocab": len(self.tok),
            },
            "data": {
                "sft_tasks": len(self.demos),
                "rl_tasks": len(self.rl_tasks),
                "sft_rows": len(self.rows),
                "sft_rows_by_role": {r: by_role.get(r, 0) for r in ROLES},
                "branch_share": {
                    "demonstrations": branch_share(self.demos),
                    "rl_prompts": branch_share(self.rl_tasks),
                    "eval": branch_share(self.eval_tasks),
                },
                # push-backs no tool error announces (demo.data.silent_push_back), per set
                "silent_push_back_share": {
                    name: sum(map(demo_data.silent_push_back, tasks)) / max(1, len(tasks))
                    for name, tasks in (
                        ("demonstrations", self.demos),
                        ("rl_prompts", self.rl_tasks),
                        ("eval", self.eval_tasks),
                    )
                },
            },
            "rl": {
                "steps": cfg.rl_steps,
                "prompts_per_step": cfg.prompts_per_step,
                "n_rollouts": cfg.n_rollouts,
                "lr": cfg.rl_lr,
                "replay_batches": cfg.rl_replay_batches,
                "replay_roles": cfg.rl_replay_roles,
                "silent_odds": cfg.rl_silent_odds,
            },
            "test_episodes": len(self.eval_tasks),
        }


def rl_train_stats(log: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over RL steps of what the training rollouts looked like (why a reward did or did not vary)."""
    if not log:
        return {}
    keys = sorted(
        {k for m in log for k in m if k.startswith("termination/")}
        | {"episode/score_mean", "act/rows", "rehearse/rows", "act/reward_mean", "rehearse/reward_mean"}
    )
    out = {k: float(np.mean([m.get(k) or 0.0 for m in log])) for k in keys}
    half = max(1, len(log) // 2)
    out["score_first_half"] = float(np.mean([m.get("episode/score_mean", 0.0) for m in log[:half]]))
    out["score_second_half"] = float(np.mean([m.get("episode/score_mean", 0.0) for m in log[half:]] or [0.0]))
    return out


def run_demo(cfg: DemoConfig, run_dir: str, *, progress: bool = True) -> dict[str, Any]:
    d = Demo(cfg, run_dir, progress)
    d.prepare()
    d.sft()
    ev_b, fid_b = d.evaluate("before")
    log = d.rl(cfg.rl_mode)
    ev_a, fid_a = d.evaluate("after")
    from envace_jax.demo.rehearsal_table import export_model

    export_model(d.model, run_dir, d.codec)  # the RL result, for launch/demo.py --rehearsal_sweep and outside use
    s = d.base_summary()
    s["eval"] = {"before": ev_b, "after": ev_a}
    s["fidelity"] = {"before": fid_b, "after": fid_a}
    s["more_sft_success"], s["more_sft_success_ci"], s["more_sft_steps"] = None, None, 0
    if cfg.more_sft:
        s["more_sft_steps"] = d.more_sft(d.timing["rl"].wall)
        ev_m, fid_m = d.evaluate("more_sft")
        s["eval"]["more_sft"], s["fidelity"]["more_sft"] = ev_m, fid_m
        s["more_sft_success"], s["more_sft_success_ci"] = ev_m["success"], ev_m["success_ci"]
    s.update(
        real_success_before=ev_b["success"],
        real_success_after=ev_a["success"],
        real_success_ci_before=ev_b["success_ci"],
        real_success_ci_after=ev_a["success_ci"],
        real_score_before=ev_b["score"],
        real_score_after=ev_a["score"],
        fidelity_before=fid_b["overall"]["exact"],
        fidelity_after=fid_a["overall"]["exact"],
        fidelity_field_before=fid_b["overall"]["field"],
        fidelity_field_after=fid_a["overall"]["field"],
    )
    for tag, ev, fid in (("before", ev_b, fid_b), ("after", ev_a, fid_a)):
        s[f"success_by_branch_{tag}"] = ev["success_by_branch"]
        s[f"success_by_push_back_kind_{tag}"] = ev["success_by_push_back_kind"]
        s[f"fidelity_state_changing_{tag}"] = fid["kinds"]["fidelity_state_changing"]
        s[f"fidelity_read_only_{tag}"] = fid["kinds"]["fidelity_read_only"]
        s[f"optimistic_hallucination_{tag}"] = fid["kinds"]["optimistic_hallucination"]
        s[f"pessimistic_hallucination_{tag}"] = fid["kinds"]["pessimistic_hallucination"]
    if cfg.more_sft:
        s["more_sft_success_by_branch"] = s["eval"]["more_sft"]["success_by_branch"]
    # task-by-task comparisons of the arms (eval.paired), beside the per-arm intervals above
    s["paired"] = arms.paired_section(d.outcomes, arms.DEMO_PAIRS)[1]
    s["rl"]["train"] = rl_train_stats(log)
    s["rl"]["curve"] = d.curve("rl", ev_b, ev_a)
    s["timing"] = {k: v.as_dict() for k, v in d.timing.items()}
    s["timing"]["total"] = {
        "wall_s": round(sum(v.wall for v in d.timing.values()), 2),
        "cpu_s": round(sum(v.cpu for v in d.timing.values()), 2),
    }
    rep.check_summary(s)
    rep.write_report(run_dir, s, log)
    return s


def run_compare(
    cfg: DemoConfig, run_dir: str, *, progress: bool = True, modes: tuple[str, ...] = arms.COMPARE_MODES
) -> dict[str, Any]:
    """The same RL budget from one start in each mode (real tools, frozen simulator, no sharing, world
    rehearsal), plus more SFT for the last mode's wall time; one table (compare.md/.json) with success per
    branch kind and the share of the real-tools gain each recovers, and the paired table of each arm against
    the start (and rehearsal against real tools and more SFT) on the same tasks."""
    unknown = [m for m in modes if m not in arms.MODE_LABELS]
    if unknown:
        raise ValueError(f"run_compare: unknown RL mode(s) {unknown}; known: {sorted(arms.MODE_LABELS)}")
    d = Demo(cfg, run_dir, progress)
    d.prepare()
    d.sft()
    ev_b, fid_b = d.evaluate("before")
    out: dict[str, Any] = {"before": {"eval": ev_b, "fidelity": fid_b}, "modes": {}}
    results = [("start (" + ("base" if cfg.from_base else "SFT") + ")", None, ev_b, fid_b)]
    for mode in modes:
        log = d.rl(mode, tag=f"rl_{mode}")
        ev, fid = d.evaluate(arms.compare_arm(mode))
        wall = d.timing[f"rl_{mode}"].wall
        out["modes"][mode] = {
            "eval": ev,
            "fidelity": fid,
            "rl_wall_s": wall,
            "train_reward_last": log[-1].get("episode/score_mean") if log else None,
            "curve": d.curve(f"rl_{mode}", ev_b, ev),
        }
        results.append((arms.MODE_LABELS[mode], wall, ev, fid))
    if cfg.more_sft:
        wall = d.timing[f"rl_{modes[-1]}"].wall
        steps = d.more_sft(wall)
        ev, fid = d.evaluate("more_sft")
        out["more_sft"] = {"eval": ev, "fidelity": fid, "wall_s": wall, "steps": steps}
        results.append(("more SFT", wall, ev, fid))
    real_gain = out["modes"]["real"]["eval"]["success"] - ev_b["success"] if "real" in out["modes"] else None
    branches = sorted(ev_b["success_by_branch"])
    kinds = sorted(ev_b["success_by_push_back_kind"])
    rows = []
    for name, wall, ev, fid in results:
        gain = ev["success"] - ev_b["success"]
        share = "-" if wall is None or not real_gain or real_gain <= 0 else f"{gain / real_gain:.2f}"
        rows.append(
            [name, "-" if wall is None else f"{wall:.0f}", f"{ev['success']:.3f}", rep._fmt_ci(ev["success_ci"])]
            + [f"{ev['success_by_branch'][b]:.3f}" for b in branches]
            + [f"{ev['success_by_push_back_kind'].get(k, float('nan')):.3f}" for k in kinds]
            + [
                f"{ev['score']:.3f}",
                f"{fid['overall']['exact']:.3f}",
                f"{fid['kinds']['optimistic_hallucination']:.3f}",
                share,
                "-" if wall is None else ("yes" if rep.cis_separate(ev["success_ci"], ev_b["success_ci"]) else "no"),
            ]
        )
    out["real_gain_recovered"] = {
        name: (ev["success"] - ev_b["success"]) / real_gain
        for name, wall, ev, _ in results[1:]
        if real_gain and real_gain > 0
    }
    header = (
        ["model", "wall s", "real success", "95% CI"]
        + [f"success {b}" for b in branches]
        + [f"push-back, {k}" for k in kinds]
        + ["score", "REHEARSE exact", "optimistic halluc.", "share of real-tools gain", "CI apart from start"]
    )
    text = rep.table(rows, header)
    paired_text, out["paired"] = arms.paired_section(d.outcomes, arms.COMPARE_PAIRS)
    title = f"RL modes from one start ({cfg.eval_split} split, {len(d.eval_tasks)} real-tool episodes)"
    arms.write_comparison(run_dir, "compare", title, text, paired_text, out)
    return out


def run_leverage(cfg: DemoConfig, run_dir: str, *, ks: tuple[int, ...] = (1, 4, 16), progress: bool = True):
    """Greedy success and pass@k at the training temperature of the RL start, per branch kind and task type
    (``leverage.md``): what RL can sharpen."""
    from envace_jax.demo.leverage import measure_leverage

    d = Demo(cfg, run_dir, progress)
    d.prepare()
    d.sft()

    def run_real(tasks, temperature, seed):
        c = cfg.replace(seed=cfg.seed * 1000 + seed)
        return stages.evaluate_real(c, d.model, d.codec, tasks, greedy=temperature == 0).successes

    with d.clock("leverage"), _bar(max(ks), f"pass@k (T={cfg.temperature:g})", progress) as bar:
        table = measure_leverage(run_real, d.eval_tasks, ks=ks, temperature=cfg.temperature, progress=bar.update)
    text = (
        f"# Leverage of the RL start ({cfg.eval_split} split, {len(d.eval_tasks)} tasks, real tools)\n\n"
        f"Greedy success and pass@k over {table.samples} samples per task at the training temperature.\n\n"
        + table.to_markdown()
    )
    with open(os.path.join(run_dir, "leverage.md"), "w") as f:
        f.write(text)
    with open(os.path.join(run_dir, "leverage.json"), "w") as f:
        json.dump(
            nan_to_none({"ks": list(table.ks), "temperature": table.temperature, "rows": table.rows}),
            f,
            indent=1,
            allow_nan=False,
        )
    return table
