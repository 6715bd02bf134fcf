"""The same GRPO iteration in envace-jax, Tunix and TRL, side by side on one random Qwen3.

    make bench-peers                                     # creates the peers' venvs, then the demo and small shapes
    python benchmarks/peers.py --shapes demo --warmup 1 --iters 1 --rounds 1      # a smoke run of every worker
    python benchmarks/peers.py --shapes demo --frameworks ours,ours@1,tunix@1,trl@1   # every arm on one thread
    python benchmarks/peers.py --shapes qwen3_0_6b --prompts 2 --iters 2 --rounds 1 \
        --frameworks ours,tunix,trl@1 --retain-freed-memory                        # Qwen3-0.6B shape, 8 rows

One iteration: sample ``group`` completions of ``new_tokens`` tokens for each of ``prompts`` prompts at
temperature ``--temperature`` (no top-k, no top-p), score each with the same deterministic reward (the
share of even token ids, ``peer_workers/peer_common.reward``), GRPO advantages (group mean, divided by
the group std), one AdamW step on the clipped policy loss (no KL, one optimizer step per batch).

Every framework gets the same weights, ids and numbers: a random Qwen3 built by our code and exported
with ``hf_io.save_hf`` to a temporary folder that each one loads, the same prompt token ids, group size,
lengths, temperature, learning rate and AdamW settings (a JSON spec per worker). Each framework runs in
its own process and, for the peers, its own virtual environment (``make bench-peers`` creates them under
``.cache/peers/``): ``peer_workers/ours_grpo.py``, ``tunix_grpo.py`` (Tunix's ``GRPOLearner``) and
``trl_grpo.py`` (TRL's ``GRPOTrainer``); their docstrings say exactly which API and settings each uses.
Ours runs as three arms: ``ours`` (tuned: one micro-batch, pi_old's log-probs from the update's pass),
``ours-defaults`` (the iteration written with the public classes and nothing but their defaults) and
``ours-plain`` (every row computes its prompt, as the peers do); a fourth, ``ours-vllm``, is ``ours`` with the
vLLM rollout engine sampling (``rollout.engine="vllm"``; `make vllm-deps`), its weight sync inside the iteration
(its row's "peer s / ours" below 1: faster than ours with our sampler):

    python benchmarks/peers.py --shapes demo,small --frameworks ours,ours-vllm
    python benchmarks/peers.py --shapes qwen3_0_6b --prompts 2 --iters 2 --rounds 1 --frameworks ours,ours-vllm \
        --retain-freed-memory
``--frameworks`` lists arms: a framework, or ``framework@threads`` for a thread count of its own (``trl@1``:
torch on one thread; ``ours@1``, ``tunix@1``: XLA on one thread); ``--threads`` is everyone else's.
A worker runs ``--warmup`` iterations (compilation; not counted), then ``--iters`` timed ones, and prints
one ``PEER_RESULT`` JSON line. Workers run one at a time (the 0.6B shape needs ~10 GB each), in
``--rounds`` rounds whose order alternates, and the timed iterations of all rounds are pooled.

It prints, per shape, one table: median seconds per iteration, its sampling and update parts (update =
iteration - sampling: reward, advantages, the loss's forward and backward and the optimizer step),
generated tokens per second of the whole iteration and of sampling alone, and ours against each peer
(peer seconds / our seconds: above 1, ours is faster; against ``ours-defaults`` too when that arm ran).
All results also go to ``--out`` as JSON.
On a shared machine read the ratios, not the seconds; the table's CPU column (process CPU seconds per
wall second) shows how many cores a worker actually had.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from envace_jax.model_sizes import DEMO, QWEN3_0_6B, QWEN3_VOCAB  # plain Python: no jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(REPO, "benchmarks", "peer_workers")
# "ours-plain": ours with every row's prompt computed per row in the update (no rl.prefix_plan), for the
# side-by-side effect of sharing the group's prompt; "ours" is the library's fast path.
# "ours-vllm": ours with the vLLM rollout engine (rollout.engine="vllm") sampling the rows; needs `make vllm-deps`
OURS = ("ours", "ours-plain", "ours-defaults", "ours-vllm")  # our arms: one worker script, this interpreter
FRAMEWORKS = OURS + ("tunix", "trl")
# TRL twice: on 2 torch threads, and on 1, which a 2-core machine shared with other jobs favours by far
# (OpenMP's threads wait on each other when the box is oversubscribed; see docs/performance.md).
DEFAULT_ARMS = ("ours", "ours-defaults", "tunix", "trl", "trl@1")
WORKER_SCRIPT = {**{fw: "ours_grpo.py" for fw in OURS}, "tunix": "tunix_grpo.py", "trl": "trl_grpo.py"}
PEERS_DIR = os.path.join(REPO, ".cache", "peers")
DEFAULT_PYTHON = {
    "tunix": os.path.join(PEERS_DIR, "tunix", "bin", "python"),
    "trl": os.path.join(PEERS_DIR, "trl", "bin", "python"),
}
RESULT_PREFIX = "PEER_RESULT "

_QWEN3 = dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
# Model fields in our ``qwen3.Qwen3Config`` names. demo: ``model_sizes.DEMO`` at a 2,048-token vocabulary;
# small: hidden 256, 4 layers (3.7M parameters); qwen3_0_6b: Qwen3-0.6B's released architecture.
SHAPES: dict[str, dict[str, Any]] = {
    "demo": dict(_QWEN3, vocab_size=2048, **DEMO.fields()),
    "small": dict(
        _QWEN3,
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
    ),
    "qwen3_0_6b": dict(_QWEN3, vocab_size=QWEN3_VOCAB, **QWEN3_0_6B.fields()),
}
ADAMW = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, grad_clip=1.0)


def make_prompts(vocab_size: int, prompts: int, length: int, seed: int) -> list[list[int]]:
    """``prompts`` rows of ``length`` token ids drawn uniformly from the vocabulary (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=(prompts, length)).tolist()


