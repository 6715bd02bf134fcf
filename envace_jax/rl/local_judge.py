"""The ``local`` judge kind: a checklist judge model run in-process by our sampler instead of behind an HTTP
endpoint, e.g. the reference's own judge Qwen3-30B-A3B (a Qwen3-MoE) or any dense Qwen3 checkpoint.

``SamplerTexts`` is the ``generate_texts`` of ``judges.LocalModelJudge``: each chat message list is rendered with
the judge checkpoint's chat template, sampled with the judge's settings (the reference's HTTP judge's by default:
temperature 0.6, top-p 0.8, up to 6,000 tokens) and decoded; ``LocalModelJudge`` parses the verdicts and asks
again for the malformed ones. Calls are serialised by a lock: the asynchronous pipeline's judge workers share one
sampler. ``judge.local.engine="vllm"`` runs the same calls on a vLLM engine instead (``EngineTexts``)."""

from __future__ import annotations

import os
import threading
from typing import Sequence

from envace_jax.config import LocalJudgeConfig


class SamplerTexts:
    """``messages lists -> completions`` over a ``Sampler`` of the judge model (see the module docstring).
    ``seed``: the first call's sampling seed; each call after it takes the next, so a run repeats exactly."""

    def __init__(self, sampler, renderer, cfg: LocalJudgeConfig):
        self.sampler, self.renderer, self.cfg = sampler, renderer, cfg
        self._lock = threading.Lock()
        self._calls = 0

    def __call__(self, message_lists: Sequence[list[dict]]) -> list[str]:
        if not message_lists:
            return []
        prompts = [self.renderer.render_messages(list(m), add_generation_prompt=True) for m in message_lists]
        room = self.cfg.max_model_len - max(len(p) for p in prompts)
        if room < 1:
            raise ValueError(
                f"judge.local: a judge prompt of {max(len(p) for p in prompts)} tokens leaves no room for an answer "
                f"within judge.local.max_model_len={self.cfg.max_model_len}"
            )
        with self._lock:
            seed = self.cfg.seed + self._calls
            self._calls += 1
            tokens = self._sample(prompts, min(self.cfg.max_tokens, room), seed)
        return [self.renderer.decode(t) for t in tokens]

    def _sample(self, prompts: list[list[int]], max_new_tokens: int, seed: int) -> list[list[int]]:
        """The generated ids of each prompt, at the judge's settings."""
        from envace_jax.sampling import SamplingParams

        params = SamplingParams(
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            max_new_tokens=max_new_tokens,
            stop_token_ids=self.renderer.stop_token_ids,
            seed=seed,
        )
        return self.sampler.generate(prompts, params).tokens


class EngineTexts(SamplerTexts):
    """``SamplerTexts`` over a vLLM engine holding the judge model (``judge.local.engine="vllm"``): the same prompts,
    settings and seeds (row ``i`` of a call draws from its own seed)."""

    def __init__(self, engine, renderer, cfg: LocalJudgeConfig):
        super().__init__(None, renderer, cfg)
        self.engine = engine

    def _sample(self, prompts: list[list[int]], max_new_tokens: int, seed: int) -> list[list[int]]:
        base = {
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
            "top_k": 0,
            "max_tokens": max_new_tokens,
            "stop_token_ids": list(self.renderer.stop_token_ids),
        }
        rows = self.engine.generate(prompts, [dict(base, seed=seed * 100_003 + i) for i in range(len(prompts))])
        return [r["ids"] for r in rows]


def build_local_judge(cfg: LocalJudgeConfig, *, sampler_kwargs: dict | None = None):
    """A ``LocalModelJudge`` over the checkpoint ``cfg.hf_path`` (its config.json picks a dense Qwen3 or a
    Qwen3-MoE), its tokenizer (``cfg.tokenizer_path``, default the checkpoint's folder) and a ``Sampler``."""
    from envace_jax.chat.render import ChatRenderer
    from envace_jax.chat.tokenizer import load_tokenizer
    from envace_jax.models import hf_io
    from envace_jax.rl.judges import LocalModelJudge
    from envace_jax.sampling import Sampler

    if not cfg.hf_path:
        raise ValueError("judge.kind='local' needs judge.local.hf_path (a local checkpoint directory of the judge)")
    if not os.path.isdir(cfg.hf_path):
        raise ValueError(f"judge.local.hf_path={cfg.hf_path!r} is not a local directory")
    tok = load_tokenizer(cfg.tokenizer_path or cfg.hf_path)
    model = hf_io.load_hf(cfg.hf_path, dtype=cfg.dtype)
    if model.config.vocab_size < len(tok):
        raise ValueError(f"judge.local: model vocab {model.config.vocab_size} < tokenizer size {len(tok)}")
    renderer = ChatRenderer(tok, enable_thinking=cfg.enable_thinking)
    if cfg.engine == "vllm":  # the judge's weights never change: loaded into the engine once
        from envace_jax.rl.vllm_engine import VllmEngine

        engine = VllmEngine(model.config, cfg.vllm, max_model_len=cfg.max_model_len, seed=cfg.seed)
        engine.load_weights(model)
        return LocalModelJudge(EngineTexts(engine, renderer, cfg), max_attempts=cfg.max_attempts)
    # The judge's routing is never trained on: no record.
    record = {"record_routing": False} if hasattr(model.config, "num_experts") else {}
    sampler = Sampler(model, cache_size=cfg.max_model_len, **record, **(sampler_kwargs or {}))
    texts = SamplerTexts(sampler, renderer, cfg)
    return LocalModelJudge(texts, max_attempts=cfg.max_attempts)
