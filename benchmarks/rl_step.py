"""The demo's RL step at its default shapes, every second accounted for, lockstep against rolling batch.

    python benchmarks/rl_step.py [--steps 3] [--workload demo|long_tail|both] [--cache_dir runs/bench_rl]
    python benchmarks/rl_step.py --compare prefill   # rolling batch: split prefill against one-call prefill

Builds the demo as ``make demo`` does (data, tokenizer, the default 0.5M-parameter model) and warm-starts
it with the demo's SFT (cached in ``--cache_dir``, so later runs skip it). Then it runs RL steps of the
demo (``demo/stages.make_rl_step``: rehearsal mode, 8 prompts x 4 rollouts, T = 0.6), alternating the
lockstep engine (one sampler call per micro-step, every call decoding until its longest row ends) and
the rolling batch (``RollingSamplerClient``: at most ``--slots`` rows, a finished row's slot goes to the
next waiting request). Every step starts from the same SFT parameters and optimizer state, so the two
engines see the same prompts and weights.

Per step it prints seconds in each phase:
  act / rehearse sampling: the sampler's prefill and decode seconds (measured with ``Sampler.timed``);
    a call that mixes both roles splits its prefill seconds by the rows' prefill tokens and its decode
    seconds by their generated tokens;
  judge: the turn judge; old log-probs: the recompute with the pre-update policy; update: the PPO step;
  host: everything else (episode bookkeeping, parsing, tokenizing, building batches, client planning);
and the sampler's slot utilisation, generated tokens / (batch rows x decode steps), over the step.

Workloads: ``demo`` is the demo's RL step; ``long_tail`` is the same step with T = 1.0, 160 new tokens
per generation and up to 16 micro-steps: most generations still stop after a few dozen tokens, the
few that do not run on, and some episodes take many more turns, so a lockstep call or batch waits on
its slowest row. Episodes per second count the rollout phase (sampling, judge and host work of the
rollout); the update phases are the same work in both engines.

``--compare refill`` runs the rolling batch with and without ``eager_refill`` (a call returns once a
quarter of its rows finished even when no request waits yet, so their episodes' next requests join;
the demo's default). ``--batch_buckets 8,16,32,...`` overrides the batch sizes the sampler pads a call
to. Each line also counts the step's sampler calls and the programs traced in it (a new shape bucket:
compiled, or loaded from the persistent cache), which inflate the first steps.
``--compare update`` runs the rolling batch with the update's exact shortcuts off (old log-probs
recomputed by a second pass, every row through the backward pass: the reference) and on (the demo's
default: old log-probs from the update's own pass, rows without advantage left out); the two arms take
the same optimizer steps (tests/rl/test_update_shortcuts.py).
``--compare gather`` runs the rolling batch with the update's vocabulary head at every position
(``Trainer(gather_trained=False)``) and at the trained positions only (the default); the same
optimizer steps up to float32 summation order (tests/rl/test_gathered_head.py).
``--compare prefill`` runs the rolling batch twice instead, with the sampler's split prefill
(``Sampler(split_prefill=True)``, the default: a call whose rows write very different lengths prefills
them in sub-batches) and with one-call prefill, and adds the prefill slot efficiency (tokens written /
slots computed) to each line.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PHASES = ("act", "rehearse", "judge", "old_logprobs", "update", "host")


class Meter:
    """Wraps the pieces of one RL step to time them (see the module docstring)."""

    def __init__(self, client, engine, trainer):
        self.client, self.engine, self.trainer = client, engine, trainer
        self.sampler = client.sampler
        self.sampler.timed = True
        self.t = dict.fromkeys(PHASES, 0.0)
        self._wrap()

    def _wrap(self):
        from envace_jax.rl.types import ACT

        client, sampler, t = self.client, self.sampler, self.t
        fn_name = "step" if hasattr(client, "step") else "generate"
        inner = getattr(client, fn_name)

        def timed_call(*a, **k):
            st = sampler.stats
            p0, d0, n_calls = st.prefill_s, st.decode_s, len(client.calls)
            out = inner(*a, **k)
            prefill, decode = st.prefill_s - p0, st.decode_s - d0
            rows = [r for c in client.calls[n_calls:] for r in c.row_tokens]  # (role, prefill, generated)
            pt = sum(r[1] for r in rows) or 1
            gt = sum(r[2] for r in rows) or 1
            for role, p, g in rows:
                key = "act" if role == ACT else "rehearse"
                t[key] += prefill * p / pt + decode * g / gt
            return out

        setattr(client, fn_name, timed_call)
        judge = self.engine.judge

        def timed_judge(eps):
            t0 = time.perf_counter()
            try:
                return judge(eps)
            finally:
                t["judge"] += time.perf_counter() - t0

        self.engine.judge = timed_judge
        for name, phase in (("compute_logprobs", "old_logprobs"), ("update", "update")):
            f = getattr(self.trainer, name)

            def timed(*a, _f=f, _p=phase, **k):
                t0 = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    t[_p] += time.perf_counter() - t0

            setattr(self.trainer, name, timed)

    def reset(self):
        for k in self.t:
            self.t[k] = 0.0
        st = self.sampler.stats
        self._slot0, self._gen0 = st.slot_steps, st.generated_tokens
        self._pslot0, self._ptok0 = st.prefill_slots, st.prefill_tokens

    def utilisation(self) -> float:
        st = self.sampler.stats
        return (st.generated_tokens - self._gen0) / max(1, st.slot_steps - self._slot0)

    def prefill_efficiency(self) -> float:
        st = self.sampler.stats
        return (st.prefill_tokens - self._ptok0) / max(1, st.prefill_slots - self._pslot0)


def build(cfg, cache_dir: str):
    """The demo's pieces with the SFT warm start (cached)."""
    from envace_jax.demo import stages
    from envace_jax.demo.pipeline import Demo

    demo = Demo(cfg, cache_dir, progress=False)
    demo.prepare()
    path = os.path.join(cache_dir, f"sft_params_{cfg.sft_steps}.npz")
    if os.path.exists(path):
        flat = dict(np.load(path))
        leaves = [flat[f"a{i}"] for i in range(len(flat))]
        import jax

        snap = jax.tree.unflatten(jax.tree.structure(stages.snapshot(demo.model)), leaves)
        stages.restore(demo.model, snap)
        print(f"SFT warm start loaded from {path}", flush=True)
    else:
        t0 = time.perf_counter()
        demo.sft()
        import jax

        np.savez(path, **{f"a{i}": x for i, x in enumerate(jax.tree.leaves(stages.snapshot(demo.model)))})
        print(f"SFT warm start: {cfg.sft_steps} steps in {time.perf_counter() - t0:.0f}s, saved to {path}", flush=True)
    return demo


