"""Update-step speed: our Trainer (jitted forward + backward + AdamW) vs a PyTorch AdamW step of
transformers' Qwen3ForCausalLM on the same ~40M model and the same batch, in one process.

Model: hidden 512, 8 layers, 8 heads, 4 kv heads, head_dim 64, vocab 32000, mlp 1536, tied
embeddings, float32. Batch 8 x 512 tokens, every token trained (SFT cross-entropy on both sides, so
the two steps do the same work). Repetitions alternate between the frameworks so background load
hits both alike. Achieved GFLOP/s uses analytic FLOPs (3x the forward) against a float32 2048^2
matmul peak measured in the same run.

Usage: python benchmarks/train_step.py [--reps 3] [--batch 8] [--length 512] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CONFIG, add_size_args, build_models, forward_flops, matmul_peak_gflops, timed  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from envace_jax.rl.batch import build_batch  # noqa: E402
from envace_jax.rl.trainer import OptimConfig, Trainer  # noqa: E402
from envace_jax.rl.types import ACT, Generation  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    add_size_args(ap)
    args = ap.parse_args()

    import torch

    tm, model = build_models(args.threads, train=True)
    B, T = args.batch, args.length
    ids = np.random.RandomState(0).randint(0, CONFIG["vocab_size"], (B, T))

    # Same work on both sides: the whole sequence after the first token is the trained response.
    gens = [Generation(ACT, [int(r[0])], [int(t) for t in r[1:]], [0.0] * (T - 1), "u", i, 0)
            for i, r in enumerate(ids)]
    batch = build_batch(gens, [1.0] * B, list(range(B)), max_len=T, length_multiple=T)
    trainer = Trainer(model, OptimConfig(lr=1e-6, weight_decay=0.01), micro_batch_size=B)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-6, weight_decay=0.01)
    ids_pt = torch.tensor(ids)

    def jax_step():
        trainer.update(batch, kind="sft")  # returns host floats: the step is finished

    def torch_step():
        loss = tm(input_ids=ids_pt, labels=ids_pt).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t_compile = timed(jax_step)
    torch_step()  # allocate AdamW state
    jt, tt = [], []
    for r in range(args.reps):
        order = (jax_step, torch_step) if r % 2 == 0 else (torch_step, jax_step)
        for fn in order:
            (jt if fn is jax_step else tt).append(timed(fn))
    peak = matmul_peak_gflops()
    flops = 3 * forward_flops(CONFIG, B, T)
    jm, tm_ = statistics.median(jt), statistics.median(tt)
    print(f"jax {jax.__version__} torch {torch.__version__}  batch {B}x{T} float32, {args.threads} threads")
    print(f"first jax step (compile + run): {t_compile:.1f} s")
    print(f"jax   step s: {[round(x, 2) for x in jt]} median {jm:.2f}  -> {flops / jm / 1e9:.1f} GFLOP/s")
    print(f"torch step s: {[round(x, 2) for x in tt]} median {tm_:.2f}  -> {flops / tm_ / 1e9:.1f} GFLOP/s")
    print(f"matmul peak (jnp float32 2048^2): {peak:.1f} GFLOP/s")
    print(f"speed ratio torch/jax time (median): {tm_ / jm:.2f}x  (>1 means ours is faster)")
    print(f"fraction of matmul peak: jax {flops / jm / 1e9 / peak:.0%}, torch {flops / tm_ / 1e9 / peak:.0%}")


if __name__ == "__main__":
    main()
