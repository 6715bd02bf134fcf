"""Shared pieces of the benchmark harnesses: conversations, agents (oracle or model), model loading.

An *agent* answers a batch of conversations with one raw assistant text each (Qwen3 format: optional
``<think>`` block, then ``<tool_call>`` blocks or a final reply). Suites parse that text with our own
tool-call parser, so an oracle's scripted text goes through exactly the path a model's text does.

``ModelAgent`` renders each conversation incrementally, like the rollout engine: the first prompt is
the chat template's render; after each sampled turn only the closing ids and the new tool/user turn are
appended, so ``SamplerClient`` continues the row's KV cache. When a conversation's tools change (BFCL
miss_func reveals a function) or its new messages are not one tool turn or one user turn, the whole
prompt is rendered again (a fresh prefill).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Protocol, Sequence

from envace_jax.chat.tool_parser import make_assistant_message
from envace_jax.data.demo_tasks import demo_corpus
from envace_jax.eval.config import (  # noqa: F401 (re-exported)
    PRE_SPLITS,
    TOKENIZER_CORPORA,
    ModelSpec,
    SamplerShapes,
    TinySpec,
)
from envace_jax.rl.policy_client import GenRequest
from envace_jax.rl.rollout import RoleSampling
from envace_jax.rl.types import ACT

LENGTH_BUDGET = "length_budget"


@dataclasses.dataclass
class Conversation:
    """One live dialogue of a suite. ``turn``/``step`` locate the next assistant message (oracles use them)."""

    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    turn: int = 0
    step: int = 0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class AgentTurn:
    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "cache_full" | LENGTH_BUDGET (nothing generated)
    prompt_tokens: int = 0
    generated_tokens: int = 0


class Agent(Protocol):
    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]: ...

    def release(self, keys: Sequence[str]) -> None: ...


def tool_call_text(calls: Sequence[tuple[str, Mapping[str, Any]]], reply: str = "") -> str:
    """Assistant text in Qwen3's native form: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks."""
    blocks = [
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': dict(a)}, ensure_ascii=False)}\n</tool_call>"
        for n, a in calls
    ]
    return "\n".join(([reply] if reply else []) + blocks) if blocks else reply


def parse_turn(text: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], dict | None]:
    """Assistant text -> (message dict, [(name, arguments)], parse error or None), through the parser the
    rollout engine uses (``chat.make_assistant_message``), so evaluation reads a turn as training does.
    Call ids are left for ``number_calls``."""
    msg, error = make_assistant_message(text, call_id_prefix="")
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return msg, calls, error


def number_calls(msg: dict[str, Any], prefix: str) -> None:
    for i, c in enumerate(msg.get("tool_calls") or []):
        c["id"] = f"{prefix}_{i}"


# ----------------------------------------------------------------------------- model agent


@dataclasses.dataclass
class _Rendered:
    ids: list[int]  # prompt + generated ids the client holds for this key
    gen_ids: list[int]  # the last sampled turn (its closing ids depend on how it ended)
    n_messages: int  # messages rendered into ids, plus the assistant message we produced
    tools_key: str


class ModelAgent:
    """Our policy as an agent: ``Qwen3ChatCodec`` + ``SamplerClient`` (see the module doc)."""

    def __init__(self, codec, client, sampling: RoleSampling, *, max_model_len: int, seed: int = 0):
        if max_model_len <= sampling.max_new_tokens:
            raise ValueError(f"max_model_len={max_model_len} must exceed max_new_tokens={sampling.max_new_tokens}")
        self.codec, self.client, self.sampling = codec, client, sampling
        self.max_model_len, self.seed = max_model_len, seed
        self._state: dict[str, _Rendered] = {}
        self._calls = 0

    def _prompt(self, c: Conversation) -> list[int]:
        tools_key = json.dumps(c.tools, sort_keys=True, default=str)
        st = self._state.get(c.key)
        if st is not None and st.tools_key == tools_key and len(c.messages) > st.n_messages:
            new = c.messages[st.n_messages :]
            if all(m.get("role") == "tool" for m in new):
                return st.ids + self.codec.close_assistant(st.gen_ids) + self.codec.tool_block(new)
            if len(new) == 1 and new[0].get("role") == "user":
                return st.ids + self.codec.close_assistant(st.gen_ids) + self.codec.user_block(new[0])
        return list(self.codec.caller_prompt(c.messages, c.tools))

    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]:
        outs: list[AgentTurn | None] = [None] * len(conversations)
        reqs, slots, prompts = [], [], []
        self._calls += 1
        for i, c in enumerate(conversations):
            prompt = self._prompt(c)
            if len(prompt) + self.sampling.max_new_tokens > self.max_model_len:
                outs[i] = AgentTurn("", LENGTH_BUDGET, len(prompt), 0)
                self.release([c.key])
                continue
            seed = (self.seed * 1_000_003 + self._calls * 7919 + i) % (2**31 - 1)
            reqs.append(GenRequest(prompt, ACT, self.sampling, seed, cache_key=c.key, episode=i))
            slots.append(i)
            prompts.append(prompt)
        gens = self.client.generate(reqs) if reqs else []
        for i, prompt, g in zip(slots, prompts, gens):
            c = conversations[i]
            ids = list(g.ids)
            self._state[c.key] = _Rendered(
                prompt + ids, ids, len(c.messages) + 1, json.dumps(c.tools, sort_keys=True, default=str)
            )
            outs[i] = AgentTurn(self.codec.decode(ids), g.finish_reason, len(prompt), len(ids))
        return outs  # type: ignore[return-value]

    def release(self, keys: Sequence[str]) -> None:
        for k in keys:
            self._state.pop(k, None)
        self.client.release(list(keys))


