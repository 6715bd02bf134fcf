"""Where a weight sync of the vLLM rollout engine goes (``rl/vllm_engine.VllmEngine.load_weights``).

    python benchmarks/vllm_sync.py                                  # Qwen3-0.6B shape, bfloat16 and float32
    python benchmarks/vllm_sync.py --fresh_block                    # a new shared-memory block per sync

Per dtype: a random model of the preset's shape, an engine (``enforce_eager``: start-up in seconds; the sync
does not depend on it), one sync to warm up, then ``--syncs`` timed ones. Medians of the whole sync, of the
gather and copy into the shared-memory block in this process, and of vLLM's in-place reload (with the CPU
kernels' re-packing) in the worker. Needs ``make vllm-deps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from sampler_real_shape import PRESETS

from envace_jax.config import VllmSettings
from envace_jax.models import qwen3
from envace_jax.rl.vllm_engine import VllmEngine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3_0_6b", choices=sorted(PRESETS))
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--fresh_block", action="store_true", help="keep_sync_block=False: a new block per sync")
    ap.add_argument("--out", default="runs/vllm_sync/results.json")
    args = ap.parse_args(argv)
    out = {}
    for dtype in (d for d in args.dtypes.split(",") if d):
        cfg = qwen3.Qwen3Config.from_hf(PRESETS[args.preset], dtype=dtype, param_dtype=dtype)
        model = qwen3.init_model(cfg, seed=0)
        settings = VllmSettings(enforce_eager=True, kv_cache_gib=1, keep_sync_block=not args.fresh_block)
        with VllmEngine(cfg, settings, max_model_len=256) as engine:
            for _ in range(args.syncs + 1):
                engine.load_weights(model)
            parts = engine.sync_parts[1:]
            out[dtype] = {
                "sync_s": statistics.median(engine.sync_seconds[1:]),
                "copy_s": statistics.median(p["copy_s"] for p in parts),
                "reload_s": statistics.median(p["reload_s"] for p in parts),
            }
        print(f"{args.preset} {dtype} (fresh block: {args.fresh_block}): {out[dtype]}", flush=True)
        del model
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
