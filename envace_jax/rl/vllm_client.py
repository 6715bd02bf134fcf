"""``VllmClient``: the rollout engine's ``PolicyClient`` over a vLLM engine (``rollout.engine="vllm"``).

The rollout engine sees the same interface as with our sampler (``rl.policy_client``): one ``generate`` per
micro-step with every ACT and REHEARSE row of it, each with its own temperature, top-p, top-k, token budget and
seed, the run's stop ids, and the sampled tokens' log-probs back. What differs is underneath:

* **Multi-turn continuation** is vLLM's prefix cache: a turn's prompt extends the previous turn's prompt and
  generation, so its blocks are found by content and only the new suffix is computed. Nothing is kept per
  ``cache_key``, so ``release`` and ``reset`` have nothing to do; a weight sync empties the cache, since its
  keys and values came from the old weights. ``CallStats.continued`` counts the rows that found a cached
  prefix and ``prefill_tokens`` the prompt tokens computed.
* **A row that would not fit** the engine's context (``prompt + max_new_tokens > max_model_len``) gets the room
  left; with none left it gets no tokens and ``finish_reason="cache_full"``, as the native sampler's fixed cache
  answers (the rollout engine ends that episode as ``length_budget``).
* **Log-probs are the engine's**: computed by vLLM's kernels, in its dtype. They are the behaviour policy of the
  update. ``rl.train`` turns on the truncated importance-weight correction for this engine (``behaviour_is``
  "auto" -> "token") and the step logs the engine-trainer gap per role (``<role>/logp_mismatch_sampler``).
* **Weights** reach the engine with ``sync(model)``. A client built with ``model`` syncs by itself: ``reset()``
  (which ``RLStep.weights_changed`` calls after every update, and the demo after each step and evaluation chunk)
  marks the engine's weights stale, and the next ``generate`` sends the model's current weights first. So updates
  made after the step's own (the demo's replay batches) are in the engine too. The seconds of each sync are in the
  step's metrics (``step_metrics``) as ``rollout/vllm_weight_sync_s``.
"""

from __future__ import annotations

from typing import Any, Sequence

import dataclasses

from envace_jax.config import RLSection, RolloutConfig
from envace_jax.rl.policy_client import CallStats, GenOutput, GenRequest, check_request
from envace_jax.rl.types import ACT, REHEARSE
from envace_jax.rl.vllm_engine import VllmEngine


