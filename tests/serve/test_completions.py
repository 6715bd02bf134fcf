"""``POST /v1/completions`` of launch/serve.py's server: a prompt continued as it is (token ids or text), greedy ids
equal to transformers' ``generate`` on the same ids, vLLM's ``stop_token_ids`` and ``return_token_ids``; bad
requests get a 400 naming the field; and ``HttpPolicyClient`` (test-time rehearsal's client of a served policy)
samples what our in-process client samples."""

from __future__ import annotations

import json

import pytest
import torch

from envace_jax.eval.config import HttpPolicySpec
from envace_jax.eval.http_policy_client import HttpPolicyClient
from envace_jax.rl.policy_client import GenRequest, SamplerClient
from envace_jax.rl.rollout import RoleSampling
from envace_jax.rl.types import ACT, REHEARSE
from envace_jax.serve.completions import parse_completion_request
from envace_jax.serve.protocol import RequestError
from tests.serve.test_server import ckpt, post, server  # noqa: F401 (module fixtures: a tiny checkpoint and its server)


def complete(url, body):
    status, raw = post(url, body, path="/v1/completions")
    return status, json.loads(raw)


def _reference(hf, ids, n, stops):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, pad_token_id=0, eos_token_id=stops)
    return out[0, len(ids) :].tolist()


def test_greedy_token_ids_equal_transformers_generate(server, ckpt):  # noqa: F811
    from transformers import AutoModelForCausalLM

    renderer = server.engine.renderer
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = renderer.render_messages([{"role": "user", "content": "hello there"}], None, add_generation_prompt=True)
    status, body = complete(
        server.url, {"model": "tiny", "prompt": ids, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    )
    assert status == 200, body
    ref = _reference(hf, ids, 10, list(renderer.stop_token_ids))
    choice = body["choices"][0]
    assert choice["token_ids"] == ref and choice["prompt_token_ids"] == ids
    assert choice["text"] == renderer.decode(ref) and choice["logprobs"] is None
    assert choice["finish_reason"] == ("stop" if ref[-1] in renderer.stop_token_ids else "length")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    usage = {"prompt_tokens": len(ids), "completion_tokens": len(ref), "total_tokens": len(ids) + len(ref)}
    assert body["usage"] == usage

    # a text prompt is encoded with no template; without return_token_ids no ids come back
    text = "the quick brown fox"
    status, body = complete(server.url, {"prompt": text, "max_tokens": 6, "temperature": 0})
    assert status == 200 and "token_ids" not in body["choices"][0]
    want = _reference(hf, renderer.encode(text), 6, list(renderer.stop_token_ids))
    assert body["choices"][0]["text"] == renderer.decode(want)

    # a stop token of the request's own ends the row there, the token included (as vLLM returns it)
    free = _reference(hf, ids, 10, [])
    stop = free[3]
    status, body = complete(
        server.url,
        {"prompt": ids, "max_tokens": 10, "temperature": 0, "stop_token_ids": [stop], "return_token_ids": True},
    )
    got = body["choices"][0]["token_ids"]
    assert got == free[: free.index(stop) + 1] or got == ref[: len(got)]  # a template stop may come first
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"prompt": [[1, 2], [3]]}, "prompt", "one prompt per request"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ({"prompt": [1, 10**9]}, "prompt", "outside the vocabulary"),
        ({"prompt": []}, "prompt", "a string or a non-empty list of token ids"),
        ({"prompt": "x", "stream": True}, "stream", "not supported on /v1/completions"),
        ({"prompt": "x", "logprobs": 2}, "logprobs", "only its default"),
        ({"prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids", "list of token ids"),
        ({"prompt": "x", "temperature": -1}, "temperature", "must be in"),
        ({"prompt": "x", "guided_json": {}}, "guided_json", "unsupported field"),
    ],
)
def test_bad_completion_requests_name_the_field(body, param, words):
    with pytest.raises(RequestError) as e:
        parse_completion_request(body, "tiny", vocab_size=512)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_the_server_answers_a_bad_completion_with_400_and_stays_up(server):  # noqa: F811
    status, body = complete(server.url, {"prompt": [1, 10**9], "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "prompt"
    status, body = complete(server.url, {"model": "other", "prompt": "x"})
    assert status == 404
    status, body = complete(server.url, {"prompt": "hello", "max_tokens": 2, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] <= 2


def test_http_policy_client_samples_what_the_in_process_client_samples(server):  # noqa: F811
    """Greedy rows through the server equal our SamplerClient's on the same model, for both roles."""
    renderer = server.engine.renderer
    from envace_jax.sampling import Sampler

    local = SamplerClient(Sampler(server.engine.sampler.model, cache_size=1536, max_chunk=128), renderer.stop_token_ids)

    class Codec:
        stop_token_ids = list(renderer.stop_token_ids)

    remote = HttpPolicyClient(HttpPolicySpec(base_url=server.url, model="tiny"), Codec())
    prompts = [
        renderer.render_messages([{"role": "user", "content": q}], None, add_generation_prompt=True)
        for q in ("what is two plus two", "name a colour", "write a word")
    ]
    greedy = RoleSampling(temperature=0.0, max_new_tokens=9)
    reqs = [GenRequest(p, ACT if i % 2 == 0 else REHEARSE, greedy, seed=i) for i, p in enumerate(prompts)]
    a, b = local.generate(reqs), remote.generate(reqs)
    assert [o.ids for o in a] == [o.ids for o in b] and all(o.ids for o in b)
    assert [o.finish_reason for o in a] == [o.finish_reason for o in b]
    assert remote.requests == 3
