"""Sampler throughput against transformers ``generate`` on the 40M Qwen3 (random weights), CPU.

Measures, alternating ours and HF in one run so both see the same machine load:
  - tokens/s at batch 8 and 32, prompt 128, 128 new tokens (no early stop), greedy and
    T=1.0 / top-p 0.95; the ratio to HF; the fraction of the float32 matmul peak (2048^2 matmul);
  - at greedy settings, a ceiling: the step's weight matmuls alone, timed at the same batch, bound
    how far below HF's time per step any decoder can go on this machine;
  - at batch 32 (``--floor-batch``) greedy, our decode step against its floor: the step is timed as the
    difference between a 256- and a 64-token call divided by 192 (prefill and per-call work cancel),
    both in the same 384-slot cache window; the floor is the step's weight matmuls plus one read of
    that window's k/v cache, each timed alone at the same batch, alternating with the step; on the
    wall clock and on the process CPU clock (both threads), which a shared machine disturbs less;
  - an 8-turn episode (64 generated + 48 appended tokens per turn): ``continue_`` versus
    re-prefilling the whole conversation every turn.

Usage: ``python benchmarks/sampler.py [--quick] [--batches 8,32] [--greedy-only] [--no-episode]``
(the issue's figure: ``--batches 32 --greedy-only --no-episode``: tok/s against HF and the step / floor line).

``--preset qwen3_0_6b`` (or ``smoke``) times a real Qwen3 shape instead: ``benchmarks/sampler_real_shape.py``
(batch 1, 8 and 32, 64-token prompts, 32 new tokens; the fixed cost per call; the step against its floor),
in a process that keeps freed memory (``envace_jax/host_memory.py``; ``ENVACE_GLIBC_HEAP=default`` opts out).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

# common (a sibling: the script's folder is on sys.path) sets JAX_PLATFORMS before it loads jax.
from common import build_models, cache_read_floor_s, decode_matmul_floor_s, matmul_peak_gflops
from sampler_real_shape import PRESETS

from envace_jax import host_memory

from envace_jax.sampling import Sampler, SamplingParams

PROMPT, NEW = 128, 128


def build():
    hf, model = build_models(2, train=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    hf.generation_config.eos_token_id = None  # every row generates exactly NEW tokens
    return hf, model


def flops_per_token(ctx: float) -> float:
    d, f, L, n, k, h, v = 512, 1536, 8, 8, 4, 64, 32000
    per_layer = 2 * (d * n * h * 2 + d * k * h * 2 + 3 * d * f) + 4 * n * h * ctx
    return L * per_layer + 2 * d * v


def time_ours(sampler, prompts, params) -> float:
    t = time.perf_counter()
    out = sampler.generate(prompts, params)
    dt = time.perf_counter() - t
    assert all(n == NEW for n in out.lengths), out.finish_reasons
    return dt


def time_hf(hf, prompts, sample: bool) -> float:
    ids = torch.tensor(prompts)
    kw = dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0) if sample else dict(do_sample=False)
    t = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0, **kw
        )
    dt = time.perf_counter() - t
    assert out.shape[1] == PROMPT + NEW
    return dt


def decode_step_vs_floor(model, batch: int, reps: int, rng, compare: dict | None = None) -> None:
    """Prints our decode step's time, its floor and their ratio (medians over ``reps`` alternations),
    on the wall clock and on the process CPU clock (less disturbed by other jobs on a shared machine).
    ``compare``: XLA options of a second sampler whose step alternates with the default one's; the ratio
    of the two steps is printed too."""
    long, short = 2 * NEW, NEW // 2
    window = PROMPT + long
    samplers = {"ours": Sampler(model, cache_size=window, window_buckets=(window,))}
    if compare is not None:
        samplers["with " + ",".join(f"{k}={v}" for k, v in compare.items())] = Sampler(
            model, cache_size=window, window_buckets=(window,), compiler_options=compare
        )
    prompts = [rng.randint(3, 32000, PROMPT).tolist() for _ in range(batch)]

    def call(sampler, n: int) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n))
        assert all(k == n for k in out.lengths), out.finish_reasons
        return time.perf_counter() - w, time.process_time() - c

    tokens = {}
    for label, sampler in samplers.items():  # compile, and check that the options change no token
        call(sampler, long), call(sampler, short)
        tokens[label] = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=short)).tokens
    if len(tokens) == 2:
        a, b = tokens.values()
        print(f"greedy tokens identical under both options: {all(list(x) == list(y) for x, y in zip(a, b))}")
    rows = {(label, clock): [] for label in samplers for clock in ("wall", "cpu")}
    for _ in range(reps):
        for label, sampler in samplers.items():
            a, b = call(sampler, long), call(sampler, short)
            for i, (clock, name) in enumerate(((time.perf_counter, "wall"), (time.process_time, "cpu"))):
                step = (a[i] - b[i]) / (long - short)
                mm = decode_matmul_floor_s(batch, clock=clock)
                read = cache_read_floor_s(batch, window, clock=clock)
                rows[(label, name)].append((step, mm, read))
    for (label, name), r in rows.items():
        step, mm, read = (float(np.median([x[j] for x in r])) for j in range(3))
        ratio = float(np.median([s / (m + d) for s, m, d in r]))
        print(
            f"batch {batch:2d} decode step ({name:4s}, {label}) {1e3 * step:6.1f} ms; "
            f"floor {1e3 * (mm + read):6.1f} ms "
            f"(weight matmuls {1e3 * mm:.1f} + one read of the {window}-slot k/v cache {1e3 * read:.1f}); "
            f"step / floor {ratio:.2f}x (median of {len(r)} alternations; goal <= 1.3x)"
        )
    if compare is not None:
        (base, other) = samplers
        for name in ("wall", "cpu"):
            paired = [x[0] / y[0] for x, y in zip(rows[(base, name)], rows[(other, name)])]
            print(
                f"decode step ({name}), default options / {other}: {float(np.median(paired)):.2f}x "
                f"(median of {len(paired)} paired alternations)"
            )


def parse_options(text: str) -> dict:
    """``"key=value,key=value"`` -> XLA options (true/false -> bool, digits -> int)."""
    out = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        out[k] = {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)
    return out


def episode(sampler, prompts, turns: int, gen: int, app: int, continuation: bool, seed: int) -> float:
    rng = np.random.RandomState(seed)
    p = SamplingParams(temperature=0.0, max_new_tokens=gen)
    convo = [list(x) for x in prompts]
    t = time.perf_counter()
    out = sampler.generate(convo, p, return_state=continuation)
    for turn in range(1, turns):
        appended = [rng.randint(3, 32000, app).tolist() for _ in prompts]
        for b in range(len(convo)):
            convo[b] += out.tokens[b] + appended[b]
        if continuation:
            out = sampler.continue_(out.state, appended, p, return_state=True)
        else:
            out = sampler.generate(convo, p)
        assert all(n == gen for n in out.lengths), out.finish_reasons
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one repetition, batch 8 and 32 greedy, 4 turns")
    ap.add_argument("--floor-batch", type=int, default=32, help="batch of the step-versus-floor line")
    ap.add_argument("--only-floor", action="store_true", help="print only the step-versus-floor line")
    ap.add_argument(
        "--compare-options",
        default=None,
        help="XLA options (k=v,...) of a second sampler timed against the default in the floor line",
    )
    ap.add_argument("--batches", default="8,32", help="comma-separated batch sizes of the tok/s lines")
    ap.add_argument("--greedy-only", action="store_true", help="skip the top-p lines")
    ap.add_argument("--no-episode", action="store_true", help="skip the multi-turn episode line")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="time a real Qwen3 shape (see above)")
    ap.add_argument("--preset-batches", default="1,8,32", help="batch sizes of the --preset run")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the --preset run")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of both models in the --preset run (bfloat16: Qwen3's released checkpoints' dtype)",
    )
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    if args.preset is not None:
        import sampler_real_shape

        host_memory.retain_freed_memory()
        print(host_memory.describe(), flush=True)
        batches = [int(b) for b in args.preset_batches.split(",")]
        sampler_real_shape.run(args.preset, batches, reps, args.threads, args.dtype)
        return
    compare = parse_options(args.compare_options) if args.compare_options is not None else None
    batches = [int(b) for b in args.batches.split(",")]
    hf, model = build()
    sampler = Sampler(model)
    rng = np.random.RandomState(0)
    peak = matmul_peak_gflops(10)
    print(f"float32 matmul peak (2048^2, jnp): {peak:.1f} GFLOP/s")
    modes = [("greedy", False)] if args.quick or args.greedy_only else [("greedy", False), ("top_p", True)]
    results = {}
    if args.only_floor:
        decode_step_vs_floor(model, args.floor_batch, reps, rng, compare)
        return
    for batch in batches:
        prompts = [rng.randint(3, 32000, PROMPT).tolist() for _ in range(batch)]
        for name, sample in modes:
            params = (
                SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=NEW, seed=1)
                if sample
                else SamplingParams(temperature=0.0, max_new_tokens=NEW)
            )
            time_ours(sampler, prompts, params)  # compile
            ours, theirs = [], []
            for _ in range(reps):
                ours.append(time_ours(sampler, prompts, params))
                theirs.append(time_hf(hf, prompts, sample))
            o, h = min(ours), min(theirs)
            tps_o, tps_h = batch * NEW / o, batch * NEW / h
            frac = batch * NEW * flops_per_token(PROMPT + NEW / 2) / o / 1e9 / peak
            results[(batch, name)] = tps_o
            paired = float(np.median([b / a for a, b in zip(ours, theirs)]))
            print(
                f"batch {batch:2d} {name:6s}: ours {tps_o:8.1f} tok/s  HF {tps_h:8.1f} tok/s  "
                f"ratio {tps_o / tps_h:5.2f}x best-of-{reps}, {paired:.2f}x median of alternations  "
                f"({100 * frac:4.1f}% of matmul peak)"
            )
            if not sample:
                floor = decode_matmul_floor_s(batch)
                print(
                    f"batch {batch:2d} ceiling: the weight matmuls of one decode step alone take "
                    f"{1e3 * floor:.1f} ms; HF spends {1e3 * h / NEW:.1f} ms per step (prefill included), "
                    f"so no decoder can run faster than {h / NEW / floor:.2f}x HF here"
                )
                if batch == args.floor_batch:
                    decode_step_vs_floor(model, batch, reps, rng, compare)
    for batch in batches:
        if (batch, "top_p") in results:
            print(
                f"batch {batch:2d} top-p / greedy throughput: "
                f"{results[(batch, 'top_p')] / results[(batch, 'greedy')]:.2f}"
            )

    if args.no_episode:
        return
    turns = 4 if args.quick else 8
    eb = 8
    prompts = [rng.randint(3, 32000, PROMPT).tolist() for _ in range(eb)]
    ep = Sampler(model, cache_size=PROMPT + turns * (64 + 48))
    episode(ep, prompts, turns, 64, 48, True, 1)  # compile
    episode(ep, prompts, turns, 64, 48, False, 1)
    cont = min(episode(ep, prompts, turns, 64, 48, True, 2 + r) for r in range(reps))
    full = min(episode(ep, prompts, turns, 64, 48, False, 2 + r) for r in range(reps))
    print(
        f"{turns}-turn episode, batch {eb}: continuation {cont:.2f}s  re-prefill {full:.2f}s  "
        f"speed-up {full / cont:.2f}x"
    )


if __name__ == "__main__":
    main()
