"""The weights the sampler's programs read, prepared once per weights version.

The cached forward reads each layer's weights as a buffer of its own (``qwen3.DecodeWeights``), sliced
out of the model's stacked arrays (without a mesh, each layer's matrices ``[out, in]`` with q/k/v and
gate/up concatenated, ``qwen3.fuse_projections``, and the head ``[V, D]``; on a CPU mesh, a tied head
transposed to ``[D, V]``). Made in every program call,
those copies cost seconds per call at Qwen3-0.6B on CPU (page faults of the 1.9-2.4 GB scratch), so on
CPU the sampler makes them once per weights version and passes them to every program.

The version is the identity of the model's parameter arrays: jax arrays are immutable, so new weights
(an optimizer update, ``nnx.update``, a checkpoint restore) are new array objects. ``PreparedWeights``
keeps only weak references to them, so an old version is never held alive here; the stale copy is
dropped before the new one is made, so at most one copy exists (one more copy of the layer weights,
and of an untied head or, on a CPU mesh, a tied one, in memory).
"""

from __future__ import annotations

import weakref
from typing import Callable

import jax
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import qwen3


class PreparedWeights:
    """The prepared copy of one model's weights, remade when the model's parameter arrays change.

    ``prepare``: model state -> ``qwen3.DecodeWeights`` (a jitted program). ``preparations`` counts the
    copies made."""

    def __init__(self, model: qwen3.Qwen3, prepare: Callable[..., qwen3.DecodeWeights]):
        self._model, self._prepare = model, prepare
        # (weak references to the model's parameter arrays, the weights prepared from them)
        self._held: tuple[list[weakref.ref], qwen3.DecodeWeights] | None = None
        self.preparations = 0

    @property
    def current(self) -> qwen3.DecodeWeights | None:
        """The copy held now (None: none made yet, or released)."""
        return self._held[1] if self._held is not None else None

    def get(self, params) -> qwen3.DecodeWeights:
        """The weights prepared from the model's current parameters (``params``: its state as the
        programs take it), made now only if the parameters changed since the last call."""
        leaves = jax.tree.leaves(nnx.state(self._model))
        if self._held is not None:
            refs, weights = self._held
            if len(refs) == len(leaves) and all(r() is a for r, a in zip(refs, leaves)):
                return weights
        self._held = None  # the stale copy goes before the new one is made
        weights = self._prepare(params)
        self._held = ([weakref.ref(a) for a in leaves], weights)
        self.preparations += 1
        return weights

    def release(self) -> None:
        """Drops the copy; the next ``get`` prepares it again."""
        self._held = None


def weight_shardings(
    model: qwen3.Qwen3, mesh: jax.sharding.Mesh | None, rules: shd.Rules | None, *, transpose_head: bool
) -> qwen3.DecodeWeights | None:
    """Where the prepared weights lie on a mesh (None without one): each layer's arrays as the sampling
    ``rules`` place the stacked ones (less the ``layers`` axis), a transposed head as ``(embed, vocab)``.
    Projections are never fused on a mesh (``Sampler``), so the layer keys are the model's own."""
    if mesh is None:
        return None
    layers = [
        {name: shd.named_sharding(mesh, axes, rules, shape) for name, (axes, shape) in one.items()}
        for one in model.layer_axes()
    ]
    head = None
    cfg = model.config
    if transpose_head and cfg.tie_word_embeddings:
        shape = (cfg.hidden_size, cfg.vocab_size)
        head = shd.named_sharding(mesh, ("embed", "vocab"), rules, shape)
    return qwen3.DecodeWeights(layers, head)