def parse_arm(arm: str) -> tuple[str, int | None]:
    """``"trl"`` -> ("trl", None); ``"trl@1"`` -> ("trl", 1): a framework run with its own thread count."""
    name, _, threads = arm.partition("@")
    if name not in FRAMEWORKS:
        raise ValueError(f"framework {name!r} (in {arm!r}); choose from {FRAMEWORKS}")
    if threads and not (threads.isdigit() and int(threads) > 0):
        raise ValueError(f"{arm!r}: the thread count after '@' must be a positive integer")
    return name, int(threads) if threads else None


def make_spec(
    framework: str, shape: str, model_dir: str, args: argparse.Namespace, threads: int | None = None
) -> dict[str, Any]:
    """The JSON spec of one worker (``peer_common.SPEC_KEYS``); every framework's differs only in ``framework``
    (and ``threads`` when an arm sets its own)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; choose from {FRAMEWORKS}")
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}; choose from {tuple(SHAPES)}")
    model = SHAPES[shape]
    return {
        "framework": framework,
        "shape": shape,
        "model_dir": model_dir,
        "model": dict(model),
        "prompts": make_prompts(model["vocab_size"], args.prompts, args.prompt_len, args.seed),
        "group_size": args.group,
        "new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "adamw": dict(ADAMW),
        "clip_eps": 0.2,
        "warmup": args.warmup,
        "iters": args.iters,
        "seed": args.seed,
        "threads": args.threads if threads is None else threads,
        "micro_batch_rows": args.micro_batch_rows,
    }


def write_checkpoint(shape: str, out_dir: str, seed: int) -> None:
    """A random Qwen3 of ``shape`` built by our code (float32), exported with ``hf_io.save_hf``."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from flax import nnx

    from envace_jax.models import hf_io, qwen3

    cfg = qwen3.Qwen3Config(**SHAPES[shape], param_dtype="float32", dtype="float32", max_position_embeddings=4096)
    hf_io.save_hf(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), out_dir)


