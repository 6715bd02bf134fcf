"""Serving a checkpoint over the OpenAI chat-completions protocol: ``protocol`` (requests, completions, errors,
tool calls; no jax), ``engine`` (concurrent requests batched into our sampler), ``server`` (the HTTP front).
``build_server`` puts them together for a Hugging Face checkpoint directory; ``launch/serve.py`` runs it."""

from __future__ import annotations

import os

from envace_jax.serve.engine import ServeEngine
from envace_jax.serve.protocol import ChatRequest, RequestError, parse_request
from envace_jax.serve.server import ChatServer

__all__ = ["ChatRequest", "ChatServer", "RequestError", "ServeEngine", "build_server", "parse_request"]


def build_server(
    hf_path: str,
    *,
    model_name: str | None = None,
    tokenizer_path: str | None = None,
    dtype: str = "bfloat16",
    max_model_len: int = 8192,
    max_rows: int = 32,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    enable_thinking: bool = True,
    seed: int = 0,
    sampler_kwargs: dict | None = None,
) -> ChatServer:
    """A ``ChatServer`` (not started) for the checkpoint ``hf_path`` (a dense Qwen3 or a Qwen3-MoE, as its
    config.json says) and its tokenizer (``tokenizer_path``, default the checkpoint's folder, whose chat template
    renders the requests). ``enable_thinking``: the template's default when a request does not say."""
    from envace_jax.chat.render import ChatRenderer
    from envace_jax.chat.tokenizer import load_tokenizer
    from envace_jax.models import hf_io
    from envace_jax.sampling import Sampler

    if not os.path.isdir(hf_path):
        raise ValueError(f"serve: {hf_path!r} is not a checkpoint directory")
    tok = load_tokenizer(tokenizer_path or hf_path)
    model = hf_io.load_hf(hf_path, dtype=dtype)
    if model.config.vocab_size < len(tok):
        raise ValueError(f"serve: the model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's")
    record = {"record_routing": False} if hasattr(model.config, "num_experts") else {}  # nothing is trained here
    sampler = Sampler(model, cache_size=max_model_len, seed=seed, **record, **(sampler_kwargs or {}))
    renderer = ChatRenderer(tok, enable_thinking=enable_thinking)
    engine = ServeEngine(sampler, renderer, max_model_len=max_model_len, max_rows=max_rows, seed=seed)
    name = model_name or os.path.basename(os.path.normpath(hf_path))
    return ChatServer(engine, model_name=name, host=host, port=port, api_key=api_key)