class Arm:
    """One engine (lockstep or rolling) on one workload, built once so its programs compile once; every
    step starts from the same SFT parameters and a fresh optimizer state."""

    def __init__(
        self,
        demo,
        cfg,
        rolling: bool,
        slots: int,
        split_prefill: bool = True,
        eager_refill: bool | None = None,
        batch_buckets: tuple[int, ...] | None = None,
        update_shortcuts: bool | None = None,
        gather_trained: bool = True,
    ):
        from envace_jax.demo import stages

        if update_shortcuts is not None:  # None: the demo's setting
            cfg = cfg.replace(rl_update_shortcuts=update_shortcuts)
        self.demo, self.stages = demo, stages
        self.params = stages.snapshot(demo.model)
        self.trainer = stages.make_trainer(demo.model, cfg, cfg.rl_lr, 0)
        self.trainer.gather_trained = gather_trained
        self.opt0 = stages.host_copy(self.trainer.state_dict())
        self.step, self.client = stages.make_rl_step(
            cfg.replace(rolling=rolling, rolling_slots=slots), cfg.rl_mode, demo.model, demo.codec, self.trainer
        )
        self.client.sampler.split_prefill = split_prefill
        if batch_buckets:
            self.client.sampler.batch_buckets = batch_buckets
        if rolling and eager_refill is not None:  # None: the demo's setting
            self.client.eager_refill = eager_refill
        self.meter = Meter(self.client, self.step.engine, self.trainer)
        self._rollout = self.step.rollout

    def run(self, records, iteration: int):
        """(phase seconds, rollout seconds, step seconds, episodes, utilisation, generation lengths,
        micro-steps per episode) of one RL step."""
        import jax
        import jax.numpy as jnp

        st = self.stages
        st.restore(self.demo.model, self.params)
        self.trainer.load_state_dict(
            jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, self.opt0)
        )
        self.client.reset()
        self.meter.reset()
        c0, n0 = self.client.sampler.num_compilations, len(self.client.calls)
        t0 = time.perf_counter()
        episodes = self._rollout(records, iteration)
        t_roll = time.perf_counter() - t0
        self.step.rollout = lambda *_: episodes  # the rest of RLStep.__call__ on these episodes
        try:
            self.step(records, iteration)
        finally:
            self.step.rollout = self._rollout
        total = time.perf_counter() - t0
        ph = dict(self.meter.t)
        ph["host"] = total - sum(v for k, v in ph.items() if k != "host")
        lens = [len(g.gen_ids) for e in episodes for g in e.generations]
        return (
            ph,
            t_roll,
            total,
            len(episodes),
            self.meter.utilisation(),
            lens,
            [e.steps for e in episodes],
            self.meter.prefill_efficiency(),
            self.client.sampler.num_compilations - c0,
            len(self.client.calls) - n0,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="RL steps per engine and workload (alternating)")
    ap.add_argument("--workload", default="both", choices=["demo", "long_tail", "both"])
    ap.add_argument("--slots", type=int, default=32, help="rows of the rolling batch")
    ap.add_argument("--cache_dir", default="runs/bench_rl")
    ap.add_argument(
        "--compare",
        default="engines",
        choices=["engines", "prefill", "refill", "update", "gather"],
        help="engines: lockstep vs rolling batch; prefill: rolling batch, one-call vs split prefill; "
        "refill: rolling batch, refill only for waiting requests vs eager refill; "
        "update: rolling batch, the update's exact shortcuts off vs on; "
        "gather: rolling batch, vocabulary head at every position vs trained positions only",
    )
    ap.add_argument(
        "--batch_buckets",
        default="",
        help="comma-separated batch sizes the sampler rounds a call up to (default: the demo's)",
    )
    ap.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="rerun this process with glibc keeping freed memory, as `make demo` runs (envace_jax/host_memory.py)",
    )
    args = ap.parse_args()
    from envace_jax import host_memory

    if args.retain_freed_memory:
        host_memory.retain_freed_memory()
    print(host_memory.describe())
    bb = tuple(int(x) for x in args.batch_buckets.split(",")) if args.batch_buckets else None

    import jax

    jax.config.update(
        "jax_compilation_cache_dir", os.environ.get("ENVACE_JAX_CACHE", os.path.abspath("runs/.jax_cache"))
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    from envace_jax.demo.config import default

    base = default()
    demo = build(base, args.cache_dir)
    workloads = {
        "demo": base,
        "long_tail": base.replace(temperature=1.0, act_max_new_tokens=160, rehearse_max_new_tokens=160, max_steps=16),
    }
    if args.workload != "both":
        workloads = {args.workload: workloads[args.workload]}
    tasks = demo.rl_tasks
    for name, cfg in workloads.items():
        print(
            f"\n== workload {name}: {cfg.prompts_per_step} prompts x {cfg.n_rollouts} rollouts, T={cfg.temperature}, "
            f"max_new_tokens {cfg.act_max_new_tokens}, max_steps {cfg.max_steps}, rolling slots {args.slots}",
            flush=True,
        )
        rows = {False: [], True: []}
        if args.compare == "prefill":  # False: one-call prefill, True: split prefill (both rolling)
            arms = {r: Arm(demo, cfg, True, args.slots, split_prefill=r, batch_buckets=bb) for r in (False, True)}
            names = {False: "one-call prefill", True: "split prefill"}
        elif args.compare == "refill":
            arms = {r: Arm(demo, cfg, True, args.slots, eager_refill=r, batch_buckets=bb) for r in (False, True)}
            names = {False: "refill when waiting", True: "eager refill"}
        elif args.compare == "update":
            arms = {r: Arm(demo, cfg, True, args.slots, batch_buckets=bb, update_shortcuts=r) for r in (False, True)}
            names = {False: "two-pass update", True: "update shortcuts"}
        elif args.compare == "gather":
            arms = {r: Arm(demo, cfg, True, args.slots, batch_buckets=bb, gather_trained=r) for r in (False, True)}
            names = {False: "head at every position", True: "head at trained positions"}
        else:
            arms = {r: Arm(demo, cfg, r, args.slots, batch_buckets=bb) for r in (False, True)}
            names = {False: "lockstep", True: "rolling"}
        for it in range(args.steps + 1):  # the first round compiles
            records = [tasks[(it * cfg.prompts_per_step + i) % len(tasks)] for i in range(cfg.prompts_per_step)]
            # The arm that meets a step's new shapes first compiles them (the other may load them from the
            # persistent cache), so the order alternates step by step.
            for rolling in (False, True) if it % 2 == 0 else (True, False):
                ph, t_roll, total, n, util, lens, steps, pre, compiles, calls = arms[rolling].run(records, it)
                tag = names[rolling]
                print(
                    f"{'(compile) ' if it == 0 else ''}step {it} {tag}: total {total:6.1f}s, rollout {t_roll:6.1f}s "
                    f"({n / t_roll:5.2f} episodes/s), slot utilisation {100 * util:4.1f}%, prefill slot "
                    f"efficiency {100 * pre:4.1f}%, {calls} sampler calls, {compiles} programs traced | "
                    + " ".join(f"{k} {v:5.1f}" for k, v in ph.items())
                    + f" | gen len p50 {np.median(lens):.0f} p90 {np.percentile(lens, 90):.0f} max {max(lens)}, "
                    f"micro-steps p50 {np.median(steps):.0f} max {max(steps)}",
                    flush=True,
                )
                if it > 0:
                    rows[rolling].append((n / t_roll, util, total, ph, pre))
        if not rows[False]:
            continue
        eps = {r: float(np.median([x[0] for x in v])) for r, v in rows.items()}
        util = {r: float(np.median([x[1] for x in v])) for r, v in rows.items()}
        pre = {r: float(np.median([x[4] for x in v])) for r, v in rows.items()}
        gain = float(np.median([b[0] / a[0] for a, b in zip(rows[False], rows[True])]))
        step_gain = float(np.median([a[2] / b[2] for a, b in zip(rows[False], rows[True])]))
        print(
            f"{name}: episodes/s {names[False]} {eps[False]:.2f}, {names[True]} {eps[True]:.2f} (median per-step "
            f"ratio {gain:.2f}x; whole step {step_gain:.2f}x); slot utilisation {100 * util[False]:.1f}% / "
            f"{100 * util[True]:.1f}%; prefill slot efficiency {100 * pre[False]:.1f}% / {100 * pre[True]:.1f}%"
        )
        for r, v in rows.items():
            mean = {k: float(np.median([x[3][k] for x in v])) for k in PHASES}
            tot = float(np.median([x[2] for x in v]))
            print(
                f"  {names[r]} phase medians (s): "
                + ", ".join(f"{k} {x:.1f}" for k, x in mean.items())
                + f"; step {tot:.1f}"
            )


if __name__ == "__main__":
    main()
