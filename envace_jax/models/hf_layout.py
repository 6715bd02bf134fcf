"""The Hugging Face names and layouts of a Qwen3's tensors (``MAPPING``), read by ``hf_io`` (loading) and
``hf_save`` (writing)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable

import numpy as np
from flax import nnx

from envace_jax.models import qwen3

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers some older exports carry; transformers recomputes them, so do we.
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One HF tensor family <-> one of our params.

    ``hf_shape(cfg)`` is the HF tensor's shape (one layer for stacked params);
    ``to_ours(a, cfg)`` maps an HF array to our per-layer layout and
    ``to_hf(a, cfg)`` is its inverse.
    """

    hf_name: str  # "{i}" marks the layer index, "{e}" the expert's
    path: tuple[str, ...]
    layered: bool
    hf_shape: Callable[[qwen3.Qwen3Config], tuple[int, ...]]
    to_ours: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
    to_hf: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
    untied_only: bool = False
    # The HF layers our stacked param holds, in its order (None: every layer). A Qwen3-MoE stacks its sparse
    # and its dense layers' MLPs apart.
    layer_ids: Callable[[qwen3.Qwen3Config], tuple[int, ...]] | None = None
    # One HF tensor per expert (Qwen3-MoE): our layer slice is [E, ...], expert e's tensor mapped into row e.
    per_expert: bool = False

    def name(self, layer: int | None = None, expert: int | None = None) -> str:
        return self.hf_name.format(i=layer, e=expert) if self.layered else self.hf_name

    def layers(self, cfg: qwen3.Qwen3Config) -> tuple[int, ...]:
        return tuple(range(cfg.num_layers)) if self.layer_ids is None else tuple(self.layer_ids(cfg))

    def entries(self, cfg: qwen3.Qwen3Config) -> list[tuple[str, tuple[int, ...]]]:
        """Every HF tensor of this family: (its name, its index into our param: () unstacked, (slot,) a layer
        of the stack, (slot, expert) one expert of a layer)."""
        if not self.layered:
            return [(self.name(), ())]
        if self.per_expert:
            return [
                (self.name(i, e), (slot, e)) for slot, i in enumerate(self.layers(cfg)) for e in range(cfg.num_experts)
            ]
        return [(self.name(i), (slot,)) for slot, i in enumerate(self.layers(cfg))]


_ident = lambda a, c: a
_T = lambda a, c: a.T

MAPPING: tuple[TensorMap, ...] = (
    TensorMap(
        "model.embed_tokens.weight",
        ("embed", "embedding"),
        False,
        lambda c: (c.vocab_size, c.hidden_size),
        _ident,
        _ident,
    ),
    TensorMap("model.norm.weight", ("norm", "scale"), False, lambda c: (c.hidden_size,), _ident, _ident),
    TensorMap("lm_head.weight", ("lm_head",), False, lambda c: (c.vocab_size, c.hidden_size), _T, _T, untied_only=True),
    # HF q_proj.weight is (N*H, D) with the head index major: out[n*H + h] = sum_d W[n*H+h, d] x[d].
    TensorMap(
        "model.layers.{i}.self_attn.q_proj.weight",
        ("layers", "q_proj"),
        True,
        lambda c: (c.num_heads * c.head_dim, c.hidden_size),
        lambda a, c: a.reshape(c.num_heads, c.head_dim, c.hidden_size).transpose(2, 0, 1),
        lambda a, c: a.transpose(1, 2, 0).reshape(c.num_heads * c.head_dim, c.hidden_size),
    ),
    TensorMap(
        "model.layers.{i}.self_attn.k_proj.weight",
        ("layers", "k_proj"),
        True,
        lambda c: (c.num_kv_heads * c.head_dim, c.hidden_size),
        lambda a, c: a.reshape(c.num_kv_heads, c.head_dim, c.hidden_size).transpose(2, 0, 1),
        lambda a, c: a.transpose(1, 2, 0).reshape(c.num_kv_heads * c.head_dim, c.hidden_size),
    ),
    TensorMap(
        "model.layers.{i}.self_attn.v_proj.weight",
        ("layers", "v_proj"),
        True,
        lambda c: (c.num_kv_heads * c.head_dim, c.hidden_size),
        lambda a, c: a.reshape(c.num_kv_heads, c.head_dim, c.hidden_size).transpose(2, 0, 1),
        lambda a, c: a.transpose(1, 2, 0).reshape(c.num_kv_heads * c.head_dim, c.hidden_size),
    ),
    TensorMap(
        "model.layers.{i}.self_attn.o_proj.weight",
        ("layers", "o_proj"),
        True,
        lambda c: (c.hidden_size, c.num_heads * c.head_dim),
        lambda a, c: a.reshape(c.hidden_size, c.num_heads, c.head_dim).transpose(1, 2, 0),
        lambda a, c: a.transpose(2, 0, 1).reshape(c.hidden_size, c.num_heads * c.head_dim),
    ),
    TensorMap(
        "model.layers.{i}.self_attn.q_norm.weight", ("layers", "q_norm"), True, lambda c: (c.head_dim,), _ident, _ident
    ),
    TensorMap(
        "model.layers.{i}.self_attn.k_norm.weight", ("layers", "k_norm"), True, lambda c: (c.head_dim,), _ident, _ident
    ),
    TensorMap(
        "model.layers.{i}.input_layernorm.weight",
        ("layers", "input_norm"),
        True,
        lambda c: (c.hidden_size,),
        _ident,
        _ident,
    ),
    TensorMap(
        "model.layers.{i}.post_attention_layernorm.weight",
        ("layers", "post_norm"),
        True,
        lambda c: (c.hidden_size,),
        _ident,
        _ident,
    ),
    TensorMap(
        "model.layers.{i}.mlp.gate_proj.weight",
        ("layers", "gate_proj"),
        True,
        lambda c: (c.intermediate_size, c.hidden_size),
        _T,
        _T,
    ),
    TensorMap(
        "model.layers.{i}.mlp.up_proj.weight",
        ("layers", "up_proj"),
        True,
        lambda c: (c.intermediate_size, c.hidden_size),
        _T,
        _T,
    ),
    TensorMap(
        "model.layers.{i}.mlp.down_proj.weight",
        ("layers", "down_proj"),
        True,
        lambda c: (c.hidden_size, c.intermediate_size),
        _T,
        _T,
    ),
)


