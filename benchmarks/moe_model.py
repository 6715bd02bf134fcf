"""Our Qwen3-MoE against transformers' ``Qwen3MoeForCausalLM`` on CPU, at Qwen3-30B-A3B's real width with the
layer count cut to fit this machine: the forward, one update step and greedy sampling.

    python benchmarks/moe_model.py                          # 1 layer, 4 rows x 128 tokens, 32 new tokens
    python benchmarks/moe_model.py --layers 2 --rounds 3 --out runs/bench/moe_model.json

The width is Qwen3-30B-A3B's (hidden 2048, 32 query / 4 key-value heads of 128, 128 experts of 768, 8 per token,
vocabulary 151,936, untied head), float32, every layer sparse. One random transformers checkpoint is written
once; each side then runs in a process of its own (the two models and their AdamW states would not fit this
machine's memory together), the sides alternating for ``--rounds`` rounds, each timing every workload ``--reps``
times after an untimed first call. Workloads, the same on both sides:

- forward: logits of ``rows x tokens`` ids (ours: the jitted ``model(ids)``; transformers: ``model(ids).logits``
  under ``no_grad``);
- update: one optimizer step of a policy-gradient loss (the trainer's RL loss on our side; on transformers' a
  sum of each generated token's log-prob times its row's advantage over the same tokens, ``loss.backward()`` and
  ``torch.optim.AdamW.step``), every parameter trained, the prompt half of each row untrained; both sides run
  the vocabulary head on the scored positions only (ours: the trainer's ``gather_trained``; transformers:
  ``logits_to_keep``), and it runs last, since it changes the weights;
- sampler: greedy ``--new`` tokens after ``rows`` prompts of ``tokens / 2`` (ours: ``Sampler.generate``;
  transformers: ``generate(do_sample=False)``).

transformers runs its fastest CPU experts implementation, ``grouped_mm`` (``torch._grouped_mm``), on
``--threads`` torch threads. The table gives medians over all rounds and transformers s / ours s (above 1: ours
is faster).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WIDTH = dict(
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    vocab_size=151936,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
)
# --small: the same model at a toy width, for checking the script itself (tests/benchmarks), not a result
SMALL = dict(
    WIDTH,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    vocab_size=512,
)
WORKLOADS = ("forward", "update", "sampler")


def write_checkpoint(out_dir: str, layers: int, seed: int = 0, small: bool = False) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    width = SMALL if small else WIDTH
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, **width)).float().eval()
    model.save_pretrained(out_dir)


def _medians(fn, reps: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _inputs(rows: int, tokens: int, vocab: int, seed: int = 1):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (rows, tokens))
    adv = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0)
    return ids, adv


def worker_ours(path: str, rows: int, tokens: int, new: int, reps: int, workloads: tuple[str, ...]) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from envace_jax.config import LossConfig, OptimConfig
    from envace_jax.models import hf_io
    from envace_jax.rl.batch import build_batch
    from envace_jax.rl.trainer import Trainer
    from envace_jax.rl.types import ACT, Generation
    from envace_jax.sampling import Sampler, SamplingParams

    model = hf_io.load_hf(path)
    ids, adv = _inputs(rows, tokens, model.config.vocab_size)
    half = tokens // 2

    def forward() -> float:  # each workload in a function of its own: its programs and state freed after it
        graphdef, state = nnx.split(model)
        fwd = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
        x = jnp.asarray(ids, jnp.int32)
        return _medians(lambda: jax.block_until_ready(fwd(state, x)), reps)

    def update() -> float:
        gens = [
            Generation(ACT, ids[i, :half].tolist(), ids[i, half:].tolist(), [0.0] * (tokens - half), "u", i, 0)
            for i in range(rows)
        ]
        batch = build_batch(gens, adv, [0] * rows, max_len=tokens, length_multiple=16)
        trainer = Trainer(model, OptimConfig(lr=1e-6), LossConfig(), micro_batch_size=rows)
        return _medians(lambda: trainer.update(batch), reps)

    def sample() -> None:
        sampler = Sampler(model, cache_size=half + new)
        prompts = [ids[i, :half].tolist() for i in range(rows)]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=new)
        out["sampler"] = _medians(lambda: sampler.generate(prompts, greedy), reps)
        out["first_tokens"] = sampler.generate(prompts, greedy).tokens[0][:8]

    out = {}
    if "forward" in workloads:
        out["forward"] = forward()
    if "sampler" in workloads:
        sample()
    gc.collect()
    if "update" in workloads:  # last: it changes the weights the other two read
        out["update"] = update()
    return out


def worker_hf(path: str, rows: int, tokens: int, new: int, reps: int, threads: int, workloads: tuple[str, ...]) -> dict:
    import torch
    from transformers import Qwen3MoeForCausalLM

    torch.set_num_threads(threads)
    model = Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.config._experts_implementation = "grouped_mm"  # its fastest on CPU (benchmarks/moe_block.py)
    ids, adv = _inputs(rows, tokens, model.config.vocab_size)
    x = torch.from_numpy(ids)

    def forward():
        with torch.no_grad():
            model(x).logits

    half = tokens // 2

    def update_seconds() -> float:
        advantage = torch.tensor(adv, dtype=torch.float32)[:, None]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
        model.train()

        def update():
            # the head over the scored positions only (half - 1 .. L - 2), as our trainer's gather_trained does
            logits = model(x, logits_to_keep=tokens - half + 1).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, x[:, half:, None])[..., 0]
            loss = -(logp * advantage).sum() / logp.numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return _medians(update, reps)

    prompt = x[:, :half]

    def sample():
        with torch.no_grad():
            return model.generate(prompt, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)

    out = {}
    if "forward" in workloads:
        out["forward"] = _medians(forward, reps)
    if "sampler" in workloads:
        out["sampler"] = _medians(sample, reps)
        out["first_tokens"] = sample()[0, half : half + 8].tolist()
    gc.collect()
    if "update" in workloads:  # last: it changes the weights the other two read
        out["update"] = update_seconds()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint this script wrote before (default: a new one)")
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="a comma-separated subset of " + ",".join(WORKLOADS)
    )
    ap.add_argument("--small", action="store_true", help="a toy width, to check the script (not a result)")
    ap.add_argument("--out", default=None, help="write the medians and ratios here as JSON")
    ap.add_argument("--worker", choices=("ours", "hf"), default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    workloads = tuple(w for w in a.workloads.split(",") if w)
    if not workloads or set(workloads) - set(WORKLOADS):
        ap.error(f"--workloads: choose from {WORKLOADS}, got {a.workloads!r}")
    if a.worker:
        if a.worker == "ours":
            res = worker_ours(a.checkpoint, a.rows, a.tokens, a.new, a.reps, workloads)
        else:
            res = worker_hf(a.checkpoint, a.rows, a.tokens, a.new, a.reps, a.threads, workloads)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = a.checkpoint or os.path.join(tmp, "qwen3_moe")
        if not a.checkpoint:
            print(f"writing a {a.layers}-layer Qwen3-30B-A3B-wide checkpoint ...", flush=True)
            write_checkpoint(path, a.layers, small=a.small)
        runs: dict[str, list[dict]] = {"ours": [], "hf": []}
        for r in range(a.rounds):
            for side in ("ours", "hf"):
                cmd = [sys.executable, __file__, "--worker", side, "--checkpoint", path]
                cmd += ["--rows", str(a.rows), "--tokens", str(a.tokens), "--new", str(a.new), "--reps", str(a.reps)]
                cmd += ["--threads", str(a.threads), "--workloads", ",".join(workloads)]
                env = dict(os.environ, JAX_PLATFORMS="cpu")
                t0 = time.perf_counter()
                p = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode or not line:
                    print(p.stdout[-2000:], p.stderr[-3000:], file=sys.stderr)
                    return 1
                runs[side].append(json.loads(line[0][7:]))
                print(f"round {r + 1} {side}: {runs[side][-1]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    med = {s: {w: statistics.median(x[w] for x in runs[s]) for w in workloads} for s in runs}
    same = runs["ours"][0].get("first_tokens") == runs["hf"][0].get("first_tokens")
    width = "toy width (--small, not a result)" if a.small else "Qwen3-30B-A3B width"
    print(f"\n{width}, {a.layers} layer(s), {a.rows} rows x {a.tokens} tokens, {a.new} new tokens, float32")
    print("| workload | ours s | transformers s | transformers / ours |")
    print("|---|---|---|---|")
    for w in workloads:
        print(f"| {w} | {med['ours'][w]:.3f} | {med['hf'][w]:.3f} | {med['hf'][w] / med['ours'][w]:.2f}x |")
    if "sampler" in workloads:
        print(f"greedy tokens equal: {same}")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "runs": runs, "medians": med, "greedy_equal": same}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
