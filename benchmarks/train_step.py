"""Update-step speed: our Trainer (jitted forward + backward + AdamW) vs a PyTorch AdamW step of
transformers' Qwen3ForCausalLM on the same model and the same rows, in one process.

Presets:
- ``default``: the ~40M model of ``common.CONFIG`` (hidden 512, 8 layers, vocab 32000, tied embeddings),
  batch 8 x 512 tokens, every token trained, one micro-batch.
- ``demo``: the demo's model (``envace_jax/demo/config.py``: hidden 128, 2 layers, 4 heads, 2 kv heads,
  head_dim 32, mlp 256, vocab 2048, tied) and its SFT step: 32 rows of 100-250 tokens (a prompt and a
  trained response) right-padded to a multiple of 64, two micro-batches of 16 rows, gradients
  accumulated, clip 1.0, AdamW.

Both sides do the same work: the SFT cross-entropy (mean over trained tokens of -log p(target)),
gradient clipping at 1.0 and an AdamW step; the PyTorch side runs the same micro-batches with the same
padding mask and positions. Repetitions alternate between the frameworks so background load hits both
alike; medians are reported, with the process CPU seconds of each step beside the wall seconds (on a
shared machine CPU seconds show the work done, wall seconds also the waiting). Achieved GFLOP/s uses
analytic FLOPs (3x the forward, attention over the full padded square, the vocabulary head at every
position, so for our gathered head on the demo preset it overstates the work done) against a float32
2048^2 matmul peak measured in the same run.

``--retain-freed-memory`` reruns the process with glibc keeping freed memory (``envace_jax/host_memory.py``):
without it both sides fault their large step buffers in afresh at every step (kernel time that the
process CPU seconds include); the header line says which policy the run used.

``--bf16`` adds a bfloat16-compute step of each side (ours: float32 parameters and optimizer,
bfloat16 matmul inputs with float32 accumulation; PyTorch: ``torch.autocast("cpu", bfloat16)``),
reported beside the float32 figures, which stay the headline.

Our Trainer runs the vocabulary head and its log-softmax on the trained positions only (those with a loss
weight: ~27% of the demo preset's padded positions; every position of the default preset, where nothing
changes). The PyTorch step is transformers' forward, logits at every position, as a user of its
``Qwen3ForCausalLM`` gets them; ``--compare-gather`` also times a PyTorch step that gathers the same
positions before its head, and ours with the head at every position.

Usage: python benchmarks/train_step.py [--preset default|demo] [--reps 3] [--threads 2] [--bf16] [--compare-gather]
       [--retain-freed-memory]
"""

from __future__ import annotations

import argparse
import statistics
import time

# common (a sibling: the script's folder is on sys.path) sets JAX_PLATFORMS before it loads jax.
from common import CONFIG, build_models, forward_flops, matmul_peak_gflops

import jax
import numpy as np

from envace_jax import host_memory
from envace_jax.model_sizes import DEMO
from envace_jax.rl.batch import build_batch
from envace_jax.rl.trainer import OptimConfig, Trainer
from envace_jax.rl.types import ACT, Generation

# transformers Qwen3Config fields of the demo's model (envace_jax/demo/config.py, demo/stages.build_model).
DEMO_CONFIG = dict(
    vocab_size=2048, **DEMO.hf_fields(), tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e4
)


def make_rows(preset: str, vocab: int, batch: int, length: int):
    """Generations and their TrainBatch. default: whole rows trained; demo: 100-250-token rows, ~40% of
    each row a trained response, padded to a multiple of 64 (as the demo's SFT batches)."""
    rng = np.random.RandomState(0)
    gens = []
    for i in range(batch):
        if preset == "demo":
            n = int(rng.randint(100, 251))
            n_gen = int(rng.randint(int(0.25 * n), int(0.55 * n)))
            ids = rng.randint(3, vocab, n)
            prompt, gen = ids[: n - n_gen], ids[n - n_gen :]
        else:
            ids = rng.randint(0, vocab, length)
            prompt, gen = ids[:1], ids[1:]
        gens.append(Generation(ACT, [int(t) for t in prompt], [int(t) for t in gen], [0.0] * len(gen), "u", i, 0))
    if preset == "demo":
        tb = build_batch(gens, [1.0] * batch, list(range(batch)), max_len=768, length_multiple=64)
    else:
        tb = build_batch(gens, [1.0] * batch, list(range(batch)), max_len=length, length_multiple=length)
    return tb


