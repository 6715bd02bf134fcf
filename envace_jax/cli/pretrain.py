"""``make pretrain``: train the demo's base model once and write it to --out (default assets/demo_base).

    python launch/pretrain.py                               # the shipped base (about 2 h on 2 CPU cores)
    python launch/pretrain.py --out=/tmp/base --set steps=2000 --set demonstrations=4096
    python launch/pretrain.py --preset=tiny --out=/tmp/tiny  # seconds, for a smoke check
    python launch/pretrain.py --preset=deep --out=assets/demo_base_deep   # `make pretrain-deep`: the shipped
                                                  # base grown to 4 layers, 3,000 more steps with tank rows (~30 min)
    python launch/pretrain.py --preset=wire --out=assets/demo_base_wire   # `make pretrain-wire`: the shipped base
                                       # continued with the wire world's happy path and rules (task family irreversible)

Rerunning with the same --out resumes from its last checkpoint. The corpus holds train-split tasks only
(see envace_jax/demo/pretrain.py); `make demo` then starts from this base.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from envace_jax.cli.entrypoint import UsageError, guard, nearest, show_library_log

DEFAULT_OUT = "assets/demo_base"
# envace_jax.demo.pretrain.PRESETS, named here so that --help needs no jax import (a test keeps them equal)
PRESET_NAMES = ["default", "tiny", "deep", "wire", "wire_memory"]


def check_set_fields(items: list[str], fields: list[str]) -> None:
    """An unknown ``--set FIELD=...`` is one line naming the nearest field."""
    for item in items:
        name = item.partition("=")[0]
        if name not in fields:
            near = nearest(name, fields)
            raise UsageError(
                f"--set {item}: no field {name!r}"
                + (f"; did you mean --set {near}=...?" if near else f"; the fields are {', '.join(sorted(fields))}")
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument(
        "--preset",
        default="default",
        choices=PRESET_NAMES,
        help="deep: continue --set init_from=DIR (default assets/demo_base) grown 2x deeper; wire: continue it "
        "with the wire world's happy path and rules (the start for --config.task_family=irreversible)",
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--no_progress", action="store_true")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on failure (or ENVACE_DEBUG=1)")
    args = p.parse_args(argv)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import jax

    jax.config.update(
        "jax_compilation_cache_dir", os.environ.get("ENVACE_JAX_CACHE", os.path.abspath("runs/.jax_cache"))
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    from envace_jax.demo import pretrain
    from envace_jax.demo.config import parse_overrides

    base = pretrain.PRESETS[args.preset]()
    check_set_fields(args.set, [f.name for f in dataclasses.fields(base)])
    cfg = parse_overrides(base, args.set)
    manifest = pretrain.run_pretrain(cfg, args.out, progress=not args.no_progress)
    v = manifest["validation"]
    print(json.dumps({"out": args.out, "params": manifest["params"], "validation": v}, indent=1))
    return 0


def cli() -> None:
    """``envace-pretrain`` and ``launch/pretrain.py``."""
    # A CPU run: keep XLA's freed step buffers in the process (envace_jax/host_memory.py; re-executes once).
    from envace_jax.host_memory import retain_freed_memory

    retain_freed_memory()
    show_library_log()  # the corpus, validation and resume lines of run_pretrain
    with guard():
        code = main()
    sys.exit(code)
