"""launch/serve.py's server under load on the loopback interface: throughput against the number of concurrent
clients, with malformed requests mixed in, and a count that no request was lost.

    python benchmarks/serve_load.py                                  # a tiny random Qwen3, 1 / 4 / 16 clients
    python benchmarks/serve_load.py --model /ckpt/Qwen3-0.6B --clients 1,8,32 --requests 64 --max-tokens 64

Per concurrency level, ``--requests`` chat requests (each ``--max-tokens`` new tokens at temperature 1 with
``min`` of them forced by a stop-free prompt; the model decides where it stops) are sent by that many client
threads, plus one malformed request per client (bad JSON, a bad field, an unknown model, in turn). The table
gives requests per second, completion tokens per second, the median and 95th-percentile latency, the largest
number of rows the engine sampled together, and the answers by status. Every good request must come back 200
and every bad one 4xx; the script exits non-zero otherwise. Without ``--model`` it writes a tiny random Qwen3
(2 layers, hidden 64) and the demo tokenizer to a temp dir: a check of the server's own overhead and batching,
not of a model's speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BAD = (b"{not json", b'{"messages": [], "max_tokens": 4}', b'{"model": "nope", "messages": [{"role": "user"}]}')


def _post(url: str, data: bytes) -> tuple[int, bytes]:
    """(HTTP status, body); -1 when no answer came back at all (a refused or reset connection)."""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()
    except OSError as e:
        return -1, repr(e).encode()


def level(url: str, clients: int, requests: int, max_tokens: int, engine) -> dict:
    good_statuses, bad_statuses, latencies, tokens = [], [], [], []
    lock = threading.Lock()
    todo = list(range(requests))

    def client(c: int) -> None:
        status, _ = _post(url, BAD[c % len(BAD)])
        with lock:
            bad_statuses.append(status)
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {
                "messages": [{"role": "user", "content": f"request {i}: say something"}],
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "seed": i,
            }
            t0 = time.perf_counter()
            status, raw = _post(url, json.dumps(body).encode())
            dt = time.perf_counter() - t0
            with lock:
                good_statuses.append(status)
                latencies.append(dt)
                if status == 200:
                    tokens.append(json.loads(raw)["usage"]["completion_tokens"])

    rows_before = engine.stats.max_rows_in_a_call
    engine.stats.max_rows_in_a_call = 0
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    peak_rows = engine.stats.max_rows_in_a_call
    engine.stats.max_rows_in_a_call = max(rows_before, peak_rows)
    lat = sorted(latencies)
    return {
        "clients": clients,
        "wall_s": wall,
        "requests_per_s": len(good_statuses) / wall,
        "tokens_per_s": sum(tokens) / wall,
        "p50_s": statistics.median(lat),
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_rows": peak_rows,
        "good_200": sum(s == 200 for s in good_statuses),
        "good_sent": requests,
        "bad_4xx": sum(400 <= s < 500 for s in bad_statuses),
        "bad_sent": clients,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny random Qwen3)")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32, help="good requests per level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    from envace_jax.eval.config import TinySpec
    from envace_jax.eval.harness import save_tiny_checkpoint
    from envace_jax.serve import build_server

    with tempfile.TemporaryDirectory() as tmp:
        path = a.model or save_tiny_checkpoint(TinySpec(), tmp)  # the demo tokenizer and model_sizes.TINY
        server = build_server(
            path, model_name="bench", dtype=a.dtype, max_model_len=a.max_model_len, max_rows=a.max_rows, port=0
        )
        with server:
            url = server.url + "/v1/chat/completions"
            warm = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": a.max_tokens}
            for n in sorted({min(2**i, a.max_rows) for i in range(a.max_rows.bit_length() + 1)}):  # compiles, untimed
                threads = [threading.Thread(target=_post, args=(url, json.dumps(warm).encode())) for _ in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            rows = []
            for c in [int(x) for x in a.clients.split(",") if x]:
                rows.append(level(url, c, a.requests, a.max_tokens, server.engine))
                print(f"{c} clients: {rows[-1]}", flush=True)
            counts = dict(server.counts)
    what = "a tiny random Qwen3 (the server's overhead, not a model's speed)" if not a.model else a.model
    print(f"\n{what}, {a.requests} requests per level, up to {a.max_tokens} new tokens, max_rows {a.max_rows}")
    print(
        "| clients | requests/s | tokens/s | p50 s | p95 s | most rows in a call | good: 200 / sent | bad: 4xx / sent |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['clients']} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | {r['p50_s']:.2f} | "
            f"{r['p95_s']:.2f} | {r['max_rows']} | {r['good_200']} / {r['good_sent']} | "
            f"{r['bad_4xx']} / {r['bad_sent']} |"
        )
    print(f"server counts: {counts}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "rows": rows, "counts": counts}, f, indent=2)
    lost = any(r["good_200"] != r["good_sent"] or r["bad_4xx"] != r["bad_sent"] for r in rows)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