def torch_step_fn(tm, tb, micro: int, bf16: bool, gathered: bool = False):
    """One PyTorch optimizer step over ``tb`` in micro-batches of ``micro`` rows (same loss as ours).

    ``gathered``: the vocabulary head and log-softmax run on the trained positions only (what our
    Trainer does by default), instead of transformers' logits at every position."""
    import torch

    opt = torch.optim.AdamW(tm.parameters(), lr=1e-6, weight_decay=0.01)
    seg = torch.tensor(tb.segment_ids)
    parts = []
    for s in range(0, tb.size, micro):
        sl = slice(s, s + micro)
        parts.append(
            dict(
                ids=torch.tensor(tb.tokens[sl], dtype=torch.long),
                pos=torch.tensor(tb.positions[sl], dtype=torch.long),
                mask=(seg[sl] != 0).long(),
                tgt=torch.tensor(tb.targets[sl], dtype=torch.long),
                w=torch.tensor(tb.loss_weights[sl]),
            )
        )
    total = float(tb.loss_weights.sum())

    def step():
        for p in parts:
            tgt, w = p["tgt"], p["w"]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                if gathered:
                    on = w != 0
                    hidden = tm.model(input_ids=p["ids"], attention_mask=p["mask"], position_ids=p["pos"])[0]
                    logits, tgt, w = tm.lm_head(hidden[on]), tgt[on], w[on]
                else:
                    logits = tm(input_ids=p["ids"], attention_mask=p["mask"], position_ids=p["pos"]).logits
            logp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
            (-(logp * w).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=("default", "demo"), default="default")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="rows (default 8; demo 32)")
    ap.add_argument("--length", type=int, default=512, help="row length of the default preset")
    ap.add_argument("--micro", type=int, default=None, help="micro-batch rows (default: all; demo 16)")
    ap.add_argument("--bf16", action="store_true", help="also time bfloat16 compute on both sides")
    ap.add_argument(
        "--compare-gather",
        action="store_true",
        help="also time our step with the vocabulary head at every position (Trainer(gather_trained="
        "False)) and a PyTorch step with the head at the trained positions only",
    )
    ap.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="rerun this process with glibc keeping freed memory (envace_jax/host_memory.py); both "
        "frameworks share the process, so both run under it",
    )
    args = ap.parse_args()
    if args.retain_freed_memory:
        host_memory.retain_freed_memory()
    demo = args.preset == "demo"
    config = DEMO_CONFIG if demo else CONFIG
    B = args.batch or (32 if demo else 8)
    micro = args.micro or (16 if demo else B)

    import torch

    tm, model = build_models(args.threads, train=True, config=config)
    tb = make_rows(args.preset, config["vocab_size"], B, args.length)
    T = tb.tokens.shape[1]
    optim = OptimConfig(lr=1e-6, weight_decay=0.01)
    runs = {"jax": Trainer(model, optim, micro_batch_size=micro), "torch": torch_step_fn(tm, tb, micro, False)}
    if args.bf16:
        import jax.numpy as jnp
        from flax import nnx

        from envace_jax.models import qwen3

        bf = qwen3.Qwen3(model.config.replace(dtype="bfloat16"))
        # Copies: the float32 trainer donates (and so deletes) its parameter buffers at every step.
        nnx.update(bf, jax.tree.map(jnp.copy, nnx.state(model, nnx.Param)))
        runs["jax bf16"] = Trainer(bf, optim, micro_batch_size=micro)
        tm_bf = build_models(args.threads, train=True, config=config)[0]
        runs["torch bf16"] = torch_step_fn(tm_bf, tb, micro, True)
    if args.compare_gather:
        runs["jax all positions"] = Trainer(
            build_models(args.threads, train=True, config=config)[1],
            optim,
            micro_batch_size=micro,
            gather_trained=False,
        )
        runs["torch gathered"] = torch_step_fn(
            build_models(args.threads, train=True, config=config)[0], tb, micro, False, gathered=True
        )
    steps = {k: (lambda t=v: t.update(tb, kind="sft")) if isinstance(v, Trainer) else v for k, v in runs.items()}

    first = {k: timed(f)[0] for k, f in steps.items()}  # compile (ours), AdamW state allocation (torch)
    wall = {k: [] for k in steps}
    cpu = {k: [] for k in steps}
    names = list(steps)
    for r in range(args.reps):
        for k in names if r % 2 == 0 else names[::-1]:
            w, c = timed(steps[k])
            wall[k].append(w)
            cpu[k].append(c)
    peak = matmul_peak_gflops()
    flops = 3 * forward_flops(config, B, T)
    med = {k: statistics.median(v) for k, v in wall.items()}
    print(
        f"jax {jax.__version__} torch {torch.__version__}  preset {args.preset}: {B} rows x {T} tokens "
        f"({int(tb.loss_weights.sum())} trained), micro-batch {micro}, {args.threads} threads"
    )
    print(host_memory.describe())
    print("first step (compile / optimizer state): " + ", ".join(f"{k} {v:.1f} s" for k, v in first.items()))
    for k in names:
        print(
            f"{k:10s} step s: {[round(x, 3) for x in wall[k]]} median {med[k]:.3f}  cpu-s median "
            f"{statistics.median(cpu[k]):.2f}  -> {flops / med[k] / 1e9:.1f} GFLOP/s "
            f"({flops / med[k] / 1e9 / peak:.0%} of peak)"
        )
    print(f"matmul peak (jnp float32 2048^2): {peak:.1f} GFLOP/s")
    paired = statistics.median(t / j for t, j in zip(wall["torch"], wall["jax"]))
    paired_cpu = statistics.median(t / j for t, j in zip(cpu["torch"], cpu["jax"]))
    print(
        f"speed ratio torch/jax time: {med['torch'] / med['jax']:.2f}x of medians, {paired:.2f}x median of the "
        f"{args.reps} alternations (cpu-s {paired_cpu:.2f}x)  (>1 means ours is faster)"
    )
    if args.compare_gather:
        print(
            "vocabulary head at the trained positions: "
            f"jax all positions / jax {med['jax all positions'] / med['jax']:.2f}x; "
            f"torch gathered / jax {med['torch gathered'] / med['jax']:.2f}x; "
            f"torch / torch gathered {med['torch'] / med['torch gathered']:.2f}x"
        )
    if args.bf16:
        print(
            f"bfloat16: torch bf16 / jax bf16 {med['torch bf16'] / med['jax bf16']:.2f}x; "
            f"jax float32 / jax bf16 {med['jax'] / med['jax bf16']:.2f}x"
        )


if __name__ == "__main__":
    main()
