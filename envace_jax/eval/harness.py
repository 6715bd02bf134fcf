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

from envace_jax.chat.tool_parser import parse_tool_calls, split_assistant_text
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
    finish_reason: str = "stop"     # "stop" | "length" | "cache_full" | LENGTH_BUDGET (nothing generated)
    prompt_tokens: int = 0
    generated_tokens: int = 0


class Agent(Protocol):
    def act(self, conversations: Sequence[Conversation]) -> list[AgentTurn]: ...

    def release(self, keys: Sequence[str]) -> None: ...


def tool_call_text(calls: Sequence[tuple[str, Mapping[str, Any]]], reply: str = "") -> str:
    """Assistant text in Qwen3's native form: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks."""
    blocks = [f'<tool_call>\n{json.dumps({"name": n, "arguments": dict(a)}, ensure_ascii=False)}\n</tool_call>'
              for n, a in calls]
    return "\n".join(([reply] if reply else []) + blocks) if blocks else reply


def parse_turn(text: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], dict | None]:
    """Assistant text -> (message dict, [(name, arguments)], parse error or None).

    A leading newline is added before parsing: with thinking off, Qwen3's generation prompt already
    ends in "\\n\\n", so a first ``<tool_call>`` arrives without the newline our strict parser needs.
    """
    calls, error = parse_tool_calls("\n" + text)
    msg: dict[str, Any] = {"role": "assistant", "content": split_assistant_text("\n" + text)[1:]}
    if calls and error is None:
        msg["tool_calls"] = [{"id": "", "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return msg, [(c["name"], c["arguments"]) for c in calls] if error is None else [], error


def number_calls(msg: dict[str, Any], prefix: str) -> None:
    for i, c in enumerate(msg.get("tool_calls") or []):
        c["id"] = f"{prefix}_{i}"


# ----------------------------------------------------------------------------- model agent

@dataclasses.dataclass
class _Rendered:
    ids: list[int]          # prompt + generated ids the client holds for this key
    gen_ids: list[int]      # the last sampled turn (its closing ids depend on how it ended)
    n_messages: int         # messages rendered into ids, plus the assistant message we produced
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
            new = c.messages[st.n_messages:]
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
            self._state[c.key] = _Rendered(prompt + ids, ids, len(c.messages) + 1,
                                           json.dumps(c.tools, sort_keys=True, default=str))
            outs[i] = AgentTurn(self.codec.decode(ids), g.finish_reason, len(prompt), len(ids))
        return outs  # type: ignore[return-value]

    def release(self, keys: Sequence[str]) -> None:
        for k in keys:
            self._state.pop(k, None)
        self.client.release(list(keys))


# ----------------------------------------------------------------------------- model loading

def demo_corpus(num_tasks: int = 48) -> list[str]:
    """Texts the offline demo tokenizer is trained on: rendered demo conversations, thinking on and off."""
    from envace_jax.chat import render_chat_text
    from envace_jax.data.demo_tasks import generate_tasks

    texts = []
    for split in ("train", "validation"):
        for t in generate_tasks(num_tasks, 0, split):
            system = [m for m in t["messages"] if m["role"] == "system"]
            for thinking in (True, False):
                texts.append(render_chat_text(system + t["reference_messages"], t["tools"], enable_thinking=thinking))
    return texts


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
    texts = [render_chat_text([{"role": "user", "content": "hi"}], schemas[i: i + 10])
             for i in range(0, len(schemas), 10)]
    return repeat * texts + [user_turn(q) for q in questions]


TOKENIZER_CORPORA = ("demo", "demo+bfcl")
PRE_SPLITS = ("qwen", "lines")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which policy to load. ``random_tiny`` builds a random 2-layer Qwen3 and the demo tokenizer (CI)."""

    model_path: str = ""
    tokenizer_path: str = ""
    random_tiny: bool = False
    dtype: str = "float32"
    tiny_hidden: int = 64
    tiny_layers: int = 2
    tiny_heads: int = 4
    tiny_kv_heads: int = 2
    tiny_head_dim: int = 16
    demo_vocab_size: int = 480
    # "demo+bfcl" also trains the demo tokenizer on BFCL's multi-turn tool schemas and questions.
    # BFCL prompts (~17k characters, ~30 tool schemas) are ~10k tokens with the "demo" corpus and
    # ~4k with "demo+bfcl" (the floor of Qwen3's word-level pre-split); with pre_split="lines" and a
    # large vocabulary, merges span words and a prompt shrinks to a few hundred tokens.
    tokenizer_corpus: str = "demo"
    tokenizer_pre_split: str = "qwen"
    tokenizer_max_token_chars: int = 0       # 0 = unlimited
    seed: int = 0


def _init_tiny(cfg, seed: int):
    """``qwen3.init_model(cfg, seed=seed)`` as ONE compiled program: the eager path compiles a
    random-normal program per parameter shape, ~1 s each on a busy 2-core CI box."""
    import jax
    from flax import nnx
    from envace_jax.models import qwen3

    graphdef, _ = nnx.split(nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed))))
    state = jax.jit(lambda: nnx.state(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed))))()
    return nnx.merge(graphdef, state)


def load_policy(spec: ModelSpec, work_dir: str):
    """(model, tokenizer) for ``spec``; nothing is downloaded (local directories only)."""
    from envace_jax.chat import build_demo_tokenizer, load_tokenizer
    from envace_jax.models import hf_io, qwen3

    if spec.random_tiny:
        if spec.model_path:
            raise ValueError("config.model: set either model_path or random_tiny=True, not both")
        tok_dir = spec.tokenizer_path or os.path.join(work_dir, "demo_tokenizer")
        if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
            tok = load_tokenizer(tok_dir)
        else:
            if spec.tokenizer_corpus not in TOKENIZER_CORPORA:
                raise ValueError(f"config.model.tiny.tokenizer_corpus={spec.tokenizer_corpus!r}; "
                                 f"choose one of {TOKENIZER_CORPORA}")
            if spec.tokenizer_pre_split not in PRE_SPLITS:
                raise ValueError(f"config.model.tiny.pre_split={spec.tokenizer_pre_split!r}; choose one of {PRE_SPLITS}")
            if spec.tokenizer_max_token_chars < 0:
                raise ValueError(f"config.model.tiny.max_token_chars={spec.tokenizer_max_token_chars} must be >= 0")
            corpus = demo_corpus() + (bfcl_corpus() if spec.tokenizer_corpus == "demo+bfcl" else [])
            tok = build_demo_tokenizer(corpus, tok_dir, vocab_size=spec.demo_vocab_size,
                                       pre_split=spec.tokenizer_pre_split,
                                       max_token_chars=spec.tokenizer_max_token_chars or None)
        h = spec.tiny_hidden
        cfg = qwen3.Qwen3Config(vocab_size=len(tok), hidden_size=h, intermediate_size=2 * h,
                                num_layers=spec.tiny_layers, num_heads=spec.tiny_heads,
                                num_kv_heads=spec.tiny_kv_heads, head_dim=spec.tiny_head_dim,
                                param_dtype=spec.dtype, dtype=spec.dtype, rope_theta=10000.0,
                                max_position_embeddings=1 << 17)
        return _init_tiny(cfg, spec.seed), tok
    if not spec.model_path:
        raise ValueError("config.model.model_path is empty: give a local Qwen3 checkpoint directory "
                         "(or set config.model.random_tiny=True for a CI smoke run)")
    if not os.path.isdir(spec.model_path):
        raise ValueError(f"config.model.model_path={spec.model_path!r} is not a local directory")
    tok = load_tokenizer(spec.tokenizer_path or spec.model_path)
    model = hf_io.load_hf(spec.model_path, dtype=spec.dtype)
    if model.config.vocab_size < len(tok):
        raise ValueError(f"config.model: model vocab {model.config.vocab_size} < tokenizer size {len(tok)}")
    return model, tok


@dataclasses.dataclass(frozen=True)
class SamplerShapes:
    """Shape buckets for the eval sampler (``Sampler`` keywords; empty = the sampler's defaults).

    Each new (batch, chunk length, cache window) bucket compiles a prefill and a decode program,
    seconds each on CPU. A run whose every call fits one batch and one window (set ``window`` to
    ``max_model_len + max_chunk``, the most the sampler allocates) compiles a handful of programs.
    """

    batch: tuple[int, ...] = ()
    length: tuple[int, ...] = ()
    window: tuple[int, ...] = ()
    max_chunk: int = 512

    def __post_init__(self):
        for name in ("batch", "length", "window"):
            if any(int(b) < 1 for b in getattr(self, name)):
                raise ValueError(f"config.sampler.{name}_buckets must be positive, got {getattr(self, name)}")
        if self.max_chunk < 1:
            raise ValueError(f"config.sampler.max_chunk must be >= 1, got {self.max_chunk}")


def build_model_agent(spec: ModelSpec, sampling: RoleSampling, *, max_model_len: int, work_dir: str,
                      enable_thinking: bool = True, seed: int = 0, shapes: SamplerShapes = SamplerShapes()):
    """(agent, codec, client) for a model policy; the client keeps KV caches across turns."""
    from envace_jax.chat import Qwen3ChatCodec
    from envace_jax.rl.policy_client import SamplerClient
    from envace_jax.sampling import Sampler

    model, tok = load_policy(spec, work_dir)
    codec = Qwen3ChatCodec(tok, enable_thinking=enable_thinking, simulator_thinking=enable_thinking)
    sampler = Sampler(model, cache_size=max_model_len, max_chunk=shapes.max_chunk,
                      batch_buckets=shapes.batch or None, length_buckets=shapes.length or None,
                      window_buckets=shapes.window or None)
    client = SamplerClient(sampler, codec.stop_token_ids)
    return ModelAgent(codec, client, sampling, max_model_len=max_model_len, seed=seed), codec, client
