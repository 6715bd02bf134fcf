"""Update-step speed: our Trainer (jitted forward + backward + AdamW) vs a PyTorch AdamW step of
transformers' Qwen3ForCausalLM on the same model and the same rows, in one process.

Presets:
- ``default``: the ~40M model of ``common.CONFIG`` (hidden 512, 8 layers, vocab 32000, tied embeddings),
  batch 8 x 512 tokens, every token trained, one micro-batch.
- ``demo``: the demo's model (``envace_jax/demo/config.py``: hidden 128, 2 layers, 4 heads, 2 kv heads,
  head_dim 32, mlp 256, vocab 2048, tied) and its SFT step: 32 rows of 100-250 tokens (a prompt and a
  trained response) right-padded to a multiple of 64, two micro-batches of 16 rows, gradients
  accumulated, clip 1.0, AdamW.
- ``qwen3_0_6b``: Qwen3-0.6B's shape (``common.QWEN3_0_6B``: 28 layers, hidden 1024, vocabulary 151,936,
  tied) with random weights, and a GRPO policy update: 4 rows of one group, each a shared 256-token prompt
  and its own 256-token completion (4 x 512 tokens, the 1,024 completion positions trained), old
  log-probs near -log(V) as a random policy's sampler gives them, group advantages +-1 and +-0.5, the
  reference's clipped loss (clip 0.2/0.2, dual clip 3, per-sequence token mean), clip 1.0, AdamW. Float32
  AdamW holds ~9.5 GB per framework (weights, gradients, two moments), so the two sides run one after
  the other, each freed before the other loads: the repetitions of a side follow each other, and
  ``--rounds 2`` runs the sides ABBA (ours, PyTorch, PyTorch, ours) so that a drift in the machine's
  load reaches both. ``--layers`` cuts the depth for a
  smoke run; ``--remat full`` rematerialises each layer on both sides (ours ``remat_policy="full"``,
  transformers' ``activation_checkpointing_enable()``) when the activations do not fit.

For the default and demo presets both sides do the same work: the SFT cross-entropy (mean over trained
tokens of -log p(target)), gradient clipping at 1.0 and an AdamW step; the PyTorch side runs the same
micro-batches with the same padding mask and positions. Repetitions alternate between the frameworks so
background load hits both alike; medians are reported, with the process CPU seconds of each step beside
the wall seconds (on a shared machine CPU seconds show the work done, wall seconds also the waiting).
Achieved GFLOP/s uses analytic FLOPs (3x the forward, attention over the full padded square, the
vocabulary head at every position, so for our gathered head on the demo preset it overstates the work
done; for ``qwen3_0_6b`` at the trained positions only, as both sides run it there) against a float32
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

The PyTorch side of ``qwen3_0_6b`` gathers the trained positions before its head as ours does, and
steps a ``fused=True`` AdamW (PyTorch's fastest CPU AdamW, without the foreach variant's temporaries of
the parameters' size). The first step of each side, from the same weights, prints its loss and gradient
norm: the two must agree (the same loss on the same rows).

``--compile-only`` (``qwen3_0_6b``) builds our step's two programs at the preset's shape from abstract
weights (nothing is allocated, nothing runs): the gradient of a micro-batch and the optimizer step, lowered
and compiled, and prints XLA's memory analysis of each (arguments, outputs, aliased, temporaries).

Usage: python benchmarks/train_step.py [--preset default|demo|qwen3_0_6b] [--reps 3] [--threads 2] [--bf16]
       [--compare-gather] [--retain-freed-memory] [--rounds 1] [--layers N] [--remat none|full]
       [--dry-run] [--compile-only]
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import statistics
import tempfile
import time

# common (a sibling: the script's folder is on sys.path) sets JAX_PLATFORMS before it loads jax.
from common import CONFIG, QWEN3_0_6B, build_models, forward_flops, matmul_peak_gflops, train_step_flops

import jax
import numpy as np

from envace_jax import host_memory
from envace_jax.config import LossConfig
from envace_jax.model_sizes import DEMO
from envace_jax.models import hf_io
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


# Group advantages of the qwen3_0_6b preset's rows, in turn (a GRPO group's scores, normalised).
GRPO_ADVANTAGES = (1.0, -1.0, 0.5, -0.5)


def grpo_rows(vocab: int, batch: int, length: int, prompt: int):
    """One GRPO group: ``batch`` rows of a shared ``prompt``-token prompt and ``length - prompt`` completion
    tokens each, the completions trained. Old log-probs are -log(vocab) plus N(0, 0.1) noise, what a
    sampler with random weights reports, so the clipped ratio sees values off 1 on both sides."""
    if not 0 < prompt < length:
        raise ValueError(f"--prompt {prompt} must be between 1 and --length {length} - 1")
    rng = np.random.RandomState(0)
    shared = [int(t) for t in rng.randint(0, vocab, prompt)]
    gens = []
    for i in range(batch):
        gen = [int(t) for t in rng.randint(0, vocab, length - prompt)]
        old = (-math.log(vocab) + 0.1 * rng.randn(len(gen))).tolist()
        gens.append(Generation(ACT, shared, gen, old, "g", i, 0))
    adv = [GRPO_ADVANTAGES[i % len(GRPO_ADVANTAGES)] for i in range(batch)]
    return build_batch(gens, adv, [0] * batch, max_len=length, length_multiple=length)


def torch_policy_loss(logp, old, adv, w, c: LossConfig):
    """Our ``loss.policy_loss`` in PyTorch, for the per-sequence aggregations without role balancing:
    (sum over rows, rows counted). logp, old, w ``[B, T]``; adv ``[B]``."""
    import torch

    on = w > 0
    old = torch.where(on, old, logp.detach())
    adv = torch.where(on, adv[:, None].expand_as(logp), torch.zeros_like(logp))
    ratio = torch.exp((logp - old).clamp(-c.log_ratio_clamp, c.log_ratio_clamp))
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - c.clip_low, 1.0 + c.clip_high))
    pg = torch.where(adv < 0, torch.minimum(clipped, -adv * c.dual_clip), clipped) if c.dual_clip else clipped
    row_w = w.sum(-1)
    has = row_w > 0
    row_sum = torch.where(on, pg * w, torch.zeros_like(pg)).sum(-1)
    if c.agg == "seq_mean_token_mean":
        row_sum = row_sum / torch.where(has, row_w, torch.ones_like(row_w))
    return torch.where(has, row_sum, torch.zeros_like(row_sum)).sum(), has.sum()


def torch_step_fn(tm, tb, micro: int, bf16: bool, gathered: bool = False, rl: LossConfig | None = None):
    """One PyTorch optimizer step over ``tb`` in micro-batches of ``micro`` rows (same loss as ours).

    ``gathered``: the vocabulary head and log-softmax run on the trained positions only (what our
    Trainer does by default), instead of transformers' logits at every position. ``rl``: the policy
    loss of these settings (``torch_policy_loss``) instead of the SFT cross-entropy, and a fused AdamW.
    The step returns (loss, gradient norm before clipping)."""
    import torch

    opt = torch.optim.AdamW(tm.parameters(), lr=1e-6, weight_decay=0.01, fused=rl is not None)
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
                old=torch.tensor(tb.old_logprobs[sl]),
                adv=torch.tensor(tb.advantages[sl]),
            )
        )
    # The loss is a sum over micro-batches divided by the batch's count, as our Trainer's.
    total = float((tb.loss_weights.sum(-1) > 0).sum()) if rl is not None else float(tb.loss_weights.sum())

    def step():
        loss = 0.0
        for p in parts:
            tgt, w = p["tgt"], p["w"]
            on = w != 0
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                if gathered:
                    hidden = tm.model(input_ids=p["ids"], attention_mask=p["mask"], position_ids=p["pos"])[0]
                    logits, tgt_on = tm.lm_head(hidden[on]), tgt[on]
                else:
                    logits = tm(input_ids=p["ids"], attention_mask=p["mask"], position_ids=p["pos"]).logits
            if rl is not None:
                # Log-probs at the trained positions (all positions' logits sliced there when not gathered),
                # put back in [B, T] for the per-row aggregation.
                picked = logits.float() if gathered else logits.float()[on]
                lp = torch.log_softmax(picked, -1).gather(-1, (tgt_on if gathered else tgt[on])[:, None])[:, 0]
                logp = torch.zeros(w.shape, dtype=lp.dtype).masked_scatter(on, lp)
                part = torch_policy_loss(logp, p["old"], p["adv"], w, rl)[0] / total
            else:
                if gathered:
                    logits, tgt, w = logits, tgt_on, w[on]
                logp = torch.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]
                part = -(logp * w).sum() / total
            part.backward()
            loss += float(part.detach())
        gnorm = torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, float(gnorm)

    return step


def timed(fn) -> tuple[float, float, object]:
    """(wall, process CPU) seconds of one call, and what it returned."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / float(1 << 20)


