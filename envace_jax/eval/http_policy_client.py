"""A served model as the policy of test-time rehearsal (``policy=http`` with ``rehearsal.n`` or a sweep).

Rehearsal runs token-level rollouts (``TestTimeRehearsal`` on the rollout engine): ACT and REHEARSE prompts are
rendered by our codec, which needs the served model's tokenizer here (``http.tokenizer_path``, a local folder).
``HttpPolicyClient`` is the engine's ``PolicyClient`` over the server's ``POST /v1/completions``: each request
sends its prompt as token ids with the role's sampling settings, the codec's stop ids (``stop_token_ids``) and
``return_token_ids``, and gets the sampled ids back: what vLLM's server and ``launch/serve.py`` both answer. A
server that sends text only has its text encoded with the local tokenizer (a stop then closes it). The committed
run still talks chat (``HttpAgent``), as without rehearsal.

The server keeps no cache between requests: each turn of an imagined episode sends its whole prompt (vLLM's
prefix cache, where enabled, saves the recomputation). Log-probabilities are not asked for (nothing trains here).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from envace_jax.eval.config import EvalConfig, HttpPolicySpec
from envace_jax.eval.http_agent import error_message, past_context, post_json, request_headers, sampling_body
from envace_jax.rl.policy_client import GenOutput, GenRequest


class HttpPolicyClient:
    """``PolicyClient`` over ``POST /v1/completions`` (see the module docstring)."""

    def __init__(self, spec: HttpPolicySpec, codec, *, stop_token_ids: Sequence[int] | None = None):
        self.spec, self.codec = spec, codec
        self.url = spec.base_url.rstrip("/") + "/v1/completions"
        self.headers = request_headers(spec)
        self.stop_token_ids = [int(t) for t in (stop_token_ids if stop_token_ids is not None else codec.stop_token_ids)]
        self.requests = 0

    def body(self, r: GenRequest) -> dict[str, Any]:
        return {
            "model": self.spec.model,
            "prompt": [int(t) for t in r.prompt_ids],
            **sampling_body(r.sampling, r.seed),
            "stop_token_ids": self.stop_token_ids,
            "return_token_ids": True,
        }

    def _one(self, r: GenRequest) -> GenOutput:
        status, reply = post_json(self.url, self.body(r), self.headers, self.spec)
        if status != 200:
            msg = error_message(reply)
            if past_context(status, msg):  # as the in-process client: the context did not fit
                return GenOutput([], [], "cache_full")
            raise ValueError(f"policy=http: {self.url} refused a {r.role} prompt of {len(r.prompt_ids)} tokens: {msg}")
        choice = reply["choices"][0]
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        ids = choice.get("token_ids")
        if ids is None:  # a server without return_token_ids: the text, encoded here
            ids = self.codec.renderer.encode(choice.get("text") or "")
            if reason == "stop":
                ids.append(self.stop_token_ids[0])
        ids = [int(t) for t in ids]
        return GenOutput(ids, [0.0] * len(ids), reason)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        self.requests += len(requests)
        with ThreadPoolExecutor(min(len(requests), self.spec.max_concurrency), "http-policy") as pool:
            return list(pool.map(self._one, requests))

    def release(self, cache_keys: Sequence[str]) -> None:
        del cache_keys  # the server keeps nothing between requests


def build_http_policy(cfg: EvalConfig):
    """(agent, codec, client) of a served policy: ``HttpAgent`` for the real run, and for the rehearsals our codec
    over ``http.tokenizer_path`` with ``HttpPolicyClient``."""
    from envace_jax.chat import Qwen3ChatCodec, load_tokenizer
    from envace_jax.eval.http_agent import HttpAgent

    tok = load_tokenizer(cfg.http.tokenizer_path)
    codec = Qwen3ChatCodec(tok, enable_thinking=cfg.enable_thinking, simulator_thinking=cfg.enable_thinking)
    agent = HttpAgent(cfg.http, cfg.sampling, enable_thinking=cfg.enable_thinking, seed=cfg.seed)
    return agent, codec, HttpPolicyClient(cfg.http, codec)
