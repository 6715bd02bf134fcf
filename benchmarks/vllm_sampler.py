"""Our sampler against the vLLM rollout engine (``rollout.engine="vllm"``, rl/vllm_engine.py) on the same weights.

    python benchmarks/vllm_sampler.py                                    # Qwen3-0.6B shape, bfloat16, batch 8 and 32
    python benchmarks/vllm_sampler.py --preset smoke --batches 4          # the same path in a minute

The model is a random Qwen3 of the preset's shape made by us; the engine gets its weights through the rollout
client's sync (shared memory, no file), so both decode the same model in the same dtype. Greedy, a 64-token
prompt per row, no early stop, vLLM as the rollouts run it (a worker process, torch.compile unless
``--eager``, its default CPU threads). Per batch size, in one process and one window:

- seconds of a 32-new-token call: ours (median of ``reps``), vLLM (median of ``reps``), ours again; the ratio is
  ours (the mean of both medians) / vLLM, above 1 when vLLM is faster; and how far the greedy rows agree (mean
  length of the common prefix: bfloat16 near-ties part them);
- the fixed cost per call and the decode step of both, by the difference method (calls of 40 and 8 new tokens);
- the log-prob gap between the engine and our sampler on the tokens both chose (mean and largest |difference|
  over each row's common greedy prefix): what the update's engine correction weighs;
- our decode step against its floor (the step's weight matmuls and one read of the k/v cache, timed alone, as
  ``benchmarks/sampler_real_shape.py`` measures it), and our prefill and decode seconds inside one call.

Also the engine's start-up (process, model build, compile) and the seconds of a weight sync at this shape.
Needs ``make vllm-deps``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
from sampler_real_shape import LONG, NEW, PRESETS, PROMPT, SHORT, floor_and_split, ours, split

from envace_jax.config import VllmSettings
from envace_jax.models import qwen3
from envace_jax.rl.vllm_engine import VllmEngine
from envace_jax.sampling import Sampler


def vllm_call(engine: VllmEngine, prompts, new: int) -> tuple[float, list[list[int]]]:
    params = [{"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": new, "stop_token_ids": []}] * len(prompts)
    t = time.perf_counter()
    rows = engine.generate(prompts, params)
    dt = time.perf_counter() - t
    assert all(len(r["ids"]) == new for r in rows), [len(r["ids"]) for r in rows]
    return dt, [r["ids"] for r in rows]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def one_batch(preset: str, model, engine: VllmEngine, batch: int, reps: int, rng) -> dict:
    cfg = PRESETS[preset]
    sampler = Sampler(model)
    prompts = [rng.randint(3, cfg["vocab_size"], PROMPT).tolist() for _ in range(batch)]
    for n in (NEW, LONG, SHORT):  # compile every budget (ours and vLLM's) before timing
        ours(sampler, prompts, n)
        vllm_call(engine, prompts, n)
    res: dict = {"batch": batch}
    # ours, vLLM, ours: both of ours bracket vLLM's window
    first = [ours(sampler, prompts, NEW)[0] for _ in range(reps)]
    v = [vllm_call(engine, prompts, NEW) for _ in range(reps)]
    second = [ours(sampler, prompts, NEW) for _ in range(reps)]
    res["ours_before_s"], res["ours_after_s"] = statistics.median(first), statistics.median([t for t, _ in second])
    res["vllm_s"] = statistics.median([t for t, _ in v])
    res["ours_s"] = (res["ours_before_s"] + res["ours_after_s"]) / 2
    tok_o, tok_v = second[-1][1], v[-1][1]
    res["equal_rows"] = sum(a == b for a, b in zip(tok_o, tok_v))
    res["common_prefix_mean"] = float(np.mean([common_prefix(a, b) for a, b in zip(tok_o, tok_v)]))

    runs = {k: [] for k in ("ours_long", "ours_short", "vllm_long", "vllm_short")}
    for _ in range(reps):
        runs["ours_long"].append(ours(sampler, prompts, LONG)[0])
        runs["ours_short"].append(ours(sampler, prompts, SHORT)[0])
        runs["vllm_long"].append(vllm_call(engine, prompts, LONG)[0])
        runs["vllm_short"].append(vllm_call(engine, prompts, SHORT)[0])
    med = {k: statistics.median(x) for k, x in runs.items()}
    res["ours_fixed_s"], res["ours_step_s"] = split(med["ours_long"], med["ours_short"])
    res["vllm_fixed_s"], res["vllm_step_s"] = split(med["vllm_long"], med["vllm_short"])

    from envace_jax.sampling import SamplingParams

    # the engine-trainer log-prob gap the rollouts would carry into the update: over each row's common greedy prefix
    mine = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    base = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": NEW, "stop_token_ids": []}
    theirs = engine.generate(prompts, [base] * len(prompts))
    gaps = []
    for t, lp, row in zip(mine.tokens, mine.logprobs, theirs):
        n = common_prefix(list(t), row["ids"])
        gaps.extend(abs(a - b) for a, b in zip(lp[:n], row["logprobs"][:n]))
    res["logprob_gap_mean"] = float(np.mean(gaps)) if gaps else float("nan")
    res["logprob_gap_max"] = float(np.max(gaps)) if gaps else float("nan")

    res.update(floor_and_split(sampler, prompts, cfg))
    return res


def markdown(results: list[dict], head: dict) -> str:
    lines = [
        f"Engine start-up {head['start_s']:.0f} s (ours: model build {head['build_s']:.0f} s); weight sync "
        f"{head['sync_s']:.2f} s (median of {len(head['syncs'])}; of the last: copy into shared memory "
        f"{head['sync_parts'][-1]['copy_s']:.2f} s, vLLM's reload {head['sync_parts'][-1]['reload_s']:.2f} s).",
        "",
        "| batch | ours (before / after) | vLLM | ours / vLLM | greedy rows equal | common prefix (of 32) "
        "| fixed per call ours / vLLM | decode step ours / vLLM | ours step floor | ours step / floor "
        "| ours prefill / decode in a call | log-prob gap mean / max |",
        "|---:|---|---:|---:|---:|---:|---|---|---:|---:|---|---|",
    ]
    for r in results:
        floor = r["floor_matmul_s"] + r["floor_cache_s"]
        lines.append(
            f"| {r['batch']} | {r['ours_before_s']:.2f} / {r['ours_after_s']:.2f} s | {r['vllm_s']:.2f} s | "
            f"**{r['ours_s'] / r['vllm_s']:.2f}x** | {r['equal_rows']}/{r['batch']} | {r['common_prefix_mean']:.1f} | "
            f"{r['ours_fixed_s']:.2f} / {r['vllm_fixed_s']:.2f} s | {1e3 * r['ours_step_s']:.0f} / "
            f"{1e3 * r['vllm_step_s']:.0f} ms | {1e3 * floor:.0f} ms | {r['ours_step_s'] / floor:.2f}x | "
            f"{r['ours_prefill_s']:.2f} / {r['ours_decode_s']:.2f} s | {r['logprob_gap_mean']:.4f} / "
            f"{r['logprob_gap_max']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3_0_6b", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=3, help="weight syncs timed (after the first)")
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--out", default="runs/vllm_sampler/results.json")
    args = ap.parse_args(argv)
    rng = np.random.RandomState(0)
    t = time.perf_counter()
    cfg = qwen3.Qwen3Config.from_hf(PRESETS[args.preset], dtype=args.dtype, param_dtype=args.dtype)
    model = qwen3.init_model(cfg, seed=0)
    head = {"preset": args.preset, "dtype": args.dtype, "build_s": time.perf_counter() - t}
    t = time.perf_counter()
    engine = VllmEngine(cfg, VllmSettings(enforce_eager=args.eager), max_model_len=PROMPT + LONG + 8)
    engine.load_weights(model)
    head["start_s"] = time.perf_counter() - t
    head["syncs"] = [engine.load_weights(model) for _ in range(args.syncs)]
    head["sync_s"] = statistics.median(head["syncs"])
    head["sync_parts"] = engine.sync_parts[-args.syncs :]
    print(
        f"preset {args.preset}, {args.dtype}, {cfg.num_params() / 1e6:.0f}M parameters; vLLM {engine.version} "
        f"(eager={args.eager}) started in {head['start_s']:.0f} s; weight sync {head['syncs']} s",
        flush=True,
    )
    results = []
    try:
        for b in (int(x) for x in args.batches.split(",") if x):
            results.append(one_batch(args.preset, model, engine, b, args.reps, rng))
            print(json.dumps(results[-1]), flush=True)
    finally:
        engine.close()
    md = markdown(results, head)
    print(md)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"head": head, "results": results, "markdown": md}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
