"""Low-rank adapters (LoRA, Hu et al. 2021) on a ``Qwen3``'s projections, in PEFT's convention.

Each adapted projection ``W`` (stacked over layers in ``DecoderStack``, shaped ``[*in, *out]``) gains two
``nnx.LoRAParam`` arrays beside it, ``<name>_lora_a`` ``[L, *in, r]`` and ``<name>_lora_b`` ``[L, r, *out]``, and
the layer computes with ``W + scale * A @ B`` where ``scale = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA): PEFT's
``delta_W = scale * B @ A`` in its ``[out, in]`` layout. A starts Kaiming-uniform (bound ``1 / sqrt(fan_in)``, as
PEFT's ``kaiming_uniform_(a=sqrt(5))``), B at zero, so a fresh adapter leaves the model as it was.

Where the sum is formed:
* training and scoring (``Qwen3._run_layers``): per layer, inside the layer scan (``merged``), so one layer's
  merged weights exist at a time and the gradient reaches A and B through the sum (the base is a constant);
* sampling: ``Qwen3.layer_params`` merges every layer once, when a sampler prepares its weights for a new
  weights version, so decoding costs what it costs without adapters.

The model's ``config.lora_scale`` holds ``scale`` (0: no adapters); which projections carry adapters is read from
the arrays present. ``peft_io`` writes and reads PEFT's adapter files.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax.config import LORA_TARGETS

# projection -> (contracted input dims of its stacked weight, HF module path under a decoder layer)
TARGETS: dict[str, tuple[int, str]] = {
    "q_proj": (1, "self_attn.q_proj"),
    "k_proj": (1, "self_attn.k_proj"),
    "v_proj": (1, "self_attn.v_proj"),
    "o_proj": (2, "self_attn.o_proj"),
    "gate_proj": (1, "mlp.gate_proj"),
    "up_proj": (1, "mlp.up_proj"),
    "down_proj": (1, "mlp.down_proj"),
}
DEFAULT_TARGETS = tuple(TARGETS)
assert DEFAULT_TARGETS == LORA_TARGETS, "config.LORA_TARGETS lists the same projections"
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"


def lora_scale(rank: int, alpha: float, rslora: bool = False) -> float:
    return float(alpha) / (math.sqrt(rank) if rslora else rank)


def parse_targets(targets) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` or a sequence -> validated names, in ``TARGETS`` order."""
    names = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else [str(t) for t in targets]
    names = [n for n in names if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        raise ValueError(f"LoRA targets must be a non-empty subset of {DEFAULT_TARGETS}, got {targets!r}")
    return tuple(t for t in TARGETS if t in names)


def add_adapters(model, rank: int, alpha: float, targets=DEFAULT_TARGETS, *, seed: int = 0, rslora: bool = False):
    """Adds fresh adapters of ``rank`` to ``model``'s ``targets`` (in place; returns the model). A model that already
    has adapters is refused. Under ``nnx.eval_shape`` the arrays are abstract (AOT)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be an int >= 1, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be > 0, got {alpha!r}")
    targets = parse_targets(targets)
    if model.config.lora_scale:
        raise ValueError("the model already has LoRA adapters")
    layers = model.layers
    key = jax.random.key(seed)
    missing = [t for t in targets if not hasattr(layers, t)]
    if missing:  # a Qwen3-MoE's MLPs are experts (models/qwen3_moe.py), outside model.layers
        raise ValueError(
            f"LoRA targets {missing}: this model's layers have no such weights; a Qwen3-MoE adapts its attention "
            "(q_proj, k_proj, v_proj, o_proj)"
        )
    for i, name in enumerate(targets):
        n_in = TARGETS[name][0]
        w = getattr(layers, name)
        shape, axes = w.shape, tuple(getattr(w, "logical_axes", None) or (None,) * w.ndim)
        L, ins, outs = shape[0], shape[1 : 1 + n_in], shape[1 + n_in :]
        bound = 1.0 / math.sqrt(int(np.prod(ins)))
        a = jax.random.uniform(jax.random.fold_in(key, i), (L, *ins, rank), jnp.float32, -bound, bound)
        dtype = w.get_value().dtype
        setattr(layers, name + A_SUFFIX, nnx.LoRAParam(a.astype(dtype), logical_axes=(*axes[: 1 + n_in], None)))
        b = jnp.zeros((L, rank, *outs), dtype)
        setattr(layers, name + B_SUFFIX, nnx.LoRAParam(b, logical_axes=(axes[0], None, *axes[1 + n_in :])))
    model.config = model.config.replace(lora_scale=lora_scale(rank, alpha, rslora))
    return model


def adapted(params: dict) -> tuple[str, ...]:
    """The projections of a layer-params dict that carry adapters."""
    return tuple(t for t in TARGETS if t + A_SUFFIX in params)


def delta(a: jax.Array, b: jax.Array, n_in: int, stacked: bool) -> jax.Array:
    """``A @ B`` in the weight's shape: a ``[(L,) *in, r]``, b ``[(L,) r, *out]`` -> ``[(L,) *in, *out]``,
    accumulated in float32."""
    lead = a.shape[:1] if stacked else ()
    ins, outs = a.shape[len(lead) : len(lead) + n_in], b.shape[len(lead) + 1 :]
    r = a.shape[-1]
    a2 = a.reshape(*lead, int(np.prod(ins)), r)
    b2 = b.reshape(*lead, r, int(np.prod(outs)))
    spec = "lir,lro->lio" if stacked else "ir,ro->io"
    d = jnp.einsum(spec, a2, b2, preferred_element_type=jnp.float32)
    return d.reshape(*lead, *ins, *outs)


def merged(params: dict, scale: float, stacked: bool = False) -> dict:
    """``params`` (one layer's, or all layers' stacked with ``stacked``) with every adapted weight replaced by
    ``W + scale * A @ B`` (in W's dtype) and the adapter arrays left out; ``params`` itself when none."""
    names = adapted(params)
    if not names:
        return params
    out = {k: v for k, v in params.items() if not k.endswith((A_SUFFIX, B_SUFFIX))}
    for name in names:
        w = params[name]
        d = delta(params[name + A_SUFFIX], params[name + B_SUFFIX], TARGETS[name][0], stacked)
        out[name] = (w.astype(jnp.float32) + scale * d).astype(w.dtype)
    return out


def adapter_arrays(model) -> dict[str, jax.Array]:
    """The model's adapters by attribute name (``q_proj_lora_a``, ...); empty without adapters."""
    return {k: v[...] for k, v in vars(model.layers).items() if isinstance(v, nnx.LoRAParam)}


def merge_into_base(model):
    """Folds the adapters into the base weights and removes them (in place; returns the model): a plain model
    (the merged export, or a sampler's own copy)."""
    if not model.config.lora_scale:
        return model
    layers = model.layers
    stacked = {k: v[...] for k, v in vars(layers).items() if isinstance(v, nnx.Param)}
    new = merged(stacked, model.config.lora_scale, stacked=True)
    for name in adapted(stacked):
        getattr(layers, name).set_value(new[name])
        delattr(layers, name + A_SUFFIX)
        delattr(layers, name + B_SUFFIX)
    model.config = model.config.replace(lora_scale=0.0)
    return model


def merged_state(model, filter=nnx.Param) -> dict:
    """``nnx.state(model, filter)`` as a pure dict with the adapters folded into their weights and left out: the
    state of a plain model of the same architecture (``config.lora_scale = 0``), for copies the sampler reads."""
    pure = nnx.to_pure_dict(nnx.state(model, filter))
    if model.config.lora_scale:
        pure["layers"] = merged(pure["layers"], model.config.lora_scale, stacked=True)
    return pure