_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
_sparse = lambda c: c.sparse_layers
_dense = lambda c: c.dense_layers

# Qwen3-MoE (qwen3_moe.Qwen3Moe): the dense model's attention and norms, the dense layers' MLPs in their own
# stack, and each sparse layer's router (HF [E, D], ours [D, E]) and experts (HF one [out, in] tensor per expert,
# ours [E, in, out]).
MOE_MAPPING: tuple[TensorMap, ...] = (
    *(m for m in MAPPING if m.path[-1] not in _DENSE_MLP),
    *(
        dataclasses.replace(m, path=("dense_mlp", m.path[-1]), layer_ids=_dense)
        for m in MAPPING
        if m.path[-1] in _DENSE_MLP
    ),
    TensorMap(
        "model.layers.{i}.mlp.gate.weight",
        ("experts", "router"),
        True,
        lambda c: (c.num_experts, c.hidden_size),
        _T,
        _T,
        layer_ids=_sparse,
    ),
    TensorMap(
        "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
        ("experts", "expert_gate"),
        True,
        lambda c: (c.moe_intermediate_size, c.hidden_size),
        _T,
        _T,
        layer_ids=_sparse,
        per_expert=True,
    ),
    TensorMap(
        "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
        ("experts", "expert_up"),
        True,
        lambda c: (c.moe_intermediate_size, c.hidden_size),
        _T,
        _T,
        layer_ids=_sparse,
        per_expert=True,
    ),
    TensorMap(
        "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
        ("experts", "expert_down"),
        True,
        lambda c: (c.hidden_size, c.moe_intermediate_size),
        _T,
        _T,
        layer_ids=_sparse,
        per_expert=True,
    ),
)


def active_mapping(cfg: qwen3.Qwen3Config) -> list[TensorMap]:
    table = MOE_MAPPING if hasattr(cfg, "num_experts") else MAPPING
    maps = [m for m in table if not (m.untied_only and cfg.tie_word_embeddings)]
    return [m for m in maps if not m.layered or m.layers(cfg)]  # a MoE without dense layers has no dense MLPs


def expected_hf_tensors(cfg: qwen3.Qwen3Config) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor a checkpoint of ``cfg`` must hold."""
    out: dict[str, tuple[int, ...]] = {}
    for m in active_mapping(cfg):
        for name, _ in m.entries(cfg):
            out[name] = tuple(m.hf_shape(cfg))
    return out


def _variable(model: nnx.Module, path: tuple[str, ...]) -> nnx.Variable:
    obj: Any = model
    for p in path:
        obj = getattr(obj, p)
    return obj


# ------------------------------------------------------------------------------------------
# reading


class WeightsError(ValueError):
    """A weights folder that does not hold what its config describes. The one-line message names the
    file or tensor and what is wrong, so a launch script can print it instead of a traceback."""


class WeightsFileMissing(WeightsError, FileNotFoundError):
    """A weights file the folder needs is absent (also a ``FileNotFoundError``)."""


def weights_layout(path: str | os.PathLike) -> tuple[str, str] | None:
    """Where a folder's weights are read from: ``("single", <path>/model.safetensors)`` or
    ``("index", <path>/model.safetensors.index.json)``; ``None`` when it holds neither.

    The single file wins when both are present, as in transformers' ``from_pretrained``: our loader and
    transformers then read the same weights even from a folder that also holds a stale index.
    """
    path = os.fspath(path)
    single, index = os.path.join(path, SINGLE_FILE), os.path.join(path, INDEX_FILE)
    if os.path.isfile(single):
        return "single", single
    if os.path.isfile(index):
        return "index", index
    return None


def read_index(index: str) -> dict[str, str]:
    """The ``weight_map`` (HF tensor name -> shard file name) of a ``model.safetensors.index.json``."""
    try:
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
    except (ValueError, AttributeError) as e:  # not JSON, or JSON that is not an object
        raise WeightsError(f"{index}: not a safetensors index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"{index}: no 'weight_map' object of tensor name -> file name")
    return weight_map
