"""``make pretrain``: train the demo's base model once and write it to --out (default assets/demo_base).

    python launch/pretrain.py                               # the shipped base (about 2 h on 2 CPU cores)
    python launch/pretrain.py --out=/tmp/base --set steps=2000 --set demonstrations=4096
    python launch/pretrain.py --preset=tiny --out=/tmp/tiny  # seconds, for a smoke check
    python launch/pretrain.py --preset=deep --out=assets/demo_base_deep   # `make pretrain-deep`: the shipped
                                                  # base grown to 4 layers, 3,000 more steps with tank rows (~30 min)

Rerunning with the same --out resumes from its last checkpoint. The corpus holds train-split tasks only
(see envace_jax/demo/pretrain.py); `make demo` then starts from this base.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_OUT = "assets/demo_base"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--preset", default="default", choices=["default", "tiny", "deep"],
                   help="deep: continue --set init_from=DIR (default assets/demo_base) grown 2x deeper")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--no_progress", action="store_true")
    args = p.parse_args(argv)

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ.get("ENVACE_JAX_CACHE", os.path.abspath("runs/.jax_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    from envace_jax.demo import pretrain
    from envace_jax.demo.config import parse_overrides

    cfg = parse_overrides(pretrain.PRESETS[args.preset](), args.set)
    manifest = pretrain.run_pretrain(cfg, args.out, progress=not args.no_progress)
    v = manifest["validation"]
    print(json.dumps({"out": args.out, "params": manifest["params"], "validation": v}, indent=1))
    return 0


if __name__ == "__main__":
    # A CPU run: keep XLA's freed step buffers in the process (envace_jax/host_memory.py; re-executes once).
    from envace_jax.host_memory import retain_freed_memory

    retain_freed_memory()
    sys.exit(main())
