"""The Hugging Face ``config.json`` <-> ``Qwen3Config`` key table, and the config features we refuse.

Plain dicts in and out, so ``qwen3.Qwen3Config.from_hf`` / ``to_hf`` use it without importing the
checkpoint reader (``hf_io``, which imports ``qwen3`` for the model itself)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from envace_jax.models.numerics import DTYPES

# config.json model types we build: dense Qwen3 (qwen3.Qwen3) and Qwen3-MoE (qwen3_moe.Qwen3Moe)
MODEL_TYPES = ("qwen3", "qwen3_moe")

# (our Qwen3Config field, its config.json key, the value when the key is absent: _REQUIRED, or a
# function of the config dict) and the type it is read as.
_REQUIRED = object()
CONFIG_KEYS: tuple[tuple[str, str, Any, Callable[[Any], Any] | None], ...] = (
    ("vocab_size", "vocab_size", _REQUIRED, None),
    ("hidden_size", "hidden_size", _REQUIRED, None),
    ("intermediate_size", "intermediate_size", _REQUIRED, None),
    ("num_layers", "num_hidden_layers", _REQUIRED, None),
    ("num_heads", "num_attention_heads", _REQUIRED, None),
    ("num_kv_heads", "num_key_value_heads", lambda d: d["num_attention_heads"], None),
    ("head_dim", "head_dim", lambda d: d["hidden_size"] // d["num_attention_heads"], None),
    ("rms_norm_eps", "rms_norm_eps", 1e-6, float),
    ("tie_word_embeddings", "tie_word_embeddings", False, bool),
    ("max_position_embeddings", "max_position_embeddings", 40960, int),
    ("bos_token_id", "bos_token_id", None, None),
    ("eos_token_id", "eos_token_id", None, None),
    ("pad_token_id", "pad_token_id", None, None),
    ("initializer_range", "initializer_range", 0.02, float),
)
# Written as they are: what our model is, for readers of the exported config.json.
_FIXED_HF = {
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_scaling": None,
    "use_sliding_window": False,
    "sliding_window": None,
    "use_cache": True,
}


def check_supported(d: Mapping[str, Any]) -> None:
    model_type = d.get("model_type", "qwen3")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"config.model_type={model_type!r}: only {list(MODEL_TYPES)} are supported")
    if d.get("attention_bias", False):
        raise ValueError("config.attention_bias=true is not supported (Qwen3 has no attention biases)")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.hidden_act={act!r} is not supported (only 'silu')")
    if d.get("use_sliding_window", False):
        raise ValueError("config.use_sliding_window=true is not supported")
    layer_types = d.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        bad = sorted(set(t for t in layer_types if t != "full_attention"))
        raise ValueError(f"config.layer_types contains {bad}: only 'full_attention' is supported")
    for field in ("rope_parameters", "rope_scaling"):
        spec = d.get(field)
        if spec:
            rtype = spec.get("rope_type", spec.get("type", "default"))
            if rtype not in ("default", None):
                raise ValueError(
                    f"config.{field}.rope_type={rtype!r} is not supported (only 'default' rotary embeddings)"
                )


def fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """A transformers Qwen3 ``config.json`` dict (4.x or 5.x spelling) -> ``Qwen3Config`` keyword arguments."""
    check_supported(d)
    kw: dict[str, Any] = {}
    for ours, key, default, cast in CONFIG_KEYS:
        value = d.get(key)
        if value is None and default is not None:  # absent (or null): the HF default
            if default is _REQUIRED:
                raise ValueError(f"config.json has no {key!r}")
            value = default(d) if callable(default) else default
        kw[ours] = cast(value) if cast is not None and value is not None else value
    # rope: 4.x has top-level rope_theta (+ optional rope_scaling); 5.x has rope_parameters.
    kw["rope_theta"] = float((d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta", 10000.0)))
    dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
    if dtype not in DTYPES:
        raise ValueError(f"config dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)}")
    kw["param_dtype"] = kw["dtype"] = dtype
    return kw


def config_to_hf(cfg: Any) -> dict[str, Any]:
    """A ``Qwen3Config`` -> a transformers-5 style ``config.json`` dict (also readable by transformers 4.51+)."""
    out: dict[str, Any] = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    for ours, key, _, _ in CONFIG_KEYS:
        value = getattr(cfg, ours)
        out[key] = list(value) if isinstance(value, tuple) else value
    out.update(_FIXED_HF)
    out["rope_theta"] = cfg.rope_theta
    out["rope_parameters"] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    out["torch_dtype"] = out["dtype"] = cfg.param_dtype
    return out
