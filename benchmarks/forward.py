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
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from envace_jax.models import hf_io  # noqa: E402

CONFIG = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
              max_position_embeddings=4096, rope_theta=1e6)


def forward_flops(c: dict, batch: int, length: int) -> float:
    """Matmul FLOPs of one forward pass (2 per multiply-add). Attention scores are counted over the
    full T x T square, since both implementations compute it before masking."""
    d, f, n, k, h, v, L = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                           c["num_key_value_heads"], c["head_dim"], c["vocab_size"], c["num_hidden_layers"])
    tokens = batch * length
    dense = L * (2 * d * n * h + 2 * d * k * h + 3 * d * f) + d * v  # q,o + k,v + mlp, plus lm head
    attn = L * 2 * batch * length * length * n * h  # QK^T and PV
    return 2.0 * (tokens * dense + attn)


def timeit(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from flax import nnx
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tm = Qwen3ForCausalLM(Qwen3Config(**CONFIG)).eval()
    n_params = sum(p.numel() for p in tm.parameters())
    with tempfile.TemporaryDirectory() as d:
        tm.save_pretrained(d)
        model = hf_io.load_hf(d)
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

    a = jnp.asarray(np.random.RandomState(1).randn(2048, 2048), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()

    t_jax, t_pt, t_mm = [], [], []
    for _ in range(args.reps):  # alternate so background load is shared
        t_jax += timeit(run_jax, 1)
        t_pt += timeit(run_torch, 1)
        t_mm += timeit(lambda: mm(a).block_until_ready(), 3)

    flops = forward_flops(CONFIG, args.batch, args.length)
    peak = 2.0 * 2048**3 / min(t_mm) / 1e9
    j, p = statistics.median(t_jax), statistics.median(t_pt)
    print(f"model: {n_params / 1e6:.1f}M params, batch {args.batch} x {args.length}, float32, "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cpus), torch threads {args.threads}")
    print(f"max |logits diff| jax vs torch: {diff:.2e}   jax compile+first run: {compile_s:.1f}s")
    print(f"jax   forward: median {j:.3f}s  min {min(t_jax):.3f}s  all {[round(t, 3) for t in t_jax]}")
    print(f"torch forward: median {p:.3f}s  min {min(t_pt):.3f}s  all {[round(t, 3) for t in t_pt]}")
    print(f"speed ratio torch/jax (median): {p / j:.2f}x   (min/min: {min(t_pt) / min(t_jax):.2f}x)")
    print(f"analytic forward FLOPs: {flops / 1e9:.1f} GFLOP")
    print(f"achieved: jax {flops / min(t_jax) / 1e9:.1f} GFLOP/s, torch {flops / min(t_pt) / 1e9:.1f} GFLOP/s; "
          f"float32 2048^3 matmul peak {peak:.1f} GFLOP/s -> jax at {100 * flops / min(t_jax) / 1e9 / peak:.0f}% "
          f"of peak")


if __name__ == "__main__":
    main()
