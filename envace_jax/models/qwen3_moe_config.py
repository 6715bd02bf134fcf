"""``Qwen3MoeConfig``: a ``Qwen3Config`` with sparse MLP layers (Qwen3-30B-A3B, Qwen3-235B-A22B), its presets
and its ``config.json`` spelling. The model is ``qwen3_moe.Qwen3Moe``; the sparse block is ``moe``.

Which layers are sparse follows transformers' ``Qwen3MoeDecoderLayer``: layer ``i`` (from 0) is sparse when it
is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``; the others are dense SwiGLU MLPs of
``intermediate_size``. Both released checkpoints are sparse in every layer."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from envace_jax.models import moe
from envace_jax.models.qwen3_config import CONFIG_CLASSES, Qwen3Config

# ("auto": "blocked" on CPU, where XLA expands ragged_dot into a dense product over every expert; "megablox",
# the Pallas grouped matmul, on TPU, where XLA's ragged_dot weight gradient is dense over every expert; "ragged",
# XLA's grouped matmul, elsewhere)
MOE_DISPATCHES = ("auto", *moe.DISPATCHES)

# (our field, config.json key, default when absent, cast)
MOE_CONFIG_KEYS: tuple[tuple[str, str, Any, Any], ...] = (
    ("num_experts", "num_experts", None, int),
    ("num_experts_per_tok", "num_experts_per_tok", None, int),
    ("moe_intermediate_size", "moe_intermediate_size", None, int),
    ("decoder_sparse_step", "decoder_sparse_step", 1, int),
    ("mlp_only_layers", "mlp_only_layers", (), lambda v: tuple(int(i) for i in v)),
    ("norm_topk_prob", "norm_topk_prob", False, bool),  # transformers' default; both checkpoints say true
    ("router_aux_loss_coef", "router_aux_loss_coef", 0.001, float),
)


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True
    # The checkpoint's load-balancing coefficient, kept for export; the RL loss reads its own
    # (``loss.router_aux_coef``), since transformers adds this one only when output_router_logits is on.
    router_aux_loss_coef: float = 0.001
    moe_dispatch: str = "auto"
    moe_block: int = 0  # rows per block of the "blocked" dispatch; 0 = moe.auto_block
    # On a mesh of several devices, each device routes its own tokens through the whole layer's experts
    # (qwen3_moe._local_tokens: the experts' weights gathered like a dense layer's, tokens never move). False
    # leaves the partitioning of the global sort and grouped matmul to XLA (benchmarks/moe_dispatch_aot.py
    # compares the two; docs/moe.md).
    moe_local_tokens: bool = True

    def __post_init__(self):
        super().__post_init__()
        for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"Qwen3MoeConfig.{f} must be a positive int, got {v!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"Qwen3MoeConfig.num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}"
            )
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"Qwen3MoeConfig.mlp_only_layers {bad} are not layers of a {self.num_layers}-layer model")
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(f"Qwen3MoeConfig.moe_dispatch={self.moe_dispatch!r}; choose one of {MOE_DISPATCHES}")
        if not isinstance(self.moe_block, (int, np.integer)) or self.moe_block < 0:
            raise ValueError(f"Qwen3MoeConfig.moe_block must be an int >= 0, got {self.moe_block!r}")

    def replace(self, **kw) -> "Qwen3MoeConfig":
        """``dataclasses.replace``; a new ``num_layers`` keeps the dense layers that still exist (a shallower copy
        for cost fits, ``envace_jax.aot``) unless ``mlp_only_layers`` is given too."""
        if "num_layers" in kw and "mlp_only_layers" not in kw:
            kw["mlp_only_layers"] = tuple(i for i in self.mlp_only_layers if i < kw["num_layers"])
        return dataclasses.replace(self, **kw)

    # ---- which layers are sparse ----
    def is_sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_sparse(i))

    @property
    def dense_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if not self.is_sparse(i))

    def dispatch(self, backend: str) -> str:
        """The expert dispatch on ``backend`` (``jax.default_backend()``)."""
        if self.moe_dispatch != "auto":
            return self.moe_dispatch
        return {"cpu": "blocked", "tpu": "megablox"}.get(backend, "ragged")

    def num_params(self) -> int:
        d, e, fm = self.hidden_size, self.num_experts, self.moe_intermediate_size
        dense = super().num_params()
        per_dense_mlp = 3 * d * self.intermediate_size
        per_sparse_mlp = d * e + 3 * e * d * fm
        return dense + len(self.sparse_layers) * (per_sparse_mlp - per_dense_mlp)

    def num_active_params(self) -> int:
        """Parameters a token passes through (top-k experts of each sparse layer)."""
        d, k, fm = self.hidden_size, self.num_experts_per_tok, self.moe_intermediate_size
        return self.num_params() - len(self.sparse_layers) * 3 * (self.num_experts - k) * d * fm

    # ---- tiny random models and the released sizes ----
    @classmethod
    def tiny(cls, vocab_size: int, **kw) -> "Qwen3MoeConfig":
        """``Qwen3Config.tiny`` with 8 experts of 32, 2 per token."""
        kw = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, **kw}
        return super().tiny(vocab_size, **kw)

    @classmethod
    def qwen3_30b_a3b(cls, **kw) -> "Qwen3MoeConfig":
        """Qwen3-30B-A3B (April 2025 release: rope 1e6, 40,960 positions)."""
        moe_kw = dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True)
        return cls._preset(2048, 6144, 48, 32, 4, False, **{**moe_kw, **kw})

    @classmethod
    def qwen3_235b_a22b(cls, **kw) -> "Qwen3MoeConfig":
        moe_kw = dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536, norm_topk_prob=True)
        return cls._preset(4096, 12288, 94, 64, 4, False, **{**moe_kw, **kw})

    # ---- config.json ----
    @classmethod
    def fields_from_hf(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        kw = {}
        for ours, key, default, cast in MOE_CONFIG_KEYS:
            value = d.get(key)
            if value is None and key == "num_experts":  # transformers 5 writes num_local_experts
                value = d.get("num_local_experts")
            if value is None:
                if default is None:
                    raise ValueError(f"config.json of a qwen3_moe model has no {key!r}")
                value = default
            kw[ours] = cast(value)
        if d.get("shared_expert_intermediate_size"):
            raise ValueError("config.shared_expert_intermediate_size: shared experts are Qwen2-MoE's, not Qwen3-MoE's")
        return kw

    def to_hf(self) -> dict[str, Any]:
        out = super().to_hf()
        out["architectures"], out["model_type"] = ["Qwen3MoeForCausalLM"], "qwen3_moe"
        for ours, key, _, _ in MOE_CONFIG_KEYS:
            value = getattr(self, ours)
            out[key] = list(value) if isinstance(value, tuple) else value
        out["output_router_logits"] = False
        return out


CONFIG_CLASSES["qwen3_moe"] = Qwen3MoeConfig
