"""launch/serve.py's server on the loopback interface, over a tiny random Qwen3 checkpoint written by our exporter
(read back by transformers as the independent truth) and the demo tokenizer: completions equal transformers'
greedy ``generate`` on the rendered prompt, seeded sampling repeats wherever a request is batched, concurrent
clients are batched and all answered, bad requests get a 4xx and the server stays up, streams carry the same
completion, and the HTTP judge of a training run talks to it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from envace_jax.config import HttpJudgeConfig
from envace_jax.models import hf_io, qwen3
from envace_jax.rl.judges import HttpJudge
from envace_jax.serve import build_server
from tests import helpers_loop as h
from tests.rl.test_judges_local import request as judge_request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "find a word",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("serve_ckpt"))
    hf_io.save_hf(qwen3.init_model(qwen3.Qwen3Config.tiny(512, num_layers=2), seed=4), d)
    for f in os.listdir(h.tokenizer_dir()):
        shutil.copy(os.path.join(h.tokenizer_dir(), f), d)
    return d


@pytest.fixture(scope="module")
def server(ckpt):
    srv = build_server(
        ckpt,
        model_name="tiny",
        dtype="float32",
        max_model_len=1536,
        max_rows=16,
        port=0,
        sampler_kwargs={"max_chunk": 128},
    )
    # a wide window for a call to gather requests, so that concurrent test clients share calls on a loaded machine
    srv.engine.batch_wait_s = 0.25
    with srv:
        yield srv


def post(url, body, headers=None, raw=None, path="/v1/chat/completions"):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def chat(url, **body):
    status, raw = post(url, {"model": "tiny", **body})
    assert status == 200, raw[:300]
    return json.loads(raw)


def test_greedy_completions_equal_transformers_generate(server, ckpt):
    from transformers import AutoModelForCausalLM

    renderer = server.engine.renderer
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    for messages, tools in (
        ([{"role": "user", "content": "find the word apple"}], TOOLS),
        ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}], None),
    ):
        body = chat(server.url, messages=messages, tools=tools, temperature=0, max_tokens=12)
        ids = renderer.render_messages(messages, tools, add_generation_prompt=True)
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=12,
                pad_token_id=0,
                eos_token_id=list(renderer.stop_token_ids),
            )[0, len(ids) :].tolist()
        choice = body["choices"][0]
        assert choice["message"]["content"] == renderer.decode(ref)  # a random model writes no tool call
        assert choice["finish_reason"] == ("stop" if ref[-1] in renderer.stop_token_ids else "length")
        assert body["usage"] == {
            "prompt_tokens": len(ids),
            "completion_tokens": len(ref),
            "total_tokens": len(ids) + len(ref),
        }
        assert body["object"] == "chat.completion" and body["model"] == "tiny" and body["id"].startswith("chatcmpl-")


def test_seeded_sampling_repeats_alone_or_batched_with_other_requests(server):
    msgs = [{"role": "user", "content": "tell me a story"}]
    want = [c["message"]["content"] for c in chat(server.url, messages=msgs, n=3, seed=11, max_tokens=10)["choices"]]
    assert len(set(want)) > 1  # three different draws
    results, errors = {}, []

    def one(i):
        try:
            seed, n = (11, 3) if i == 3 else (100 + i, 2)
            results[i] = chat(server.url, messages=msgs, n=n, seed=seed, max_tokens=10)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    calls_before = server.engine.stats.calls
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [c["message"]["content"] for c in results[3]["choices"]] == want
    assert server.engine.stats.calls - calls_before < 6  # some requests shared a sampler call


def test_concurrent_clients_are_batched_and_none_is_lost(server):
    before = dict(vars(server.engine.stats))
    out, errors = [None] * 24, []

    def one(i):
        try:
            body = chat(server.url, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=6, temperature=0)
            out[i] = body["choices"][0]["message"]["content"]
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = server.engine.stats
    assert not errors and all(x is not None for x in out)
    assert st.requests - before["requests"] == 24 and st.calls - before["calls"] < 24
    assert st.max_rows_in_a_call > 1
    # batching does not change a greedy answer
    alone = chat(server.url, messages=[{"role": "user", "content": "request 5"}], max_tokens=6, temperature=0)
    assert alone["choices"][0]["message"]["content"] == out[5]


def test_bad_requests_get_a_4xx_and_the_server_stays_up(server):
    good = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    cases = [
        (post(server.url, None, raw=b"{not json"), 400),
        (post(server.url, {**good, "temperature": -2}), 400),
        (post(server.url, {**good, "model": "gpt-9"}), 404),
        (post(server.url, {**good, "max_tokens": 10_000}), 400),
        (post(server.url, {**good, "messages": [{"role": "user", "content": "x " * 3000}]}), 400),
        (post(server.url, {**good, "logprobs": True}), 400),
    ]
    for (status, raw), want in cases:
        assert status == want, raw[:200]
        err = json.loads(raw)["error"]
        assert err["code"] == want and err["message"]
    req = urllib.request.Request(server.url + "/v1/nothing", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 404
    e.value.close()
    assert chat(server.url, **{k: v for k, v in good.items() if k != "model"})["choices"][0]["message"]["role"]
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny"


def test_a_stop_string_a_stream_and_the_http_judge(server):
    base = chat(server.url, messages=[{"role": "user", "content": "count"}], max_tokens=16, temperature=0)
    text = base["choices"][0]["message"]["content"]
    assert len(text) > 4
    stop = text[2:4]
    cut = chat(server.url, messages=[{"role": "user", "content": "count"}], max_tokens=16, temperature=0, stop=[stop])
    assert cut["choices"][0]["message"]["content"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
    status, raw = post(
        server.url,
        {
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == text
    assert chunks[-1]["usage"] == base["usage"]
    # the training run's HTTP judge: requests go through (a random model writes no verdict, so it fails as one)
    judge = HttpJudge(
        HttpJudgeConfig(base_url=server.url, model="tiny", max_tokens=8, max_attempts=2, backoff_base_s=0.01)
    )
    verdicts = judge.judge_many([judge_request("alpha", "a reply", 0)])
    assert judge.stats["http_attempts"] == 2 and verdicts[0].api_failed
    assert "HTTPError" not in verdicts[0].raw and "URLError" not in verdicts[0].raw


def test_the_command_serves_with_an_api_key(ckpt, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", SERVE_TEST_KEY="k3y", PYTHONPATH=ROOT)
    with socket.socket() as s:  # a port free now (the server binds it a moment later)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        os.path.join(ROOT, "launch", "serve.py"),
        "--model",
        ckpt,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--api-key-env",
        "SERVE_TEST_KEY",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        status, raw = post(url, body)
        assert status == 401 and json.loads(raw) == {"error": "Unauthorized"}
        status, raw = post(url, body, headers={"Authorization": "Bearer k3y"})
        assert status == 200 and json.loads(raw)["model"] == os.path.basename(ckpt)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
