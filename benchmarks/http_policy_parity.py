"""BFCL through a served model against the same checkpoint in process: ``policy=http`` against
``launch/serve.py``'s server, and ``policy=model``, greedy, entry by entry.

    python benchmarks/http_policy_parity.py                          # all 200 multi_turn_base entries, a tiny model
    python benchmarks/http_policy_parity.py --model DIR --limit 20 --max-new-tokens 256 --max-model-len 16384

Without ``--model`` it writes a tiny random Qwen3 with a line-level tokenizer trained on BFCL's schemas
(``eval.config.BFCL_TINY``, the sizes of configs/eval_bfcl_tiny.py) to a temp dir: it writes no tool calls, so the
run checks the path (the same turns, steps, calls and tokens per entry), not scores. Prints per-entry agreement,
both accuracies, wall seconds of each run, and the server's request counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _entries(out_dir: str, category: str) -> list[dict]:
    with open(os.path.join(out_dir, f"{category}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny random Qwen3)")
    ap.add_argument("--category", default="multi_turn_base")
    ap.add_argument("--limit", type=int, default=0, help="entries (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-steps-per-turn", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args(argv)
    from envace_jax.eval import run_eval
    from envace_jax.eval.config import BFCL_TINY
    from envace_jax.eval.harness import save_tiny_checkpoint
    from envace_jax.serve import build_server

    with tempfile.TemporaryDirectory() as tmp:
        path = a.model or save_tiny_checkpoint(BFCL_TINY, tmp, seed=3)
        base = {
            "suite": "bfcl",
            "bfcl": {
                "categories": a.category,
                "limit": a.limit,
                "max_steps_per_turn": a.max_steps_per_turn,
                "batch_size": a.batch_size,
            },
            "sampling": {"temperature": 0.0, "max_new_tokens": a.max_new_tokens},
            "max_model_len": a.max_model_len,
            "enable_thinking": False,
        }
        t0 = time.perf_counter()
        local = run_eval(
            {
                **base,
                "output_dir": os.path.join(tmp, "local"),
                "policy": "model",
                "model": {"model_path": path, "dtype": a.dtype},
            }
        )
        t_local = time.perf_counter() - t0
        server = build_server(
            path,
            model_name="policy",
            dtype=a.dtype,
            max_model_len=a.max_model_len,
            port=0,
            max_rows=a.batch_size,
            enable_thinking=False,
        )
        with server:
            t0 = time.perf_counter()
            served = run_eval(
                {
                    **base,
                    "output_dir": os.path.join(tmp, "http"),
                    "policy": "http",
                    "http": {"base_url": server.url, "model": "policy"},
                }
            )
            t_http = time.perf_counter() - t0
            counts = dict(server.counts)
        x, y = _entries(os.path.join(tmp, "local"), a.category), _entries(os.path.join(tmp, "http"), a.category)
    same_outcome = sum(p["valid"] == q["valid"] and p["error_type"] == q["error_type"] for p, q in zip(x, y))
    same_detail = sum(p["detail"] == q["detail"] for p, q in zip(x, y))
    ra, rb = local["categories"][a.category], served["categories"][a.category]
    what = a.model or "a tiny random Qwen3 (checks the path, not scores)"
    print(f"\nBFCL {a.category}, {len(x)} entries, greedy, {what}")
    print("| | in process (policy=model) | served (policy=http) |")
    print("|---|---|---|")
    print(f"| valid | {ra['valid']} / {ra['count']} | {rb['valid']} / {rb['count']} |")
    print(f"| wall s | {t_local:.1f} | {t_http:.1f} |")
    print(f"entries with the same outcome and error type: {same_outcome} / {len(x)}")
    print(f"entries with the same turns, steps, calls and generated tokens: {same_detail} / {len(x)}")
    print(f"server counts: {counts}")
    return 0 if same_outcome == len(x) == len(y) else 1


if __name__ == "__main__":
    sys.exit(main())
