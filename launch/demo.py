"""``make demo``: the whole EnvACE loop on a tiny Qwen3 on CPU, with a report in --run_dir.

    python launch/demo.py --run_dir=runs/demo                 # default preset, test split reported
    python launch/demo.py --run_dir=runs/val --eval_split=validation   # how the config was chosen
    python launch/demo.py --run_dir=runs/cmp --compare        # RL modes real / simulator / rehearsal
    python launch/demo.py --set rl_steps=10 --set rl_lr=1e-4  # any DemoConfig field
    python launch/demo.py --run_dir=runs/demo --rehearsal_sweep   # test-time rehearsal table, after a run
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envace_jax.demo import config as demo_config  # noqa: E402  (no jax: the flags parse fast)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run_dir", default="runs/demo")
    p.add_argument("--preset", default="default", choices=sorted(demo_config.PRESETS))
    p.add_argument("--eval_split", default=None, choices=["validation", "test"])
    p.add_argument("--compare", action="store_true", help="RL in modes real, simulator and rehearsal")
    p.add_argument("--rehearsal_sweep", action="store_true",
                   help="after a demo run in --run_dir: test-time rehearsal N=0,1,2 (parallel, sequential) "
                        "with its exported model, into rehearsal_sweep.md")
    p.add_argument("--sweep_tasks", type=int, default=0, help="tasks for --rehearsal_sweep (0: the whole split)")
    p.add_argument("--leverage", action="store_true",
                   help="greedy success and pass@1/4/16 of the RL start per branch kind and task type (leverage.md)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--no_progress", action="store_true")
    args = p.parse_args(argv)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import jax

    # Compiled programs are reused across runs (a second `make demo` or the CI test skips most compiles).
    jax.config.update("jax_compilation_cache_dir", os.environ.get("ENVACE_JAX_CACHE", os.path.abspath("runs/.jax_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()  # our own bars say what each stage does
    from envace_jax.demo import pipeline, report

    cfg = demo_config.PRESETS[args.preset]()
    if args.eval_split:
        cfg = cfg.replace(eval_split=args.eval_split)
    try:
        cfg = demo_config.parse_overrides(cfg, args.set)
    except ValueError as e:
        raise SystemExit(str(e))
    if args.rehearsal_sweep:
        from envace_jax.demo.rehearsal_table import run_rehearsal_table

        out = run_rehearsal_table(cfg, args.run_dir, num_tasks=args.sweep_tasks or None)
        print(out["markdown"])
        print(f"wrote {os.path.join(args.run_dir, 'rehearsal_sweep.md')}")
        return 0
    if args.leverage:
        table = pipeline.run_leverage(cfg, args.run_dir, progress=not args.no_progress)
        print(table.to_markdown())
        print(f"wrote {os.path.join(args.run_dir, 'leverage.md')}")
        return 0
    if args.compare:
        out = pipeline.run_compare(cfg, args.run_dir, progress=not args.no_progress)
        print(out["table"])
        print(f"wrote {os.path.join(args.run_dir, 'compare.md')}")
        return 0
    s = pipeline.run_demo(cfg, args.run_dir, progress=not args.no_progress)
    print()
    print(report.table(report.results_rows(s), report.RESULT_HEADER))
    print(f"\n{report._verdict(s)}")
    t = s["timing"]["total"]
    print(f"total: {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} s CPU; report: {os.path.join(args.run_dir, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
