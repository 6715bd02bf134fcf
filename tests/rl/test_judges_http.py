"""HttpJudge against a real OpenAI-style HTTP server on 127.0.0.1, started by the test.

The server picks its behaviour from the item's question word (the first word after
``**Question:**`` in the prompt) and counts attempts per word, so each case can script
"500 twice, then a verdict", timeouts, malformed bodies and missing fields.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envace_jax.rl.judge_prompt import VERDICT_RESPONSE_FORMAT
from envace_jax.rl.judges import HttpJudge, HttpJudgeConfig, JudgeRequest
from envace_jax.rl.reward import judge_turn

# Generous timeouts: other jobs share this box's 2 cores, and a normal answer must never time out.
CLIENT_TIMEOUT_S = 5.0
SLOW_TIMEOUT_S = 1.0  # the client timeout in the timeout case
SLOW_S = 2.5  # how long "slow" answers take in that case


def verdict(answer):
    return {
        "high_level_understanding_of_the_question": "q",
        "analysis_of_if_focus_on": "f",
        "analysis_of_pass_condition": "p",
        "analysis_of_failure_examples": "e",
        "answer": answer,
    }


def completion(content):
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


class JudgeServer:
    def __init__(self):
        self.lock = threading.Lock()
        self.attempts: dict[str, int] = {}
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.inflight = 0
        self.max_inflight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    word = re.search(r"\*\*Question:\*\* (\w+)", body["messages"][0]["content"]).group(1)
                    n = server.attempts[word] = server.attempts.get(word, 0) + 1
                try:
                    status, payload = server.respond(self.path, word, n)
                finally:
                    # Counted as in flight until the answer is ready, not until it is written: once the
                    # client has read it, it may start its next request while this thread is still
                    # returning, which would count one request twice (a race seen on a loaded machine).
                    with server.lock:
                        server.inflight -= 1
                try:
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout); that is the point of the case

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def respond(self, path, word, n):
        if path != "/v1/chat/completions":
            return 404, {"error": f"no route {path}"}
        if word == "pass":
            return 200, completion(json.dumps(verdict(True)))
        if word == "fail":
            return 200, completion(json.dumps(verdict(False)))
        if word == "flaky":  # two server errors, then a pass
            return (500, {"error": "overloaded"}) if n <= 2 else (200, completion(json.dumps(verdict(True))))
        if word == "slow":  # always slower than the client timeout
            time.sleep(SLOW_S)
            return 200, completion(json.dumps(verdict(True)))
        if word == "slowonce":
            if n == 1:
                time.sleep(SLOW_S)
            return 200, completion(json.dumps(verdict(True)))
        if word == "garbage":  # HTTP 200 with a body that is not JSON
            return 200, b"<html>proxy error</html>"
        if word == "prose":  # a completion whose content is not a verdict
            return 200, completion("I think the assistant did well.")
        if word == "noanswer":  # the verdict lacks the answer field
            v = verdict(True)
            del v["answer"]
            return 200, completion(json.dumps(v))
        if word == "nochoices":
            return 200, {"error": {"message": "model not loaded"}}
        if word == "thinkfirst":  # reasoning text before the JSON, then a fail
            return 200, completion("<think>weigh it</think>" + json.dumps(verdict(False)))
        if word.startswith("busy"):  # holds the connection a while
            time.sleep(0.15)
            return 200, completion(json.dumps(verdict(True)))
        return 400, {"error": f"unknown case {word}"}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


def req(word, tag=""):
    item = {
        "question": f"{word} case",
        "focus_on": "assistant.tool_calls",
        "pass_condition": "p",
        "failure_examples": ["f"],
        "evidence": [],
        "weight": 1.0,
    }
    return JudgeRequest(
        item=item,
        previous_messages=[],
        current_messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>t</think>ok"}],
        tag=tag or word,
    )


def make_judge(url, **kw):
    cfg = dict(
        base_url=url,
        timeout_s=CLIENT_TIMEOUT_S,
        backoff_base_s=0.001,
        backoff_max_s=0.01,
        max_attempts=3,
        max_concurrency=8,
    )
    cfg.update(kw)
    return HttpJudge(HttpJudgeConfig(**cfg))


def test_request_body_is_the_reference_call(server):
    judge = make_judge(server.url, model="judge-model", max_tokens=321)
    r = req("pass")
    v = judge.judge(r)
    assert (v.passed, v.ok, v.api_failed, v.attempts) == (True, True, False, 1)
    assert v.raw == verdict(True)
    body = server.bodies[0]
    assert body["model"] == "judge-model" and body["max_tokens"] == 321
    assert body["temperature"] == 0.6 and body["top_p"] == 0.8
    assert body["messages"] == [{"role": "user", "content": r.prompt()}]
    assert body["response_format"] == VERDICT_RESPONSE_FORMAT
    schema = body["response_format"]["json_schema"]
    assert schema["name"] == "evaluation_verdict" and schema["strict"] is True
    assert schema["schema"]["properties"]["answer"] == {"type": "boolean"}
    assert "Authorization" not in server.headers[0]


def test_mixed_cases_in_one_batch(server):
    judge = make_judge(server.url)
    words = ["pass", "fail", "flaky", "garbage", "prose", "noanswer", "nochoices", "thinkfirst"]
    v = dict(zip(words, judge.judge_many([req(w) for w in words])))
    expect = {  # word: (passed, ok, api_failed, attempts)
        "pass": (True, True, False, 1),
        "fail": (False, True, False, 1),
        "flaky": (True, True, False, 3),
        "thinkfirst": (False, True, False, 1),
        "garbage": (False, False, True, 3),
        "prose": (False, False, True, 3),
        "noanswer": (False, False, True, 3),
        "nochoices": (False, False, True, 3),
    }
    assert {w: (x.passed, x.ok, x.api_failed, x.attempts) for w, x in v.items()} == expect, {
        w: x.raw for w, x in v.items()
    }
    # Every attempt reached the server, so retries really happened.
    assert {w: server.attempts[w] for w in ("flaky", "garbage", "prose", "noanswer", "nochoices")} == {
        "flaky": 3,
        "garbage": 3,
        "prose": 3,
        "noanswer": 3,
        "nochoices": 3,
    }
    assert "answer" in v["noanswer"].raw and "not a chat completion" in v["garbage"].raw
    assert judge.stats == {
        "requests": 8,
        "http_attempts": 1 + 1 + 3 + 1 + 3 * 4,
        "failed_attempts": 2 + 3 * 4,
        "api_failed": 4,
    }


def test_timeouts_are_retried_then_counted(server):
    judge = make_judge(server.url, timeout_s=SLOW_TIMEOUT_S, max_attempts=2)
    slow, slowonce = judge.judge_many([req("slow"), req("slowonce")])
    assert (slow.passed, slow.ok, slow.api_failed, slow.attempts) == (False, False, True, 2)
    assert "timed out" in slow.raw
    assert (slowonce.passed, slowonce.ok, slowonce.api_failed, slowonce.attempts) == (True, True, False, 2), (
        slowonce.raw
    )
    assert server.attempts["slow"] == 2 and server.attempts["slowonce"] == 2
    assert judge.stats["failed_attempts"] == 3 and judge.stats["api_failed"] == 1


def test_http_failure_terminates_the_turn(server):
    judge = make_judge(server.url, max_attempts=2)
    item_ok = {**req("pass").item, "weight": 0.4}
    item_bad = {**req("garbage").item, "weight": 0.6}
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>t</think>done"}]
    j = judge_turn(msgs, [[[item_ok, item_bad], [item_ok]]], 0, judge)
    assert j.item_passed == [[True, False]] and j.turn_reward == pytest.approx(0.4)
    assert j.api_failed_count == 1 and j.terminate


def test_unreachable_server_and_bad_route_fail_cleanly(server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    v = make_judge(f"http://127.0.0.1:{dead_port}", max_attempts=2).judge(req("pass"))
    assert (v.passed, v.ok, v.api_failed, v.attempts) == (False, False, True, 2)
    v = make_judge(server.url + "/wrong", max_attempts=2).judge(req("pass"))
    assert v.api_failed and "404" in v.raw


@pytest.mark.parametrize("limit", [1, 3])
def test_concurrency_bound(server, limit):
    judge = make_judge(server.url, max_concurrency=limit)
    v = judge.judge_many([req(f"busy{i}") for i in range(2 * limit + 1)])
    assert all(x.passed for x in v)
    assert server.max_inflight <= limit
    assert server.max_inflight >= min(limit, 2)  # the bound is reached, not just respected by luck


def test_concurrency_bound_shared_across_callers(server):
    judge = make_judge(server.url, max_concurrency=2)
    results = {}

    def run(k):
        results[k] = judge.judge_many([req(f"busy{k}x{i}") for i in range(3)])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(x.passed for k in range(3) for x in results[k])
    assert server.max_inflight <= 2 and judge.stats["requests"] == 9


def test_api_key_from_env(server, monkeypatch):
    monkeypatch.setenv("ENVACE_TEST_JUDGE_KEY", "sekret")
    assert make_judge(server.url, api_key_env="ENVACE_TEST_JUDGE_KEY").judge(req("pass")).passed
    assert server.headers[-1]["Authorization"] == "Bearer sekret"
    monkeypatch.delenv("ENVACE_TEST_JUDGE_KEY")
    with pytest.raises(ValueError, match="ENVACE_TEST_JUDGE_KEY"):
        make_judge(server.url, api_key_env="ENVACE_TEST_JUDGE_KEY").judge(req("pass"))


@pytest.mark.parametrize(
    "field, value", [("base_url", "127.0.0.1:9"), ("max_attempts", 0), ("max_concurrency", 0), ("timeout_s", -1.0)]
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        HttpJudge(HttpJudgeConfig(**{field: value}))


def test_backoff_schedule(server, monkeypatch):
    sleeps = []
    monkeypatch.setattr("envace_jax.rl.judges.time.sleep", sleeps.append)
    judge = make_judge(server.url, max_attempts=5, backoff_base_s=1.0, backoff_max_s=5.0)
    assert judge.judge(req("garbage")).api_failed
    assert sleeps == [1.0, 2.0, 4.0, 5.0]  # min(base * 2^a, max) between the 5 attempts