class VllmClient:
    """``PolicyClient`` over a ``VllmEngine`` (see the module docstring)."""

    def __init__(self, engine: VllmEngine, stop_token_ids: Sequence[int], *, model=None):
        stops = tuple(int(t) for t in stop_token_ids)
        if not stops:
            raise ValueError("VllmClient(stop_token_ids) is empty: generations would never stop early")
        self.engine = engine
        self.stop_token_ids = stops
        self.calls: list[CallStats] = []
        self.model = model  # synced by itself when stale (see the module docstring)
        self._stale = False
        self._metrics: dict[str, list[float]] = {}

    # ------------------------------------------------------------------ PolicyClient
    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        vocab = self.engine.vocab_size
        for i, r in enumerate(requests):
            check_request(i, r)
            bad = [t for t in r.prompt_ids if not 0 <= t < vocab]
            if bad:  # vLLM does not check ids it gets without a tokenizer: an id past the table is read anyway
                raise ValueError(
                    f"requests[{i}] ({r.role}, episode {r.episode}) has token ids outside the vocabulary of "
                    f"{vocab}: {bad[:5]}"
                )
        if self._stale:
            self.sync(self.model)
        room = [self.engine.max_model_len - len(r.prompt_ids) for r in requests]
        asked = [i for i, left in enumerate(room) if left > 0]
        params = [self._params(requests[i], room[i]) for i in asked]
        rows = self.engine.generate([requests[i].prompt_ids for i in asked], params) if asked else []
        outs = [GenOutput([], [], "cache_full") for _ in requests]
        for i, row in zip(asked, rows):
            finish = row["finish"] if row["finish"] in ("stop", "length") else "length"
            outs[i] = GenOutput(list(row["ids"]), list(row["logprobs"]), finish)
        stats = CallStats(
            {ACT: sum(r.role == ACT for r in requests), REHEARSE: sum(r.role == REHEARSE for r in requests)},
            continued=sum(row["cached"] > 0 for row in rows),
            fresh=sum(row["cached"] == 0 for row in rows),
            parked=0,
            prefill_tokens=sum(len(requests[i].prompt_ids) - row["cached"] for i, row in zip(asked, rows)),
            full_prefill=False,
        )
        stats.row_tokens = [(r.role, len(r.prompt_ids), len(o.ids)) for r, o in zip(requests, outs)]
        self.calls.append(stats)
        return outs

    def release(self, cache_keys: Sequence[str]) -> None:
        """Nothing is held per key: vLLM's prefix cache finds a conversation's blocks by content."""

    def reset(self) -> None:
        """The weights may have changed: a client with a ``model`` sends them before its next ``generate`` (which
        also empties the engine's prefix cache); nothing else is held here."""
        self._stale = self.model is not None

    def release_weights(self) -> None:
        """The weights live in the engine's process; nothing to drop in this one."""

    # ------------------------------------------------------------------ weights
    def sync(self, model) -> dict[str, float]:
        """Sends ``model``'s current weights to the engine; the metrics of the sync."""
        seconds = self.engine.load_weights(model)
        self._stale = False
        self._metrics.setdefault("rollout/vllm_weight_sync_s", []).append(seconds)
        return {"rollout/vllm_weight_sync_s": seconds}

    def step_metrics(self) -> dict[str, float]:
        """The syncs since the last call (their mean seconds and count; empty if none), then forgotten."""
        syncs = self._metrics.pop("rollout/vllm_weight_sync_s", [])
        if not syncs:
            return {}
        return {
            "rollout/vllm_weight_sync_s": float(sum(syncs) / len(syncs)),
            "rollout/vllm_weight_syncs": float(len(syncs)),
        }

    def close(self) -> None:
        self.engine.close()

    def _params(self, r: GenRequest, room: int) -> dict[str, Any]:
        s = r.sampling
        return {
            "temperature": float(s.temperature),
            "top_p": float(s.top_p),
            "top_k": int(s.top_k),
            "max_tokens": int(min(s.max_new_tokens, room)),
            "seed": int(r.seed),
            "stop_token_ids": list(self.stop_token_ids),
        }


def engine_context(rollout: RolloutConfig) -> int:
    """The engine's context: the rollout's context limit plus the longest generation of either role."""
    return int(rollout.max_model_len + max(rollout.act.max_new_tokens, rollout.rehearse.max_new_tokens))


def build_vllm_client(
    model, stop_token_ids: Sequence[int], rollout: RolloutConfig, *, log_path: str | None = None
) -> VllmClient:
    """A ``VllmClient`` over a new engine for ``model``'s architecture, holding ``model``'s current weights and
    following it (``reset`` -> the next ``generate`` syncs)."""
    if rollout.rolling:
        raise ValueError(
            "rollout.engine='vllm' schedules its rows itself (continuous batching): set rollout.rolling=False"
        )
    engine = VllmEngine(
        model.config, rollout.vllm, max_model_len=engine_context(rollout), seed=rollout.seed, log_path=log_path
    )
    client = VllmClient(engine, stop_token_ids, model=model)
    client.sync(model)
    return client


def with_engine_correction(rl: RLSection) -> RLSection:
    """``rl`` with ``behaviour_is="auto"`` resolved for this engine: "token" (truncated importance weights of the
    trainer's over the engine's log-probs, capped at ``behaviour_is_cap``) when the update recomputes the old
    log-probs, since the engine's kernels and dtype give log-probs the trainer does not; else as ``rl`` says."""
    if rl.behaviour_is == "auto" and rl.recompute_old_logprobs:
        return dataclasses.replace(rl, behaviour_is="token")
    return rl


__all__ = ["VllmClient", "build_vllm_client", "engine_context", "with_engine_correction"]
