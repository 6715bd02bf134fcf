"""A checklist judge endpoint on the loopback interface, with a latency you choose: for dry runs, benchmarks and
tests of everything that talks to an HTTP judge, without a served model.

It speaks the OpenAI chat-completions protocol ``HttpJudge`` uses (``POST /v1/chat/completions``) and answers
every request with a verdict object in the reference's schema after ``latency_s`` seconds, plus a random share
of ``jitter_s`` (so answers can come back out of order, as from a served model under load; each request waits
on a thread of its own, so requests in flight overlap). The verdict is a function
of the prompt alone, so a run repeats exactly: ``"hash"`` passes an item when the first byte of the prompt's
SHA-256 is even (about half the items), ``"pass"`` / ``"fail"`` always answer that.

    python -m envace_jax.rl.loopback_judge --port 8000 --latency 1.0 --jitter 0.5   # then
        --config.judge.kind=http --config.judge.http.base_url=http://127.0.0.1:8000

Host-side only; no jax.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERDICTS = ("hash", "pass", "fail")


def verdict_for(prompt: str, mode: str = "hash") -> bool:
    """The loopback judge's answer to a prompt (see the module docstring)."""
    if mode not in VERDICTS:
        raise ValueError(f"verdict mode {mode!r} is not one of {VERDICTS}")
    if mode != "hash":
        return mode == "pass"
    return hashlib.sha256(prompt.encode()).digest()[0] % 2 == 0


class LoopbackJudge:
    """``with LoopbackJudge(latency_s=1.0) as judge: ... judge.url ...`` (see the module docstring).

    ``requests`` counts the completions answered and ``max_in_flight`` the most answered at once."""

    def __init__(
        self,
        latency_s: float = 0.0,
        verdict: str = "hash",
        host: str = "127.0.0.1",
        port: int = 0,
        jitter_s: float = 0.0,
        seed: int | None = None,
    ):
        if latency_s < 0:
            raise ValueError(f"LoopbackJudge(latency_s={latency_s}) must be >= 0")
        if jitter_s < 0:
            raise ValueError(f"LoopbackJudge(jitter_s={jitter_s}) must be >= 0")
        verdict_for("", verdict)  # checks the mode
        self.latency_s, self.jitter_s, self.verdict = float(latency_s), float(jitter_s), verdict
        self._rng = random.Random(seed)  # the delays only: verdicts never depend on it
        self.requests = self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: one line per verdict would drown a run's log
                pass

            def do_POST(self):
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": f"no route {self.path}"})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    prompt = body["messages"][-1]["content"]
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    self._send(400, {"error": f"not a chat completion request: {type(e).__name__}"})
                    return
                with judge._lock:
                    judge.in_flight += 1
                    judge.max_in_flight = max(judge.max_in_flight, judge.in_flight)
                    delay = judge.latency_s + judge.jitter_s * judge._rng.random()
                try:
                    time.sleep(delay)
                    answer = verdict_for(prompt, judge.verdict)
                finally:
                    with judge._lock:
                        judge.in_flight -= 1
                        judge.requests += 1
                content = json.dumps(
                    {
                        "high_level_understanding_of_the_question": "loopback judge",
                        "analysis_of_if_focus_on": "not read",
                        "analysis_of_pass_condition": "not read",
                        "analysis_of_failure_examples": "not read",
                        "answer": answer,
                    }
                )
                self._send(
                    200,
                    {
                        "id": "loopback",
                        "object": "chat.completion",
                        "model": body.get("model", "loopback"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                        ],
                    },
                )

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LoopbackJudge":
        self._thread = threading.Thread(target=self._server.serve_forever, name="loopback-judge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "LoopbackJudge":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each verdict")
    p.add_argument("--jitter", type=float, default=0.0, help="plus up to this many seconds, drawn per request")
    p.add_argument("--verdict", choices=VERDICTS, default="hash")
    a = p.parse_args(argv)
    judge = LoopbackJudge(a.latency, a.verdict, a.host, a.port, jitter_s=a.jitter)
    line = f"loopback judge on {judge.url} (latency {a.latency} s + up to {a.jitter} s, verdicts: {a.verdict})"
    print(line, flush=True)
    try:
        judge._server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
