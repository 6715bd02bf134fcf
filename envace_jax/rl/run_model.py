"""The policy model of a run: the architecture ``model.preset`` selects (``model_config``) and its weights, from a
checkpoint or a random init (``build_model``). Re-exported by ``rl.train``."""

from __future__ import annotations

from envace_jax import config as config_lib
from envace_jax.models import hf_io, qwen3
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig

_ARCH_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "tie_word_embeddings",
)
_MOE_ARCH_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
)


def model_config(m: config_lib.ModelSection, vocab: int) -> qwen3.Qwen3Config:
    """The architecture ``model.preset`` selects: ``tiny`` sizes it from the model section (its vocabulary
    grown to the tokenizer's), a named preset is that Qwen3 model. Dtypes and remat come from the section."""
    common = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat_policy=m.remat_policy)
    if m.preset == "tiny":  # with model.num_experts > 0, a tiny Qwen3-MoE (moe_kwargs is empty otherwise)
        return (Qwen3MoeConfig if m.num_experts else qwen3.Qwen3Config).tiny(
            max(m.vocab_size, vocab),
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            **m.moe_kwargs(),
            **common,
        )
    if m.preset in config_lib.MOE_PRESETS:
        cfg = getattr(Qwen3MoeConfig, m.preset)(moe_dispatch=m.moe_dispatch, **common)
    else:
        cfg = getattr(qwen3.Qwen3Config, m.preset)(**common)
    if cfg.vocab_size < vocab:
        raise config_lib.ConfigError(
            f"config.model.preset={m.preset!r} has {cfg.vocab_size} embeddings, fewer "
            f"than the tokenizer's {vocab} tokens"
        )
    return cfg


def build_model(m: config_lib.ModelSection, vocab: int, mesh, path: str | None = None) -> qwen3.Qwen3:
    """The policy: weights from ``path`` (default ``model.hf_path``), else a random init of ``model_config``.
    A checkpoint must have the architecture of a named ``model.preset``."""
    path = m.hf_path if path is None else path
    if not path:
        return qwen3.init_model(model_config(m, vocab), seed=m.init_seed, mesh=mesh)
    over = {}
    if qwen3.Qwen3Config.from_hf(path).__class__ is Qwen3MoeConfig:  # a Qwen3-MoE checkpoint: the section's dispatch
        over["moe_dispatch"] = m.moe_dispatch
    model = hf_io.load_hf(
        path, dtype=m.param_dtype, mesh=mesh, compute_dtype=m.dtype, remat_policy=m.remat_policy, **over
    )
    if model.config.vocab_size < vocab:
        raise ValueError(f"config.model.hf_path: model vocab {model.config.vocab_size} < tokenizer size {vocab}")
    if m.preset != "tiny":
        want = model_config(m, vocab)
        diff = [
            f"{f}={getattr(model.config, f)} (preset: {getattr(want, f)})"
            for f in _ARCH_FIELDS + (_MOE_ARCH_FIELDS if isinstance(want, Qwen3MoeConfig) else ())
            if getattr(model.config, f, None) != getattr(want, f, None)
        ]
        if diff:
            raise config_lib.ConfigError(
                f"config.model.hf_path={path!r} is not a {m.preset} checkpoint: " + ", ".join(diff)
            )
    return model
