"""Compile a config's programs for a TPU topology on a CPU host, and report per-chip memory.

    python launch/aot_compile.py --config=configs/envace_qwen3_8b.py --topology=v5p:4x4x4 \
        --output=/tmp/aot/aot.json [--num_slices=N] [--config.mesh.fsdp=16 ...]

Needs libtpu (``pip install -e '.[aot]'``), no TPU and no weights. Compiles train_step, logprobs,
prefill and decode at the config's real shapes (see ``envace_jax.aot``), prints a table and writes
``aot.json``. Exits 1 when a program does not fit in HBM (naming the config fields that would change
that), 2 on a config error.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from envace_jax.cli.entrypoint import run

# Set before jax loads (main imports it; absl and ml_collections do not). Compile-only TPU devices need
# libtpu but no TPU backend: keep JAX itself on the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) so that two processes never drive one TPU;
# compiling for a described topology drives none, so a second compile (or the test suite) may run beside.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file", lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology, e.g. v5p:4x4x4, v5e:16x16, v6e:4x4")
_SLICES = flags.DEFINE_integer("num_slices", 1, "number of slices of that topology (multi-slice over DCN)")
_OUTPUT = flags.DEFINE_string("output", None, "where to write aot.json (default: print only)")
_PROGRAMS = flags.DEFINE_list("programs", None, "compile only these (train_step, logprobs, prefill, decode)")
_ESTIMATE = flags.DEFINE_bool(
    "estimate",
    False,
    "also print an estimate of one RL step from the rooflines "
    "(envace_jax.aot.estimate; the workload assumed is printed, --assume changes it)",
)
_ASSUME = flags.DEFINE_list("assume", [], "StepAssumptions fields for --estimate, e.g. generations=12,row_tokens=6000")


def main(argv):
    del argv
    from envace_jax.aot.report import compile_report, format_table, not_fitting_message
    from envace_jax.config import load_config

    if _CONFIG.value is None:
        raise app.UsageError("--config=configs/<name>.py is required")
    if not _TOPOLOGY.value:
        raise app.UsageError("--topology=<generation>:<shape> is required, e.g. --topology=v5p:4x4x4")
    cfg = load_config(_CONFIG.value)  # a ConfigError exits 2 with one line (entrypoint.guard)
    try:
        rep = compile_report(cfg, _TOPOLOGY.value, _SLICES.value, _PROGRAMS.value)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_table(rep), flush=True)
    if _ESTIMATE.value:
        import dataclasses

        from envace_jax.aot.estimate import StepAssumptions, estimate_step, format_estimate

        try:
            fields = {f.name for f in dataclasses.fields(StepAssumptions)}
            kv = {}
            for item in _ASSUME.value:
                k, sep, v = item.partition("=")
                if not sep or k not in fields or not v.strip().isdigit():
                    raise ValueError(
                        f"--assume: {item!r} is not field=<integer >= 0> with a field from {sorted(fields)}"
                    )
                kv[k] = int(v)
            a = StepAssumptions(**kv)
            print(format_estimate(estimate_step(rep, a), a, rep.topology), flush=True)
        except ValueError as e:
            print(f"no estimate: {e}", file=sys.stderr, flush=True)
    if _OUTPUT.value:
        rep.write(_OUTPUT.value)
        print(f"wrote {_OUTPUT.value}", flush=True)
    if not rep.all_fit:
        print(not_fitting_message(rep, cfg), file=sys.stderr, flush=True)
        sys.exit(1)


def cli() -> None:
    """``envace-aot-compile`` and ``launch/aot_compile.py``."""
    run(main)
