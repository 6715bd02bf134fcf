"""``make demo``: the whole EnvACE loop on a tiny Qwen3 on CPU, with a report in --run_dir.

The demo's settings are an ml-collections config like every other main's (``configs/demo.py``, the fields
of ``envace_jax/demo/config.py``); any field can be overridden with ``--config.field=value``:

    python launch/demo.py --run_dir=runs/demo                                # default preset, test split reported
    python launch/demo.py --run_dir=runs/val --config.eval_split=validation  # how the config was chosen
    python launch/demo.py --run_dir=runs/cmp --compare                       # RL modes real / simulator / rehearsal
    python launch/demo.py --run_dir=runs/alg --compare_algorithms=grpo,dapo,dr_grpo   # RL objectives side by side
    python launch/demo.py --config=configs/demo.py:reduced                   # a preset (envace, legacy, reduced)
    python launch/demo.py --config.rl_steps=10 --config.rl_lr=1e-4           # any DemoConfig field
    python launch/demo.py --run_dir=runs/demo --rehearsal_sweep              # test-time rehearsal table, after a run
    python launch/demo.py --run_dir=runs/demo --rehearsal_sweep --sweep_ns=0,2 --sweep_modes=parallel  # some cells
    python launch/demo.py --leverage                                         # pass@k of the RL start
    python launch/demo.py --config.rollout_engine=vllm                       # rollouts by vLLM (make vllm-deps)

The earlier spellings ``--preset=NAME``, ``--eval_split=SPLIT`` and ``--set FIELD=VALUE`` still work: they
are rewritten to the ``--config`` forms above.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

from envace_jax.cli.entrypoint import check_overrides, guard, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_CONFIG = os.path.join(ROOT, "configs", "demo.py")


def legacy_argv(argv: list[str]) -> list[str]:
    """``--preset X``, ``--eval_split X`` and ``--set K=V`` (the earlier argparse options) -> ``--config`` flags."""
    out, preset, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name == "--config.rollout.engine":  # the spelling of the other mains' configs
            out.append(f"--config.rollout_engine={value}")
        elif name in ("--preset", "--eval_split", "--set"):
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{a} needs a value")
                value, i = argv[i + 1], i + 1
            if name == "--preset":
                preset = value
            elif name == "--eval_split":
                out.append(f"--config.eval_split={value}")
            else:
                if "=" not in value:
                    raise SystemExit(f"--set {value!r}: expected field=value")
                out.append(f"--config.{value}")
        else:
            out.append(a)
        i += 1
    if preset is not None:
        if any(a == "--config" or a.startswith("--config=") for a in out):
            raise SystemExit("give the preset either with --preset or in --config=configs/demo.py:PRESET, not both")
        out.insert(1, f"--config={DEFAULT_CONFIG}:{preset}")
    return out


if __name__ == "__main__":
    # A CPU run: keep XLA's freed step buffers in the process (envace_jax/host_memory.py; re-executes once).
    from envace_jax.host_memory import retain_freed_memory

    retain_freed_memory()
    # Before the flags are defined: config_flags registers the ``--config.field`` overrides it finds in
    # sys.argv when it loads the default config, at definition time (so an unknown field is reported here,
    # in one line, rather than as a traceback out of the definition below).
    sys.argv = legacy_argv(sys.argv)
    with guard():
        check_overrides(sys.argv[1:], DEFAULT_CONFIG)

_CONFIG = config_flags.DEFINE_config_file(
    "config", DEFAULT_CONFIG, "demo config file (configs/demo.py[:preset])", lock_config=True
)
_RUN_DIR = flags.DEFINE_string("run_dir", "runs/demo", "where the data, models, report and summary go")
_COMPARE = flags.DEFINE_bool("compare", False, "RL in modes real, simulator and rehearsal")
_ALGORITHMS = flags.DEFINE_list(
    "compare_algorithms",
    [],
    "RL objectives from one start, side by side (grpo,gspo,dapo,dr_grpo; rl/recipes.py), into algorithms.md",
)
_SWEEP = flags.DEFINE_bool(
    "rehearsal_sweep",
    False,
    "after a demo run in --run_dir: test-time rehearsal N=0,1,2 (--sweep_ns) in modes parallel and "
    "sequential (--sweep_modes) with its exported model, into rehearsal_sweep.md (rewritten each run)",
)
_SWEEP_TASKS = flags.DEFINE_integer("sweep_tasks", 0, "tasks for --rehearsal_sweep (0: the whole split)")
_SWEEP_NS = flags.DEFINE_list("sweep_ns", ["0", "1", "2"], "numbers of rehearsals for --rehearsal_sweep")
_SWEEP_MODES = flags.DEFINE_list("sweep_modes", ["parallel", "sequential"], "modes for --rehearsal_sweep")
_OUTCOMES = flags.DEFINE_string(
    "rehearsal_outcomes",
    "",
    "after --rehearsal_sweep: per tool, what the rehearsals of this arm (n1, n2, n2_sequential...) predicted against "
    "what the tools did, from its eval_<arm>_rehearsals.jsonl (no model runs)",
)
_LEVERAGE = flags.DEFINE_bool(
    "leverage", False, "greedy success and pass@1/4/16 of the RL start per branch kind and task type (leverage.md)"
)
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "no progress bars")


def main(argv) -> int:
    del argv
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from envace_jax.config import ConfigError
    from envace_jax.demo.config import load_demo_config

    try:
        cfg = load_demo_config(_CONFIG.value)
        if _SWEEP.value:
            from envace_jax.demo.rehearsal_table import sweep_settings

            ns, modes = sweep_settings(_SWEEP_NS.value, _SWEEP_MODES.value)
        if _ALGORITHMS.value:
            from envace_jax.demo.compare_algorithms import parse_algorithms

            algorithms = parse_algorithms(_ALGORITHMS.value)
            if "dapo" in algorithms and cfg.rl_max_staleness:
                raise ConfigError("--compare_algorithms with dapo needs --config.rl_max_staleness=0")
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    import jax

    # Compiled programs are reused across runs (a second `make demo` or the CI test skips most compiles).
    jax.config.update(
        "jax_compilation_cache_dir", os.environ.get("ENVACE_JAX_CACHE", os.path.abspath("runs/.jax_cache"))
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()  # our own bars say what each stage does
    from envace_jax.demo import pipeline, report

    run_dir, progress = _RUN_DIR.value, not _NO_PROGRESS.value
    if _SWEEP.value:
        from envace_jax.demo.rehearsal_table import run_rehearsal_table

        out = run_rehearsal_table(cfg, run_dir, ns=ns, modes=modes, num_tasks=_SWEEP_TASKS.value or None)
        print(out["markdown"])
        print(f"wrote {os.path.join(out['dir'], 'rehearsal_sweep.md')}")
        return 0
    if _OUTCOMES.value:
        from envace_jax.demo.rehearsal_table import outcomes_of_records

        try:
            print(outcomes_of_records(cfg, run_dir, _OUTCOMES.value)["markdown"])
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if _LEVERAGE.value:
        table = pipeline.run_leverage(cfg, run_dir, progress=progress)
        print(table.to_markdown())
        print(f"wrote {os.path.join(run_dir, 'leverage.md')}")
        return 0
    if _ALGORITHMS.value:
        from envace_jax.demo.compare_algorithms import run_compare_algorithms

        out = run_compare_algorithms(cfg, run_dir, algorithms, progress=progress)
        print(out["table"])
        print(f"wrote {os.path.join(run_dir, 'algorithms.md')}")
        return 0
    if _COMPARE.value:
        out = pipeline.run_compare(cfg, run_dir, progress=progress)
        print(out["table"])
        print(f"wrote {os.path.join(run_dir, 'compare.md')}")
        return 0
    s = pipeline.run_demo(cfg, run_dir, progress=progress)
    print()
    print(report.table(report.results_rows(s), report.RESULT_HEADER))
    print(f"\n{report._verdict(s)}")
    t = s["timing"]["total"]
    print(f"total: {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} s CPU; report: {os.path.join(run_dir, 'report.md')}")
    return 0


if __name__ == "__main__":
    run(main, config_flag=None)  # the overrides were checked above, before the config flag was defined