# ----------------------------------------------------------------------------- model loading


def bfcl_corpus(repeat: int = 3) -> list[str]:
    """BFCL multi-turn texts as the policy sees them: every tool schema of multi_turn_base (with the
    note BFCL appends to each description) in Qwen3 system prompts, ten per text, ``repeat`` times so
    each line clears the BPE frequency floor; then every user question, rendered as a user turn."""
    from envace_jax.chat import render_chat_text
    from envace_jax.chat.template import user_turn
    from envace_jax.envs import bfcl

    docs: dict[str, dict] = {}
    questions = []
    for e in bfcl.load_entries("multi_turn_base"):
        for d in e["function"]:
            docs.setdefault(d["name"], d)
        questions += [m["content"] for turn in e["question"] for m in turn if m.get("role") == "user"]
    schemas = [bfcl.function_doc_to_schema(d) for _, d in sorted(docs.items())]
    texts = [
        render_chat_text([{"role": "user", "content": "hi"}], schemas[i : i + 10]) for i in range(0, len(schemas), 10)
    ]
    return repeat * texts + [user_turn(q) for q in questions]


def save_tiny_checkpoint(tiny: "TinySpec", out_dir: str, seed: int = 0) -> str:
    """A random Qwen3 of ``tiny``'s sizes and its demo tokenizer, written as a checkpoint folder ``out_dir/hf`` that
    ``load_hf``, transformers and ``launch/serve.py`` read; returns that folder."""
    from envace_jax.models import hf_io

    model, tok = load_policy(ModelSpec(random_tiny=True, tiny=tiny), os.path.join(out_dir, "work"), seed=seed)
    path = os.path.join(out_dir, "hf")
    hf_io.save_hf(model, path)
    tok.save_pretrained(path)
    return path


def load_policy(spec: ModelSpec, work_dir: str, seed: int = 0):
    """(model, tokenizer) for ``spec``; nothing is downloaded (local directories only). ``seed``: the
    random init of ``random_tiny``."""
    from envace_jax.chat import build_demo_tokenizer, load_tokenizer
    from envace_jax.models import hf_io, qwen3

    if spec.random_tiny:
        if spec.model_path:
            raise ValueError("config.model: set either model_path or random_tiny=True, not both")
        tok_dir = spec.tokenizer_path or os.path.join(work_dir, "demo_tokenizer")
        tiny = spec.tiny
        if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
            tok = load_tokenizer(tok_dir)
        else:
            corpus = demo_corpus() + (bfcl_corpus() if tiny.tokenizer_corpus == "demo+bfcl" else [])
            tok = build_demo_tokenizer(
                corpus,
                tok_dir,
                vocab_size=tiny.vocab_size,
                pre_split=tiny.pre_split,
                max_token_chars=tiny.max_token_chars or None,
            )
        cfg = qwen3.Qwen3Config.tiny(
            len(tok),
            hidden_size=tiny.hidden,
            num_layers=tiny.layers,
            num_heads=tiny.heads,
            num_kv_heads=tiny.kv_heads,
            head_dim=tiny.head_dim,
            param_dtype=spec.dtype,
            dtype=spec.dtype,
        )
        # One compiled init program: the eager path compiles one per parameter shape (~1 s each on CI).
        return qwen3.init_model(cfg, seed=seed, one_program=True), tok
    if not spec.model_path:
        raise ValueError(
            "config.model.model_path is empty: give a local Qwen3 checkpoint directory "
            "(or set config.model.random_tiny=True for a CI smoke run)"
        )
    if not os.path.isdir(spec.model_path):
        raise ValueError(f"config.model.model_path={spec.model_path!r} is not a local directory")
    tok = load_tokenizer(spec.tokenizer_path or spec.model_path)
    model = hf_io.load_hf(spec.model_path, dtype=spec.dtype)
    if model.config.vocab_size < len(tok):
        raise ValueError(f"config.model: model vocab {model.config.vocab_size} < tokenizer size {len(tok)}")
    return model, tok


def build_model_agent(
    spec: ModelSpec,
    sampling: RoleSampling,
    *,
    max_model_len: int,
    work_dir: str,
    enable_thinking: bool = True,
    seed: int = 0,
    shapes: SamplerShapes = SamplerShapes(),
):
    """(agent, codec, client) for a model policy; the client keeps KV caches across turns."""
    from envace_jax.chat import Qwen3ChatCodec
    from envace_jax.rl.policy_client import SamplerClient
    from envace_jax.sampling import Sampler

    model, tok = load_policy(spec, work_dir, seed)
    codec = Qwen3ChatCodec(tok, enable_thinking=enable_thinking, simulator_thinking=enable_thinking)
    if spec.engine == "vllm":  # the rollout engine's vLLM client; it continues turns through vLLM's prefix cache
        from envace_jax.config import RolloutConfig
        from envace_jax.rl.vllm_client import build_vllm_client

        rollout = RolloutConfig(
            max_model_len=max_model_len, act=sampling, rehearse=sampling, seed=seed, engine="vllm", vllm=spec.vllm
        )
        client = build_vllm_client(model, codec.stop_token_ids, rollout)
    else:
        sampler = Sampler(
            model,
            cache_size=max_model_len,
            max_chunk=shapes.max_chunk,
            batch_buckets=shapes.batch_buckets or None,
            length_buckets=shapes.length_buckets or None,
            window_buckets=shapes.window_buckets or None,
        )
        client = SamplerClient(sampler, codec.stop_token_ids)
    return ModelAgent(codec, client, sampling, max_model_len=max_model_len, seed=seed), codec, client
