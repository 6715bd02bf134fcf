"""The vLLM engine's settings (``rollout.vllm``, ``judge.local.vllm``, ``config.model.vllm`` of an evaluation): one
section that the rollouts, the local judge and evaluation share (rl/vllm_engine.py, docs/vllm.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from envace_jax.config.choices import VLLM_DTYPES
from envace_jax.config.rules import _NONNEG, _POS, Checked, Rule, one_of


@dataclasses.dataclass(frozen=True)
class VllmSettings(Checked):
    """The vLLM rollout engine (``rollout.engine="vllm"``, rl/vllm_engine.py, docs/vllm.md). It runs in a process
    of its own, in vLLM's interpreter: ``python`` ("" finds one: $ENVACE_VLLM_PYTHON, then ``.cache/vllm`` of
    ``make vllm-deps``, then this interpreter if it imports vllm)."""

    LABEL: ClassVar[str] = "rollout.vllm"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("dtype", *one_of(VLLM_DTYPES)),
        ("max_num_seqs", _POS, "> 0"),
        ("start_timeout_s", _POS, "> 0"),
        ("kv_cache_gib", _NONNEG, ">= 0"),
        ("threads", _NONNEG, ">= 0"),
    )

    python: str = ""
    dtype: str = "auto"
    # True skips torch.compile at start-up (seconds instead of about a minute at Qwen3-0.6B shape) and decodes
    # eagerly, slower per token: for tests and short runs
    enforce_eager: bool = False
    max_num_seqs: int = 256  # rows vLLM decodes at once (it queues the rest)
    # CPU only: the KV cache's size (VLLM_CPU_KVCACHE_SPACE), whole GiB. 0 leaves it to vLLM, which sizes it from the
    # host's free memory at start-up: memory the trainer beside it then lacks (seen here: the kernel killed it)
    kv_cache_gib: int = 4
    threads: int = 0  # CPU only: OpenMP threads of the engine (0: vLLM's default, every core)
    start_timeout_s: float = 900.0
    # the shared-memory block the weights travel through (a whole copy of the model in RAM) is kept from one sync to
    # the next: a fresh block costs its page faults again (1.3 of 4.2 s at Qwen3-0.6B in bfloat16 here); False
    # frees it after each sync, for a host short of memory
    keep_sync_block: bool = True