def run_worker(
    framework: str, python: str, spec: dict[str, Any], timeout: float, retain_freed_memory: bool = False
) -> dict[str, Any]:
    """Runs one worker on ``spec`` and returns its result record, or ``{"error": ...}``.

    ``retain_freed_memory``: the worker starts with glibc keeping freed memory (``host_memory.RETAIN_ENV``,
    the heap policy of our CPU launchers), whatever its framework: PyTorch and XLA allocate through the
    same glibc calls, so every framework gets the same policy."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    env = dict(os.environ)
    if retain_freed_memory:
        from envace_jax.host_memory import RETAIN_ENV  # plain Python: does not load jax

        env.update(RETAIN_ENV)
    if framework.startswith("ours"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    else:
        env.pop("PYTHONPATH", None)  # a peer's venv must not see our package
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [python, os.path.join(WORKERS, WORKER_SCRIPT[framework]), path],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"framework": framework, "error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(path)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if r.returncode != 0 or not lines:
        tail = (r.stderr or r.stdout)[-3000:]
        return {"framework": framework, "error": f"exit {r.returncode}: {tail}"}
    out = json.loads(lines[-1][len(RESULT_PREFIX) :])
    out["process_s"] = time.perf_counter() - t0
    return out


def round_order(frameworks: list[str], r: int) -> list[str]:
    """Round ``r``'s order: as given on even rounds, reversed on odd ones (so no framework always runs first)."""
    return list(frameworks) if r % 2 == 0 else list(reversed(frameworks))


