"""The sampler's records: per-row ``SamplingParams``, the ``SamplerState`` a call hands to the next,
a call's ``SamplerOutput`` and the running ``SamplerStats`` (the package ``envace_jax.sampling`` exports them)."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling settings. ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` are off.

    ``seed=None`` draws a fresh seed from the sampler. Row ``i`` of a call gets the stream key
    ``(seed, i)``, so rows sharing one params object still draw independently.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"SamplingParams.temperature={self.temperature!r} must be a finite number >= 0")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p={self.top_p!r} must be in (0, 1]")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k!r} must be an int >= 0 (0 = off)")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 0:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens!r} must be an int >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclasses.dataclass
class SamplerState:
    """Device cache plus host bookkeeping of one batch, for ``Sampler.continue_``.

    ``ends[b]``: tokens of row b in the cache; ``pending[b]``: its last generated token, not yet in
    the cache (-1 if none); ``keys``/``draws``: its PRNG stream. ``carried[b]``: the row was still
    generating when the call returned (``min_done``): its last token is already in the cache and
    ``logits[b]`` (float32 ``[B, V]`` on device) are its next-token logits, so a continuation with
    nothing appended decodes on from them without writing anything. Consumed (donated) by ``continue_``.
    """

    k: tuple[jax.Array, ...]  # per-layer buffers (see qwen3.KVCache)
    v: tuple[jax.Array, ...]
    ends: np.ndarray
    pending: np.ndarray
    keys: np.ndarray
    draws: np.ndarray
    capacity: int
    consumed: bool = False
    logits: jax.Array | None = None
    carried: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        return len(self.ends)

    def total_lengths(self) -> np.ndarray:
        """Tokens each row holds, counting the pending one."""
        return self.ends + (self.pending >= 0)


@dataclasses.dataclass
class SamplerOutput:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]
    lengths: list[int]
    state: SamplerState | None = None
    prefill_logits: jax.Array | None = None  # float32 [B, V]: next-token logits the decode started from
    # A Qwen3-MoE sampler's record (Sampler(record_routing=)): per row, the experts each generated token was
    # routed to as it was fed back, [n, sparse layers, k] (uint8, or int16 past 256 experts)
    routing: list[np.ndarray] | None = None


@dataclasses.dataclass
class SamplerStats:
    """Work done by a ``Sampler`` since it was built (``Sampler.stats``), for accounting.

    ``slot_steps``: padded batch rows x decode steps run; ``generated_tokens / slot_steps`` is the slot
    utilisation. ``prefill_slots``: padded batch rows x chunk columns written by prefill calls.
    ``prefill_s`` / ``decode_s``: wall seconds of the two programs, measured only with ``Sampler.timed``
    set (which waits for the prefill before starting the decode). ``weight_preparations``: times the
    per-layer weights were prepared (once per weights version, see ``Sampler._weights``).
    """

    calls: int = 0
    rows: int = 0
    batch_rows: int = 0
    decode_steps: int = 0
    slot_steps: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    prefill_slots: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    weight_preparations: int = 0

    @property
    def utilisation(self) -> float:
        return self.generated_tokens / self.slot_steps if self.slot_steps else 0.0


__all__ = ["SamplerOutput", "SamplerState", "SamplerStats", "SamplingParams"]
