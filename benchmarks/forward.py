"""Forward-pass speed: our jitted Qwen3 vs transformers' Qwen3ForCausalLM on the same weights.

Model: ~40M params (hidden 512, 8 layers, 8 heads, 4 kv heads, head_dim 64, vocab 32000, mlp 1536,
tied embeddings), batch 8 x 512 tokens, float32, CPU. The two frameworks are timed in alternating
repetitions in one process so that background load hits both alike. Also reports achieved GFLOP/s
(analytic FLOPs) against a float32 2048x2048 matmul peak measured in the same run.

Usage: python benchmarks/forward.py [--reps 3] [--batch 8] [--length 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# common (a sibling: the script's folder is on sys.path) sets JAX_PLATFORMS before it loads jax.
from common import CONFIG, add_size_args, build_models, forward_flops, matmul_peak_gflops, timed

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    add_size_args(ap)
    args = ap.parse_args()

    import torch
    from flax import nnx

    tm, model = build_models(args.threads, train=False)
    n_params = sum(p.numel() for p in tm.parameters())
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda st, ids: nnx.merge(graphdef, st)(ids))

    ids_np = np.random.RandomState(0).randint(0, CONFIG["vocab_size"], (args.batch, args.length))
    ids_jax, ids_pt = jnp.asarray(ids_np, jnp.int32), torch.tensor(ids_np)

    def run_jax():
        return fwd(state, ids_jax).block_until_ready()

    def run_torch():
        with torch.inference_mode():
            return tm(ids_pt).logits

    # Warm up (compile) and check both compute the same thing.
    t0 = time.perf_counter()
    ours = np.asarray(run_jax())
    compile_s = time.perf_counter() - t0
    ref = run_torch().numpy()
    diff = float(np.abs(ours - ref).max())

    t_jax, t_pt, peaks = [], [], []
    for _ in range(args.reps):  # alternate so background load is shared
        t_jax.append(timed(run_jax))
        t_pt.append(timed(run_torch))
        peaks.append(matmul_peak_gflops(3))

    flops = forward_flops(CONFIG, args.batch, args.length)
    peak = max(peaks)
    j, p = statistics.median(t_jax), statistics.median(t_pt)
    print(
        f"model: {n_params / 1e6:.1f}M params, batch {args.batch} x {args.length}, float32, "
        f"{jax.devices()[0].platform} ({os.cpu_count()} cpus), torch threads {args.threads}"
    )
    print(f"max |logits diff| jax vs torch: {diff:.2e}   jax compile+first run: {compile_s:.1f}s")
    print(f"jax   forward: median {j:.3f}s  min {min(t_jax):.3f}s  all {[round(t, 3) for t in t_jax]}")
    print(f"torch forward: median {p:.3f}s  min {min(t_pt):.3f}s  all {[round(t, 3) for t in t_pt]}")
    print(f"speed ratio torch/jax (median): {p / j:.2f}x   (min/min: {min(t_pt) / min(t_jax):.2f}x)")
    print(f"analytic forward FLOPs: {flops / 1e9:.1f} GFLOP")
    print(
        f"achieved: jax {flops / min(t_jax) / 1e9:.1f} GFLOP/s, torch {flops / min(t_pt) / 1e9:.1f} GFLOP/s; "
        f"float32 2048^3 matmul peak {peak:.1f} GFLOP/s -> jax at {100 * flops / min(t_jax) / 1e9 / peak:.0f}% "
        f"of peak"
    )


if __name__ == "__main__":
    main()
