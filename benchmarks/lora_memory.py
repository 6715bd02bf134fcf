"""What LoRA saves in the update: trained parameters, optimizer state and XLA's compiled memory of the update's
programs, full training against LoRA at a Qwen3 shape, side by side in one run. Nothing runs: the programs are
lowered from abstract weights (a Trainer of an ``nnx.eval_shape`` model) and compiled for this host, so the
figures are XLA's own accounting (``memory_analysis``) of the programs a real run would execute.

    python benchmarks/lora_memory.py                                   # Qwen3-0.6B, 8 rows x 512 tokens, r 16 / 64
    python benchmarks/lora_memory.py --preset qwen3_1_7b --ranks 8,32 --rows 4 --length 1024

Per configuration it prints the trained parameters, the frozen ones, Adam's state, and for the two programs of an
optimizer step (the gradient of one micro-batch, and the optimizer's apply) the temporaries, arguments, outputs
and the bytes the outputs alias (donated inputs); "step peak" is the larger of the two programs' live bytes
(arguments + temporaries + outputs - aliased), the most the update needs at once besides the batch.
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax.models import lora, qwen3
from envace_jax.rl.batch import build_batch
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import ACT, Generation

PRESETS = ("qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b")


def rows(vocab: int, batch: int, length: int):
    """``batch`` rows of one GRPO group: a shared half-length prompt, the completions trained."""
    rng = np.random.RandomState(0)
    prompt = [int(t) for t in rng.randint(0, vocab, length // 2)]
    gens = []
    for i in range(batch):
        gen = [int(t) for t in rng.randint(0, vocab, length - len(prompt))]
        gens.append(Generation(ACT, prompt, gen, [-math.log(vocab)] * len(gen), "g", i, 0))
    return build_batch(gens, [(-1.0) ** i for i in range(batch)], [0] * batch, max_len=length, length_multiple=length)


def nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def measure(cfg: qwen3.Qwen3Config, tb, rank: int, alpha: float, micro: int) -> dict:
    def build():
        m = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
        if rank:
            lora.add_adapters(m, rank, alpha)
        return m

    model = nnx.eval_shape(build)
    trainer = Trainer(model, OptimConfig(lr=1e-6), LossConfig(), micro_batch_size=micro)
    params, frozen = trainer.params, trainer.frozen
    mb = trainer._local_micro_batches(tb)[0]
    count = jax.ShapeDtypeStruct((), jnp.float32)
    grad = trainer.program("grad").lower(params, mb, None, frozen).compile().memory_analysis()
    apply = trainer.program("apply").lower(params, trainer.opt_state, params, count).compile().memory_analysis()

    def live(m):
        return m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes

    return {
        "trained": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)),
        "frozen": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(frozen)) if frozen is not None else 0,
        "opt_bytes": nbytes(trainer.opt_state),
        "grad": grad,
        "apply": apply,
        "peak": max(live(grad), live(apply)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=PRESETS, default="qwen3_0_6b")
    ap.add_argument("--ranks", default="16,64", help="comma-separated LoRA ranks (alpha = 2 x rank)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--micro", type=int, default=0, help="rows per micro-batch (0: all)")
    ap.add_argument("--remat", default="full", choices=("none", "full", "dots", "dots_no_batch"))
    args = ap.parse_args()
    jax.config.update("jax_platforms", "cpu")
    cfg = getattr(qwen3.Qwen3Config, args.preset)(param_dtype="float32", dtype="float32", remat_policy=args.remat)
    tb = rows(cfg.vocab_size, args.rows, args.length)
    micro = args.micro or args.rows
    gb = lambda b: f"{b / 1e9:.3f} GB"
    print(
        f"jax {jax.__version__}  {args.preset} float32 weights, {args.rows} rows x {args.length} tokens, "
        f"micro-batch {micro}, remat {args.remat}, AdamW"
    )
    results = {"full": measure(cfg, tb, 0, 0.0, micro)}
    for r in (int(x) for x in args.ranks.split(",") if x):
        results[f"LoRA r={r}"] = measure(cfg, tb, r, 2.0 * r, micro)
    full = results["full"]
    header = (
        "| training | trained params | Adam state | gradient program: temp / args | apply program: temp / args "
        "| step peak | peak vs full |"
    )
    print(header)
    print("|" + "---|" * 7)
    for name, m in results.items():
        g, a = m["grad"], m["apply"]
        print(
            f"| {name} | {m['trained'] / 1e6:.2f}M ({100 * m['trained'] / (m['trained'] + m['frozen']):.1f}%) "
            f"| {gb(m['opt_bytes'])} | {gb(g.temp_size_in_bytes)} / {gb(g.argument_size_in_bytes)} "
            f"| {gb(a.temp_size_in_bytes)} / {gb(a.argument_size_in_bytes)} | {gb(m['peak'])} "
            f"| {m['peak'] / full['peak']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
