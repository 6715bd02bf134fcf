"""Depth up-scaling: a deeper Qwen3 that starts out computing exactly what a shallower one computes."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from envace_jax.models.qwen3 import Qwen3

# The two projections that write into the residual stream; zeroing them makes a layer an identity.
_RESIDUAL_WRITERS = ("o_proj", "down_proj")


def grow_depth(model: Qwen3, factor: int) -> Qwen3:
    """A ``factor`` times deeper copy of ``model`` with the same outputs.

    Each layer is followed by ``factor - 1`` copies of itself whose ``o_proj`` and ``down_proj`` are zero:
    they add nothing to the residual stream until training moves those two matrices, and then start from the
    layer's own attention and MLP features rather than from noise. Unlike zero-initialised fresh layers, the
    copies' inner weights get gradients as soon as their output projections do.
    """
    if factor < 1:
        raise ValueError(f"grow_depth: factor must be at least 1, got {factor}")
    cfg = model.config
    # Shapes only (as hf_io.load_hf does): every parameter is set below, so a random init would be wasted work.
    grown = nnx.eval_shape(lambda: Qwen3(cfg.replace(num_layers=cfg.num_layers * factor), rngs=nnx.Rngs(0)))
    grown.embed.embedding.set_value(model.embed.embedding[...])
    grown.norm.scale.set_value(model.norm.scale[...])
    if not cfg.tie_word_embeddings:
        grown.lm_head.set_value(model.lm_head[...])
    for name, stacked in model.layers.arrays().items():
        copies = jnp.repeat(stacked, factor, axis=0)  # layer order 0, 0, ..., 1, 1, ...
        if name in _RESIDUAL_WRITERS:
            first = (jnp.arange(copies.shape[0]) % factor == 0).reshape((-1,) + (1,) * (copies.ndim - 1))
            copies = jnp.where(first, copies, jnp.zeros_like(copies))
        getattr(grown.layers, name).set_value(copies)
    return grown
