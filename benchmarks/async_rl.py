"""Steps per second of the RL loop at ``rl.max_staleness`` 0, 1 and 2, with a judge of chosen latency; the phase
timeline of a step (generation, judge wait, update, idle) as a plot and a table.

    python benchmarks/async_rl.py --out runs/async_rl                      # both arms, latencies 0, 0.25, 1 s
    python benchmarks/async_rl.py --arms demo_cpu --latencies 1 --staleness 0,1 --steps 10

Arms:
  ``demo_cpu``: ``configs/demo_cpu.py`` as it ships (a random 2-layer Qwen3, 2 prompts x 2 rollouts, lockstep
    rollouts), its judge turned into ``judge.kind=http`` pointed at a loopback judge (``rl.loopback_judge``) that
    answers each verdict after ``--latencies`` seconds, ``judge.http.max_concurrency`` at its default.
  ``demo_model``: the demo's shipped base (``assets/demo_base``, the model ``make demo`` starts from) on the demo
    tasks, its tool calls run in the demo worlds (``rollout.mode=real``), 8 prompts x 4 rollouts at T = 0.6,
    the same loopback judge.

Every run is the training loop's own path (``rl.train.build_run``: the synchronous ``RLStep`` at 0, the
``rl.async_pipeline`` with its default correction and judge streaming otherwise) without checkpoints, metrics
files or hooks; the same seed and data in every arm. A step's time is the wall time between the ends of
consecutive steps; the first ``--warmup`` steps are left out. Each (arm, s) first runs once untimed at latency 0
(``--prime``): a run's row shapes repeat for a seed and a lag, so the timed runs find every compiled program in
the persistent cache (they still trace and lower each shape new to the process). The table gives
steps per second over the ``--steps`` measured (their mean step; also the median), the speed-up against ``s = 0``
at the same latency, and the mean per step of: the rollouts' seconds in sampler calls, their seconds waiting for
verdicts (both for the rollouts that step trained on), the update, the trainer idle (waiting for rollouts), and
the seconds spent making programs during the measured steps (tracing and lowering for a row shape new to the
process, even when the compiled program comes from the cache: the reason for a long ``--warmup``).
Writes ``OUT/async_rl.md``, ``.json`` and ``timeline.png`` (the last steps of each ``s`` at the largest latency
of the first arm).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("demo_cpu", "demo_model")


def arm_config(arm: str, latency_url: str, s: int, steps: int, run_dir: str):
    """The ``ExperimentConfig`` of one run."""
    from envace_jax.config import config_from_file, load_config

    c = config_from_file(os.path.join(ROOT, "configs", "demo_cpu.py"))
    c.run_dir = run_dir
    c.total_steps = steps
    c.judge.kind = "http"
    c.judge.http.base_url = latency_url
    c.judge.http.max_attempts = 2
    c.judge.http.timeout_s = 60.0
    c.rl.max_staleness = s
    c.log.progress_bar = c.log.plot = c.log.tensorboard = False
    if arm == "demo_model":
        base = os.path.join(ROOT, "assets", "demo_base")
        c.model.hf_path = os.path.join(base, "model")
        c.tokenizer.path = os.path.join(base, "tokenizer")
        c.data.num_demo_tasks = 512
        c.data.prompts_per_step = 8
        c.rl.n_rollouts = 4
        c.rl.max_row_length = 384
        c.rollout.mode = "real"
        c.rollout.max_steps = 12
        c.rollout.max_assistant_turns = 6
        c.rollout.max_model_len = 768
        c.rollout.act.temperature = c.rollout.rehearse.temperature = 0.6
        c.rollout.act.max_new_tokens = 64
        c.rollout.rehearse.max_new_tokens = 64
        c.rl.micro_batch_size = 16
        c.optim.lr = 3e-4
    elif arm != "demo_cpu":
        raise SystemExit(f"--arms: unknown arm {arm!r}; choose from {ARMS}")
    return load_config(c)


@dataclasses.dataclass
class RunResult:
    arm: str
    latency: float
    s: int
    step_s: list[float]  # measured steps' wall seconds
    phases: dict[str, float]  # mean seconds per measured step
    timeline: list[dict]
    verdicts: int
    compile_s: float = 0.0  # seconds tracing, lowering and compiling (or fetching from the cache) while measured


# Seconds JAX spends making programs (tracing, lowering, compiling or fetching a compiled one from the persistent
# cache), summed from its monitoring events; a step that meets a new row shape pays them, in every process.
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
    "/jax/compilation_cache/cache_retrieval_time_sec",
)
_compile_s = [0.0]


def _on_duration(name: str, secs: float, **_) -> None:
    if name in _COMPILE_EVENTS:
        _compile_s[0] += secs


def run_one(arm: str, latency: float, s: int, warmup: int, steps: int, *, quiet: bool = False) -> RunResult:
    from envace_jax.rl import train as rl_train
    from envace_jax.rl.loopback_judge import LoopbackJudge

    with LoopbackJudge(latency_s=latency) as judge, tempfile.TemporaryDirectory() as d:
        cfg = arm_config(arm, judge.url, s, warmup + steps, d)
        run = rl_train.build_run(cfg)
        t_origin = time.perf_counter()
        timeline: list[dict] = []
        ends, phases = [], []
        compile_at_warmup = _compile_s[0]  # the counter is the process's: earlier runs' seconds are not this one's
        try:
            if run.pipeline is not None:
                run.pipeline.timeline, run.pipeline._t0 = timeline, t_origin
            else:
                engine = run.step_fn.engine
                engine.on_interval = lambda kind, a, b: timeline.append(
                    {"lane": "rollout 0", "kind": kind, "step": k, "t0": a - t_origin, "t1": b - t_origin}
                )
            t_prev = time.perf_counter()
            for k in range(warmup + steps):
                if run.pipeline is not None:
                    res = run.pipeline(k)
                    m = res.metrics
                    ph = {
                        "generate_s": m["async/generate_s"],
                        "judge_wait_s": m["async/judge_wait_s"],
                        "update_s": m["async/update_s"],
                        "idle_s": m["async/idle_s"],
                    }
                else:
                    step = run.step_fn
                    t0 = time.perf_counter()
                    episodes = step.rollout(next(run.data), k)
                    step._release_sampler_weights()
                    t1 = time.perf_counter()
                    step.update(episodes, k)
                    t2 = time.perf_counter()
                    for lane, kind, a, b in (
                        ("rollout 0", "rollout", t0, t1),
                        ("update", "idle", t0, t1),
                        ("update", "update", t1, t2),
                    ):
                        timeline.append({"lane": lane, "kind": kind, "step": k, "t0": a - t_origin, "t1": b - t_origin})
                    ph = {
                        "generate_s": step.engine.timing.get("generate_s", 0.0),
                        "judge_wait_s": step.engine.timing.get("judge_wait_s", 0.0),
                        "update_s": t2 - t1,
                        "idle_s": t1 - t0,
                    }
                t = time.perf_counter()
                if k == warmup - 1:
                    compile_at_warmup = _compile_s[0]
                ends.append(t - t_prev)
                t_prev = t
                phases.append(ph)
                if not quiet:
                    print(f"  {arm} latency {latency:g} s={s} step {k}: {ends[-1]:.2f} s", file=sys.stderr, flush=True)
        finally:
            if run.pipeline is not None:
                run.pipeline.close()
            run.ckpt.close()
            run.writer.close()
        measured = phases[warmup:]
        mean = {key: statistics.fmean(p[key] for p in measured) for key in measured[0]}
        compiled = _compile_s[0] - compile_at_warmup
        return RunResult(arm, latency, s, ends[warmup:], mean, timeline, judge.requests, compiled)


def table(results: list[RunResult]) -> str:
    rows = [
        "| arm | judge latency (s) | s | steps/s | vs s = 0 | mean step (s) | median step (s) | median vs s = 0 "
        "| generate (s) | judge wait (s) | update (s) | trainer idle (s) | verdicts | compiling (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    # Throughput is steps over wall time (the mean step): a lagged run's steps alternate short and long (a step
    # whose rollouts were done early trains at once), so a median would flatter or sink it by parity.
    base = {(r.arm, r.latency): r for r in results if r.s == 0}
    for r in results:
        mean, med = statistics.fmean(r.step_s), statistics.median(r.step_s)
        ref = base.get((r.arm, r.latency))
        ratio = f"{statistics.fmean(ref.step_s) / mean:.2f}x" if ref else "-"
        ratio_med = f"{statistics.median(ref.step_s) / med:.2f}x" if ref else "-"
        p = r.phases
        rows.append(
            f"| {r.arm} | {r.latency:g} | {r.s} | {1 / mean:.2f} | {ratio} | {mean:.2f} | {med:.2f} | {ratio_med} | "
            f"{p['generate_s']:.2f} | {p['judge_wait_s']:.2f} | {p['update_s']:.2f} | {p['idle_s']:.2f} | "
            f"{r.verdicts} | {r.compile_s:.1f} |"
        )
    return "\n".join(rows)


COLORS = {"generate_s": "#4C72B0", "judge_wait_s": "#DD8452", "update": "#55A868", "idle": "#CCCCCC"}


def plot_timeline(results: list[RunResult], path: str, last: int = 4) -> None:
    """One panel per ``s``: the spans of the last ``last`` steps, a lane per rollout slot and one for the
    trainer. Rollout lanes: the whole rollout (outline), sampler calls and waits for verdicts; trainer lane:
    the update and the idle wait for rollouts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(results), 1, figsize=(12, 1.6 + 1.1 * sum(1 + r.s for r in results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        steps = sorted({e["step"] for e in r.timeline})
        keep = set(steps[-last:])
        spans = [e for e in r.timeline if e["step"] in keep]
        t_min = min(e["t0"] for e in spans)
        lanes = sorted({e["lane"] for e in spans if e["lane"] != "update"}) + ["update"]
        for y, lane in enumerate(lanes):
            for e in (e for e in spans if e["lane"] == lane):
                x0, w = e["t0"] - t_min, e["t1"] - e["t0"]
                if e["kind"] == "rollout":
                    ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors="none", edgecolors="black", linewidth=0.8)
                    ax.text(x0 + 0.02, y + 0.25, f"step {e['step']}", fontsize=7)
                else:
                    ax.broken_barh([(x0, w)], (y - 0.3, 0.6), facecolors=COLORS.get(e["kind"], "#999999"))
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([("trainer" if lane == "update" else lane) for lane in lanes])
        mean = statistics.fmean(r.step_s)
        ax.set_title(f"{r.arm}, judge latency {r.latency:g} s, max_staleness = {r.s}: mean step {mean:.2f} s")
        ax.set_xlabel("seconds")
    handles = [
        Patch(color=COLORS["generate_s"], label="sampler calls"),
        Patch(color=COLORS["judge_wait_s"], label="waiting for verdicts"),
        Patch(color=COLORS["update"], label="update"),
        Patch(color=COLORS["idle"], label="trainer idle"),
        Patch(facecolor="none", edgecolor="black", label="a step's rollout"),
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/async_rl")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--latencies", default="0,0.25,1")
    p.add_argument("--staleness", default="0,1,2")
    p.add_argument("--steps", type=int, default=16, help="measured steps per run")
    p.add_argument(
        "--warmup",
        type=int,
        default=12,
        help="steps left out: a new process traces a program for each new row shape, a second or two each",
    )
    p.add_argument(
        "--prime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each (arm, s) once untimed first, so that timed steps fetch compiled programs from the cache",
    )
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    import jax
    import jax.monitoring

    jax.config.update("jax_compilation_cache_dir", os.path.join(a.out, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    arms = [x for x in a.arms.split(",") if x]
    lats = [float(x) for x in a.latencies.split(",")]
    stale = [int(x) for x in a.staleness.split(",")]
    results = []
    for arm in arms:
        for s in stale:
            if a.prime:
                # The row shapes of a step repeat for a seed and a lag whatever the judge's latency, so one run at
                # latency 0 puts every program the timed runs meet into the persistent cache (tracing remains).
                print(f"  {arm} s={s}: priming the compilation cache", file=sys.stderr, flush=True)
                run_one(arm, 0.0, s, a.warmup, a.steps, quiet=True)
            for lat in lats:
                results.append(run_one(arm, lat, s, a.warmup, a.steps))
    results.sort(key=lambda r: (arms.index(r.arm), lats.index(r.latency), r.s))
    text = table(results)
    cpu = _cpu_name()
    header = (
        f"# Asynchronous RL: steps per second by rl.max_staleness and judge latency\n\n"
        f"`python benchmarks/async_rl.py --arms {a.arms} --latencies {a.latencies} --staleness {a.staleness} "
        f"--steps {a.steps} --warmup {a.warmup}` on {cpu} ({os.cpu_count()} cores).\n\n"
    )
    with open(os.path.join(a.out, "async_rl.md"), "w") as f:
        f.write(header + text + "\n")
    with open(os.path.join(a.out, "async_rl.json"), "w") as f:
        json.dump([dataclasses.asdict(r) for r in results], f, indent=1)
    top = max(lats)
    plot_timeline([r for r in results if r.arm == arms[0] and r.latency == top], os.path.join(a.out, "timeline.png"))
    print(header + text)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "this CPU"


if __name__ == "__main__":
    main()