def pool(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Timed iterations of each arm pooled over rounds: arm (``"ours"``, ``"trl@1"``; the framework's name when
    a record has no arm) -> {iter_s, sample_s, cpu_s}."""
    out: dict[str, dict[str, list[float]]] = {}
    for res in results:
        if "error" in res:
            continue
        d = out.setdefault(res.get("arm", res["framework"]), {"iter_s": [], "sample_s": [], "cpu_s": []})
        for k in d:
            d[k].extend(res[k])
    return out


def summarize(pooled: dict[str, dict[str, list[float]]], rows: int, new_tokens: int) -> list[dict[str, Any]]:
    """One table row per framework from its pooled iterations: medians, tokens/s, and ours vs it.

    ``tok_s``: generated tokens (``rows * new_tokens``) per median iteration second; ``sample_tok_s``: the
    same per median sampling second. ``update_s`` is the median of (iteration - sampling) per iteration.
    ``vs_ours`` / ``vs_ours_sampling``: this framework's median seconds / ours (above 1: ours is faster);
    None when ours did not run. ``vs_defaults``: the same against ``ours-defaults`` (the iteration written
    with the public classes' defaults), None when it did not run. ``cores``: median CPU seconds per wall
    second of an iteration."""
    table = []
    for fw, d in pooled.items():
        if not d["iter_s"]:
            continue
        it = statistics.median(d["iter_s"])
        sm = statistics.median(d["sample_s"])
        up = statistics.median([a - b for a, b in zip(d["iter_s"], d["sample_s"])])
        table.append(
            {
                "framework": fw,
                "n": len(d["iter_s"]),
                "iter_s": it,
                "sample_s": sm,
                "update_s": up,
                "tok_s": rows * new_tokens / it,
                "sample_tok_s": rows * new_tokens / sm if sm > 0 else float("nan"),
                "cores": statistics.median([c / w for c, w in zip(d["cpu_s"], d["iter_s"])]),
            }
        )
    ours = next((r for r in table if r["framework"].partition("@")[0] == "ours"), None)
    defaults = next((r for r in table if r["framework"].partition("@")[0] == "ours-defaults"), None)
    for r in table:
        r["vs_ours"] = None if ours is None else r["iter_s"] / ours["iter_s"]
        r["vs_ours_sampling"] = None if ours is None else r["sample_s"] / ours["sample_s"]
        r["vs_defaults"] = None if defaults is None else r["iter_s"] / defaults["iter_s"]
    return table


def markdown(shape: str, table: list[dict[str, Any]], rows: int, prompt_len: int, new_tokens: int) -> str:
    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    # the column against ours-defaults only when that arm ran
    with_defaults = any(r.get("vs_defaults") is not None for r in table)
    extra = " peer s / ours-defaults (iteration) |" if with_defaults else ""
    head = (
        f"{shape}: {rows} rows, {prompt_len} prompt + {new_tokens} new tokens\n\n"
        "| framework | s / iteration | sampling s | update s | tokens/s (iteration) | tokens/s (sampling) "
        f"| peer s / ours (iteration) | peer s / ours (sampling) |{extra} cores used | iterations |\n"
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_defaults else "") + "\n"
    )
    body = "".join(
        f"| {r['framework']} | {r['iter_s']:.3f} | {r['sample_s']:.3f} | {r['update_s']:.3f} | {r['tok_s']:.0f} "
        f"| {r['sample_tok_s']:.0f} | {x(r['vs_ours'])} | {x(r['vs_ours_sampling'])} |"
        + (f" {x(r['vs_defaults'])} |" if with_defaults else "")
        + f" {r['cores']:.2f} | {r['n']} |\n"
        for r in table
    )
    return head + body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="demo,small", help=f"comma-separated, from {tuple(SHAPES)}")
    ap.add_argument(
        "--frameworks",
        default=",".join(DEFAULT_ARMS),
        help="comma-separated arms: a framework, or framework@threads for its own thread count (e.g. trl@1)",
    )
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt_len", type=int, default=32)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=2, help="iterations per worker before timing (compilation)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per worker and round")
    ap.add_argument("--rounds", type=int, default=2, help="worker runs per framework, alternating the order")
    ap.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP and torch intra-op threads")
    ap.add_argument("--micro_batch_rows", type=int, default=0, help="ours: rows per micro-batch (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="every worker runs with glibc keeping freed memory (envace_jax/host_memory.py), as `make demo` runs",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker run")
    ap.add_argument("--tunix_python", default=DEFAULT_PYTHON["tunix"])
    ap.add_argument("--trl_python", default=DEFAULT_PYTHON["trl"])
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "peers", "results.json"))
    ap.add_argument("--write_checkpoint", nargs=2, metavar=("SHAPE", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_checkpoint:
        write_checkpoint(args.write_checkpoint[0], args.write_checkpoint[1], args.seed)
        return 0
    shapes = [s for s in args.shapes.split(",") if s]
    arms = [f for f in args.frameworks.split(",") if f]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: {s!r} is not one of {tuple(SHAPES)}")
    try:
        parsed = {arm: parse_arm(arm) for arm in arms}
    except ValueError as e:
        ap.error(f"--frameworks: {e}")
    python = {**{fw: sys.executable for fw in OURS}, "tunix": args.tunix_python, "trl": args.trl_python}
    for f in {fw for fw, _ in parsed.values()}:
        if not os.access(python[f], os.X_OK):
            ap.error(f"{f}: no Python at {python[f]}; `make bench-peers` creates the peers' venvs")
    rows = args.prompts * args.group
    report: dict[str, Any] = {"args": vars(args), "shapes": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tables = []
    for shape in shapes:
        with tempfile.TemporaryDirectory(prefix=f"peers_{shape}_") as tmp:
            model_dir = os.path.join(tmp, "hf")
            # In a child process, so the driver never holds the model's memory while the workers run.
            here = os.path.abspath(__file__)
            subprocess.run(
                [sys.executable, here, "--write_checkpoint", shape, model_dir, "--seed", str(args.seed)],
                check=True,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)),
            )
            results = []
            for r in range(args.rounds):
                for arm in round_order(arms, r):
                    fw, threads = parsed[arm]
                    spec = make_spec(fw, shape, model_dir, args, threads)
                    res = dict(run_worker(fw, python[fw], spec, args.timeout, args.retain_freed_memory), arm=arm)
                    results.append(res)
                    if "error" in res:
                        print(f"[{shape}] round {r} {arm}: FAILED {res['error']}", flush=True)
                    else:
                        rounded = {k: [round(x, 3) for x in res[k]] for k in ("iter_s", "sample_s", "warmup_s")}
                        sync = ""
                        if "sync_s" in res:  # ours-vllm: the weight sync inside each iteration, the engine's start
                            sync = (
                                f", weight sync {[round(x, 3) for x in res['sync_s']]} s (engine start "
                                f"{res['engine_start_s']:.0f} s)"
                            )
                        print(
                            f"[{shape}] round {r} {arm}: iterations {rounded['iter_s']} s, sampling "
                            f"{rounded['sample_s']} s (warm-up {rounded['warmup_s']} s){sync}, peak RSS "
                            f"{res['peak_rss_gib']:.2f} GiB, mean reward {res['mean_reward'][-1]:.3f}",
                            flush=True,
                        )
        table = summarize(pool(results), rows, args.new_tokens)
        md = markdown(shape, table, rows, args.prompt_len, args.new_tokens)
        tables.append(md)
        print("\n" + md, flush=True)
        report["shapes"][shape] = {"results": results, "table": table, "markdown": md}
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print("\n".join(tables))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
