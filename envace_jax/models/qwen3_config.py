"""``Qwen3Config``: the sizes, dtypes and switches of a dense Qwen3, its released presets and its
Hugging Face ``config.json`` spelling (``hf_config``). No model code: ``qwen3`` builds the modules from it."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import numpy as np

from envace_jax.model_sizes import TINY
from envace_jax.models import hf_config
from envace_jax.models.numerics import as_dtype

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# config.json model_type -> its config class; qwen3_moe_config registers "qwen3_moe" when imported
# (``envace_jax.models`` imports it), so this module imports no other architecture's
CONFIG_CLASSES: dict[str, type] = {}
# Deepest layer stack whose cache-free pass is unrolled when Qwen3Config.scan_layers is None.
UNROLL_MAX_LAYERS = 8


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat_policy: str = "none"
    scan_layers: bool | None = None  # None: unroll the cache-free pass up to UNROLL_MAX_LAYERS layers
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    # Training / scoring attention runs over query blocks of this many rows (0: one block), so a
    # long row holds [block, T] scores per head instead of [T, T] (20k tokens: 51 GB -> 1.3 GB for 8B).
    attention_block: int = 512
    # LoRA (models/lora.py): the adapters' scale alpha / r; 0 = no adapters. Set by lora.add_adapters.
    lora_scale: float = 0.0

    def __post_init__(self):
        for f in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"Qwen3Config.{f} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"Qwen3Config.num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim={self.head_dim} must be even for rotary embeddings")
        if not isinstance(self.attention_block, (int, np.integer)) or self.attention_block < 0:
            raise ValueError(f"Qwen3Config.attention_block must be an int >= 0, got {self.attention_block!r}")
        if self.scan_layers not in (None, True, False):
            raise ValueError(
                f"Qwen3Config.scan_layers must be True, False or None (by depth), got {self.scan_layers!r}"
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"Qwen3Config.remat_policy={self.remat_policy!r}; choose one of {REMAT_POLICIES}")
        as_dtype(self.param_dtype)
        as_dtype(self.dtype)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def scans(self) -> bool:
        """Whether the cache-free pass (training, scoring) runs its layers as a ``lax.scan`` (else
        unrolled); ``scan_layers=None`` decides by depth. The sampler's cached pass is always unrolled
        over its per-layer cache buffers (``kv_cache``)."""
        if self.scan_layers is not None:
            return self.scan_layers
        return self.num_layers > UNROLL_MAX_LAYERS

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        return () if e is None else ((e,) if isinstance(e, int) else tuple(e))

    def num_params(self) -> int:
        d, f, n, k, h, v = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.vocab_size,
        )
        per_layer = d * n * h * 2 + d * k * h * 2 + 3 * d * f + 2 * d + 2 * h
        return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + d

    # ---- the tiny random model (tests, the demo, CI smoke runs): the one recipe every caller sizes ----
    @classmethod
    def tiny(
        cls,
        vocab_size: int,
        *,
        hidden_size: int = TINY.hidden_size,
        intermediate_size: int | None = None,
        num_layers: int = TINY.num_layers,
        num_heads: int = TINY.num_heads,
        num_kv_heads: int = TINY.num_kv_heads,
        head_dim: int = TINY.head_dim,
        **kw,
    ) -> "Qwen3Config":
        """A small Qwen3 for random init: float32, rope_theta 1e4 (short contexts), 128k positions
        (metadata only). The sizes default to ``model_sizes.TINY``; ``intermediate_size`` defaults to
        ``2 * hidden_size`` (TINY's own width at its hidden size)."""
        base = dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size if intermediate_size is None else intermediate_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rope_theta=10000.0,
            max_position_embeddings=1 << 17,
            param_dtype="float32",
            dtype="float32",
        )
        base.update(kw)
        return cls(**base)

    # ---- presets (dense Qwen3 family; numbers from the released config.json files) ----
    @classmethod
    def _preset(cls, hidden, inter, layers, heads, kv, tie, **kw) -> "Qwen3Config":
        base = dict(
            vocab_size=151936,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=128,
            tie_word_embeddings=tie,
            max_position_embeddings=40960,
            rope_theta=1_000_000.0,
            bos_token_id=151643,
            eos_token_id=151645,
            pad_token_id=151643,
            param_dtype="bfloat16",
            dtype="bfloat16",
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def qwen3_0_6b(cls, **kw):
        return cls._preset(1024, 3072, 28, 16, 8, True, **kw)

    @classmethod
    def qwen3_1_7b(cls, **kw):
        return cls._preset(2048, 6144, 28, 16, 8, True, **kw)

    @classmethod
    def qwen3_4b(cls, **kw):
        return cls._preset(2560, 9728, 36, 32, 8, True, **kw)

    @classmethod
    def qwen3_4b_2507(cls, **kw):
        """Qwen3-4B-Instruct/Thinking-2507: rope_theta 5e6 and a 256k context."""
        kw = {"rope_theta": 5_000_000.0, "max_position_embeddings": 262144, **kw}
        return cls._preset(2560, 9728, 36, 32, 8, True, **kw)

    @classmethod
    def qwen3_8b(cls, **kw):
        return cls._preset(4096, 12288, 36, 32, 8, False, **kw)

    @classmethod
    def qwen3_14b(cls, **kw):
        return cls._preset(5120, 17408, 40, 40, 8, False, **kw)

    @classmethod
    def qwen3_32b(cls, **kw):
        return cls._preset(5120, 25600, 64, 64, 8, False, **kw)

    # ---- Hugging Face config.json (the key table is hf_config.CONFIG_KEYS) ----
    @classmethod
    def from_hf(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], **overrides) -> "Qwen3Config":
        """Reads a transformers Qwen3 config (4.x or 5.x spelling) from a dir, a config.json or a dict. A
        ``model_type='qwen3_moe'`` config gives a ``Qwen3MoeConfig`` (``qwen3_moe_config``)."""
        if isinstance(path_or_dict, Mapping):
            d = dict(path_or_dict)
        elif hasattr(path_or_dict, "to_dict"):
            d = path_or_dict.to_dict()
        else:
            p = os.fspath(path_or_dict)
            if os.path.isdir(p):
                p = os.path.join(p, "config.json")
            with open(p) as f:
                d = json.load(f)
        kw = hf_config.fields_from_hf(d)
        model_type = d.get("model_type", "qwen3")
        if cls is Qwen3Config:  # the config class of the checkpoint's architecture (qwen3_moe: Qwen3MoeConfig)
            cls = CONFIG_CLASSES.get(model_type, cls)
        if cls is not CONFIG_CLASSES.get(model_type):
            raise ValueError(f"{cls.__name__}.from_hf: config.model_type is {model_type!r}")
        if hasattr(cls, "fields_from_hf"):
            kw.update(cls.fields_from_hf(d))
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown Qwen3Config override(s): {sorted(unknown)}")
        return cls(**{**kw, **overrides})

    def to_hf(self) -> dict[str, Any]:
        """A transformers-5 style config.json dict (also readable by transformers 4.51+)."""
        return hf_config.config_to_hf(self)


CONFIG_CLASSES["qwen3"] = Qwen3Config
