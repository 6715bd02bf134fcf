"""The loopback judge endpoint over real HTTP: the chat-completions protocol HttpJudge speaks, verdicts that
are a function of the prompt (so runs repeat), requests that overlap, clear errors on bad requests."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request

import pytest

from envace_jax.rl.loopback_judge import LoopbackJudge, verdict_for


def _ask(url: str, prompt: str, path: str = "/v1/chat/completions") -> dict:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode()
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_verdicts_follow_the_prompts_hash_and_requests_overlap():
    prompts = [f"checklist item {i}" for i in range(8)]
    want = [hashlib.sha256(p.encode()).digest()[0] % 2 == 0 for p in prompts]
    assert 0 < sum(want) < len(want)  # both answers occur
    got: dict[int, bool] = {}
    with LoopbackJudge(latency_s=0.2, jitter_s=0.2, seed=1) as judge:

        def one(i: int) -> None:
            out = _ask(judge.url, prompts[i])
            got[i] = json.loads(out["choices"][0]["message"]["content"])["answer"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert judge.requests == len(prompts)
        assert judge.max_in_flight > 1  # each request sleeps on a thread of its own
    assert [got[i] for i in range(len(prompts))] == want == [verdict_for(p) for p in prompts]


@pytest.mark.parametrize("mode", ["pass", "fail"])
def test_fixed_verdicts(mode):
    with LoopbackJudge(verdict=mode) as judge:
        out = _ask(judge.url, "anything")
    assert json.loads(out["choices"][0]["message"]["content"])["answer"] is (mode == "pass")


def test_bad_requests_and_arguments_are_named():
    with LoopbackJudge() as judge:
        with pytest.raises(urllib.error.HTTPError) as e:
            _ask(judge.url, "x", path="/v1/completions")
        assert e.value.code == 404
        req = urllib.request.Request(judge.url + "/v1/chat/completions", data=b"{not json", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400 and b"not a chat completion request" in e.value.read()
    with pytest.raises(ValueError, match="jitter_s"):
        LoopbackJudge(jitter_s=-1)
    with pytest.raises(ValueError, match="verdict mode"):
        LoopbackJudge(verdict="maybe")
