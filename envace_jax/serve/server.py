"""An OpenAI-compatible HTTP server over our sampler and a Hugging Face checkpoint (``launch/serve.py``).

Endpoints: ``POST /v1/chat/completions`` (``serve.protocol`` for the fields and shapes), ``POST /v1/completions``
(a prompt continued as it is, text or token ids: ``serve.completions``), ``GET /v1/models``, ``GET /health``. Each
connection is served on a thread of its own; the requests meet in ``ServeEngine``, which batches them into the
sampler. A bad request gets a 4xx and an error body naming what is wrong; a failure while sampling gets a 500 for
the requests of that call, and the server stays up either way.

    with ChatServer(engine, model_name="qwen3", port=0) as server:   # port 0: a free port
        ... server.url ...
"""

from __future__ import annotations

import hmac
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envace_jax.serve.completions import parse_completion_request, text_completion_body
from envace_jax.serve.engine import ServeEngine
from envace_jax.serve.protocol import (
    RequestError,
    assistant_message,
    completion_body,
    finish_reason,
    parse_request,
    stream_chunks,
)

MAX_BODY_BYTES = 32 * 1024 * 1024


class ChatServer:
    """The HTTP front of a ``ServeEngine`` (see the module docstring). ``api_key``: when set, requests must send
    ``Authorization: Bearer <api_key>`` (401 otherwise, as vLLM answers). ``timeout_s``: the longest a request
    waits for its completion before a 503."""

    def __init__(
        self,
        engine: ServeEngine,
        *,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        timeout_s: float = 3600.0,
    ):
        self.engine, self.model_name, self.api_key, self.timeout_s = engine, model_name, api_key, timeout_s
        self.counts = {"ok": 0, "client_errors": 0, "server_errors": 0}
        self._lock = threading.Lock()
        self._httpd = _Listener((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "ChatServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="serve-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self.engine.close()

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def count(self, status: int) -> None:
        with self._lock:
            key = "ok" if status < 400 else "client_errors" if status < 500 else "server_errors"
            self.counts[key] += 1

    # ------------------------------------------------------------------ the completion
    def _wait(self, future):
        try:
            prompt_tokens, choices = future.result(timeout=self.timeout_s)
        except TimeoutError:
            raise RequestError(
                503,
                f"no completion within {self.timeout_s:.0f} s; the server is overloaded",
                kind="ServiceUnavailableError",
            ) from None
        except Exception as e:
            raise RequestError(500, f"sampling failed: {type(e).__name__}: {e}", kind="InternalServerError") from e
        return prompt_tokens, choices

    def complete_text(self, body: Any) -> dict[str, Any]:
        """``POST /v1/completions``: the body of a prompt's completion, or a RequestError."""
        request = parse_completion_request(body, self.model_name, self.engine.vocab_size)
        prompt = self.engine.prompt_of(request)
        _, choices = self._wait(self.engine.submit(request, prompt))
        out = []
        for c in choices:
            reason = "length" if c.reason in ("length", "cache_full") else "stop"
            out.append({"text": c.text, "finish_reason": reason, "token_ids": c.ids})
        return text_completion_body(self.model_name, request, prompt, out, uuid.uuid4().hex)

    def complete(self, body: Any) -> tuple[dict[str, Any], bool, bool]:
        """(the completion body, whether it streams, whether usage is streamed) or a RequestError."""
        request = parse_request(body, self.model_name)
        prompt_tokens, choices = self._wait(self.engine.submit(request))
        out = []
        for i, c in enumerate(choices):
            message, has_calls = assistant_message(c.text, request)
            out.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(c.reason, has_calls, request),
                }
            )
        completion = sum(c.tokens for c in choices)
        body = completion_body(self.model_name, out, prompt_tokens, completion, uuid.uuid4().hex)
        return body, request.stream, request.include_usage


class _Listener(ThreadingHTTPServer):
    # the socket's accept backlog: the standard library's 5 resets the connections of a burst of clients
    request_queue_size = 1024


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the counts say how requests went
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            server.count(status)

        def _error(self, e: RequestError) -> None:
            self._send(e.status, e.body())

        def _authorised(self) -> bool:
            if not server.api_key:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {server.api_key}".encode()):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            if self.path.rstrip("/") == "/health":
                return self._send(200, {"status": "ok"})
            if not self._authorised():
                return
            if self.path.rstrip("/") == "/v1/models":
                model = {
                    "id": server.model_name,
                    "object": "model",
                    "owned_by": "envace-jax",
                    "max_model_len": server.engine.max_model_len,
                }
                return self._send(200, {"object": "list", "data": [model]})
            self._error(RequestError(404, f"no such endpoint: GET {self.path}"))

        def do_POST(self):
            try:
                length = int(self.headers.get("Content-Length") or -1)
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                return self._error(RequestError(411, "a request body needs a Content-Length"))
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._error(RequestError(413, f"the body is {length} bytes; at most {MAX_BODY_BYTES}"))
            raw = self.rfile.read(length)
            if not self._authorised():
                return
            path = self.path.rstrip("/")
            if path not in ("/v1/chat/completions", "/v1/completions"):
                return self._error(RequestError(404, f"no such endpoint: POST {self.path}"))
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                return self._error(RequestError(400, f"the body is not JSON: {e}"))
            if path == "/v1/completions":
                try:
                    return self._send(200, server.complete_text(body))
                except RequestError as e:
                    return self._error(e)
            try:
                completion, stream, usage = server.complete(body)
            except RequestError as e:
                return self._error(e)
            if not stream:
                return self._send(200, completion)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for chunk in stream_chunks(completion, usage):
                self.wfile.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            server.count(200)

    return Handler