def jax_rl_step(trainer: Trainer, tb):
    def step():
        m = trainer.update(tb, kind="rl")
        return m["loss"], m["grad_norm"]

    return step


def run_sequential(args, config: dict, tb, micro: int) -> tuple[dict, dict, dict, dict]:
    """Each side alone in memory: save a seeded transformers model once, then per phase load one side from
    that folder, take a first step (compile / optimizer state) and ``args.reps`` timed steps, and free it
    before the next. Phases run ours, PyTorch, then ABBA over ``args.rounds``. Returns (wall, cpu, first
    step, peak) lists per side: the first step's (seconds, loss, grad norm) and the matmul peak measured
    right after the phase's steps (the load of a shared machine drifts between phases) kept per phase."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    loss_cfg = LossConfig()
    wall, cpu, first, peaks = ({"jax": [], "torch": []} for _ in range(4))
    order = []
    for r in range(args.rounds):
        order += ["jax", "torch"] if r % 2 == 0 else ["torch", "jax"]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        tm = Qwen3ForCausalLM(Qwen3Config(**config))
        tm.save_pretrained(d)
        del tm
        gc.collect()
        for side in order:
            if side == "jax":
                model = hf_io.load_hf(d, remat_policy=args.remat)
                trainer = Trainer(model, OptimConfig(lr=1e-6, weight_decay=0.01), loss_cfg, micro_batch_size=micro)
                step = jax_rl_step(trainer, tb)
            else:
                tm = Qwen3ForCausalLM.from_pretrained(d, dtype=torch.float32, use_cache=False).train()
                if args.remat == "full":
                    # transformers 5.25 renamed it; older releases know only the first name.
                    enable = getattr(tm, "activation_checkpointing_enable", None) or tm.gradient_checkpointing_enable
                    enable()
                step = torch_step_fn(tm, tb, micro, False, gathered=True, rl=loss_cfg)
            w0, _, (loss, gnorm) = timed(step)
            first[side].append((w0, loss, gnorm))
            print(f"{side:5s} first step {w0:.1f} s: loss {loss:.6f}, grad norm {gnorm:.6f}", flush=True)
            for _ in range(args.reps):
                w, c, _ = timed(step)
                wall[side].append(w)
                cpu[side].append(c)
                print(f"{side:5s} step {w:.2f} s (cpu {c:.1f} s)  peak rss {peak_rss_gib():.1f} GiB", flush=True)
            peaks[side].append(matmul_peak_gflops())
            print(f"{side:5s} phase's matmul peak {peaks[side][-1]:.1f} GFLOP/s", flush=True)
            if side == "jax":
                del model, trainer
                jax.clear_caches()
            else:
                del tm
            del step
            gc.collect()
    return wall, cpu, first, peaks


def report_compiled_memory(args, config: dict, tb, micro: int) -> None:
    """--compile-only: XLA's memory analysis of our step's programs at ``config``'s shape, lowered from
    abstract weights (the Trainer of an ``nnx.eval_shape`` model), with the step's first micro-batch."""
    import jax.numpy as jnp
    from flax import nnx

    from envace_jax.models import qwen3

    cfg = qwen3.Qwen3Config.from_hf(config, param_dtype="float32", dtype="float32", remat_policy=args.remat)
    model = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
    trainer = Trainer(model, OptimConfig(lr=1e-6, weight_decay=0.01), LossConfig(), micro_batch_size=micro)
    params = trainer.params
    # The rows as Trainer.update cuts them (with the gathered head's trained-position index).
    mb = trainer._local_micro_batches(tb)[0]
    count = jax.ShapeDtypeStruct((), jnp.float32)
    programs = {
        "gradient (one micro-batch)": trainer.program("grad").lower(params, mb, None),
        "optimizer step": trainer.program("apply").lower(params, trainer.opt_state, params, count),
    }

    def gb(b: int) -> str:
        return f"{b / 1e9:.3f} GB"

    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    B, T = tb.tokens.shape
    print(f"jax {jax.__version__}  preset {args.preset}: {config['num_hidden_layers']} layers, {B} rows x {T} tokens")
    print(f"micro-batch {micro} rows, remat {args.remat}; float32 weights {gb(weights)}")
    for name, lowered in programs.items():
        m = lowered.compile().memory_analysis()
        print(
            f"{name}: temporaries {gb(m.temp_size_in_bytes)}, arguments {gb(m.argument_size_in_bytes)}, "
            f"outputs {gb(m.output_size_in_bytes)}, aliased {gb(m.alias_size_in_bytes)}",
            flush=True,
        )


