"""How a Qwen3-30B-A3B update should dispatch tokens to experts on a TPU mesh, decided from XLA's own compile-time
costs (libtpu, no TPU): the gradient of one micro-batch compiled ahead of time for a TPU topology under each
layout, its per-layer cost fitted from 1- and 2-layer copies (as ``launch/aot_compile.py`` does).

    python benchmarks/moe_dispatch_aot.py                        # v5p:4x4x4 (64 chips, fsdp 64), 64 rows x 4,096
    python benchmarks/moe_dispatch_aot.py --topology=v5p:2x2x4 --rows=16 --width=4096 --out=runs/aot/moe_dispatch.json

Layouts (rows split over the chips by ``sharding.TRAIN_RULES``; ``ragged_dot``, the grouped matmul, on TPU):

- ``local``: each chip sorts and runs only its own tokens through every expert of the layer, whose weights it
  gathers over fsdp like a dense layer's (``qwen3_moe._local_tokens``; the default);
- ``local-ep``: the same, with the experts stored split over fsdp (``sharding.EXPERT_PARALLEL_RULES``);
- ``global``: the model's code as written, XLA partitioning the sort of all tokens by expert and the grouped
  matmul itself (``Qwen3MoeConfig.moe_local_tokens=False``);
- ``global-ep``: that, with the experts split over fsdp.

Per layer and chip: TFLOP, GB moved, the roofline seconds (max of compute at the bf16 peak and HBM time), the
collectives in the 2-layer program, and that program's peak memory per chip.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LAYOUTS = ("local", "local-ep", "global", "global-ep")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="v5p:4x4x4")
    ap.add_argument("--rows", type=int, default=64, help="rows of the micro-batch (the 30B config: one per chip)")
    ap.add_argument("--width", type=int, default=4096, help="tokens per row")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import jax
    import numpy as np

    from envace_jax import sharding as shd
    from envace_jax.aot.analyze import analyze, compiled_cost, roofline_seconds
    from envace_jax.aot.chips import chip_for_topology
    from envace_jax.aot.programs import Program, abstract_model, micro_batch_spec
    from envace_jax.aot.report import topology_devices
    from envace_jax.config import LossConfig, OptimConfig
    from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
    from envace_jax.rl.trainer import Trainer

    devices = topology_devices(a.topology)
    chip = chip_for_topology(a.topology)
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(1, len(devices), 1), shd.MESH_AXES)
    base = Qwen3MoeConfig.qwen3_30b_a3b(param_dtype="float32", dtype="bfloat16", remat_policy="full")
    results = {}
    for layout in a.layouts.split(","):
        if layout not in LAYOUTS:
            raise SystemExit(f"--layouts: {layout!r} is not one of {LAYOUTS}")
        rules = dict(shd.TRAIN_RULES, **(shd.EXPERT_PARALLEL_RULES if layout.endswith("-ep") else {}))

        def program(layers: int) -> Program:
            cfg = base.replace(num_layers=layers, scan_layers=False, moe_local_tokens=layout.startswith("local"))
            model = abstract_model(cfg, mesh, rules)
            trainer = Trainer(model, OptimConfig(), LossConfig(routing_replay=True), micro_batch_size=a.rows, mesh=mesh)
            mb = micro_batch_spec(a.rows, a.width, mesh, False, (layers, cfg.num_experts_per_tok))
            args = (trainer.params, mb, None)
            return Program("grad", trainer.program("grad"), args, {}, mesh, f"{a.rows} x {a.width}")

        print(f"{layout}: compiling 1- and 2-layer gradients for {a.topology} ...", flush=True)
        c1 = compiled_cost(program(1))
        rep = analyze(program(2), chip)  # no loops (layers and attention blocks written out): its own count
        per_layer = None if c1 is None or not rep.fits else (rep.flops - c1[0], rep.bytes_accessed - c1[1])
        results[layout] = {
            "fits": rep.fits,
            "peak_gb_2_layers": rep.per_chip_bytes["total"] / 1e9,
            "layer_tflop": None if per_layer is None else per_layer[0] / 1e12,
            "layer_gb_moved": None if per_layer is None else per_layer[1] / 1e9,
            "layer_roofline_s": None if per_layer is None else roofline_seconds(*per_layer, chip),
            "collectives_2_layers": rep.collectives,
        }
        print(f"{layout}: {results[layout]}", flush=True)
    print(f"\n{a.topology} ({len(devices)} chips, fsdp {len(devices)}), micro-batch {a.rows} rows x {a.width} tokens")
    print("| layout | per layer TFLOP | per layer GB moved | per layer roofline s | peak GB (2 layers) | collectives |")
    print("|---|---|---|---|---|---|")
    for k, r in results.items():
        coll = " ".join(f"{n}:{c}" for n, c in r["collectives_2_layers"].items())
        if r["layer_tflop"] is None:  # does not fit a chip: its peak is still what the compiler needed
            print(f"| {k} | - | - | - | {r['peak_gb_2_layers']:.2f} (does not fit) | {coll} |")
            continue
        print(
            f"| {k} | {r['layer_tflop']:.3g} | {r['layer_gb_moved']:.3g} | {r['layer_roofline_s']:.3g} | "
            f"{r['peak_gb_2_layers']:.2f} | {coll} |"
        )
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