def report_sequential(args, config: dict, tb, micro: int) -> None:
    import torch

    B, T = tb.tokens.shape
    trained = int((tb.loss_weights != 0).sum())
    wall, cpu, first, peaks = run_sequential(args, config, tb, micro)
    flops = train_step_flops(config, B, T, head_positions=trained)
    med = {k: statistics.median(v) for k, v in wall.items()}
    print(
        f"jax {jax.__version__} torch {torch.__version__}  preset {args.preset}: {config['num_hidden_layers']} "
        f"layers, {B} rows x {T} tokens ({trained} trained, the head on those only on both sides), "
        f"micro-batch {micro}, remat {args.remat}, {args.threads} threads, sides one at a time, "
        f"order {'ABBA' if args.rounds > 1 else 'AB'} x {args.rounds} round(s)"
    )
    print(host_memory.describe())
    for k in ("jax", "torch"):
        f = ", ".join(f"{w:.1f} s (loss {lo:.6f}, grad norm {g:.6f})" for w, lo, g in first[k])
        print(f"{k:5s} first step(s): {f}")
    for k in ("jax", "torch"):
        peak = statistics.median(peaks[k])
        print(
            f"{k:5s} step s: {[round(x, 2) for x in wall[k]]} median {med[k]:.2f}  cpu-s median "
            f"{statistics.median(cpu[k]):.1f}  -> {flops / med[k] / 1e9:.1f} GFLOP/s "
            f"({flops / med[k] / 1e9 / peak:.0%} of its phases' matmul peak, {peak:.1f} GFLOP/s)"
        )
    print(f"step FLOPs (6 x matmul weights x tokens + attention, head on {trained} positions): {flops / 1e12:.3f} T")
    print(f"matmul peak (jnp float32 2048^2) per phase: {peaks}; process peak rss {peak_rss_gib():.1f} GiB")
    cpu_ratio = statistics.median(cpu["torch"]) / statistics.median(cpu["jax"])
    print(
        f"ours/PyTorch speed (PyTorch time / our time, medians): {med['torch'] / med['jax']:.2f}x wall, "
        f"{cpu_ratio:.2f}x process CPU seconds  (>1: ours faster)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=("default", "demo", "qwen3_0_6b"), default="default")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="rows (default 8; demo 32; qwen3_0_6b 4)")
    ap.add_argument("--length", type=int, default=512, help="row length of the default and qwen3_0_6b presets")
    ap.add_argument("--prompt", type=int, default=None, help="qwen3_0_6b: prompt tokens per row (default half)")
    ap.add_argument("--layers", type=int, default=None, help="qwen3_0_6b: fewer layers, for a smoke run")
    ap.add_argument("--remat", choices=("none", "full"), default="none", help="qwen3_0_6b: per-layer remat")
    ap.add_argument("--rounds", type=int, default=1, help="qwen3_0_6b: rounds of both sides, ABBA")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="qwen3_0_6b: print the rows, their trained positions and the step's FLOPs, and build nothing",
    )
    ap.add_argument(
        "--compile-only",
        action="store_true",
        help="qwen3_0_6b: compile our step's programs from abstract weights and print their memory analysis",
    )
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
    if args.preset == "qwen3_0_6b":
        config = dict(QWEN3_0_6B, num_hidden_layers=args.layers or QWEN3_0_6B["num_hidden_layers"])
        B = args.batch or 4
        tb = grpo_rows(config["vocab_size"], B, args.length, args.prompt or args.length // 2)
        if args.dry_run:
            trained = int((tb.loss_weights != 0).sum())
            flops = train_step_flops(config, B, tb.tokens.shape[1], head_positions=trained)
            print(f"rows {B} x {tb.tokens.shape[1]} tokens, trained {trained}, layers {config['num_hidden_layers']}")
            print(f"step FLOPs {flops:.0f}")
            return
        if args.bf16 or args.compare_gather:
            raise SystemExit("--bf16 and --compare-gather are not available with --preset qwen3_0_6b")
        if args.compile_only:
            report_compiled_memory(args, config, tb, args.micro or B)
            return
        report_sequential(args, config, tb, args.micro or B)
        return
    if args.layers or args.remat != "none" or args.prompt or args.rounds != 1 or args.dry_run or args.compile_only:
        raise SystemExit(
            "--layers, --remat, --prompt, --rounds, --dry-run and --compile-only apply to --preset qwen3_0_6b only"
        )
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
            w, c, _ = timed(steps[k])
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
