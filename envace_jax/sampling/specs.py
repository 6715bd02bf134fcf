"""A sampler's compiled programs at one shape bucket with abstract arguments, for lowering ahead of time
(``envace_jax.aot``): no weights are read and nothing is allocated. ``sampler`` is a ``sampling.Sampler``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import qwen3


def program_specs(sampler: Any, batch: int, chunk: int, window: int, budget: int, stop_width: int = 4):
    """The two compiled programs at one shape bucket, with abstract arguments (``envace_jax.aot``).

    ``"prefill"``: ``batch`` rows gathered from an earlier ``window``-slot cache (as ``continue_``
    does) and a ``chunk``-token chunk written into it; ``"decode"``: the on-device loop of
    ``budget`` steps over that cache; ``"decode_setup"``: decode's work before its loop, for
    costing (see ``SamplerPrograms.decode_setup``). With ``prepare_weights`` both read the weights
    prepared once per weights version (an argument, not costed per call). Returns ``{name: (jitted
    fn, args, static kwargs)}``; the arguments are ShapeDtypeStructs laid out as ``_run`` places them
    (parameters in ``rules``).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(nnx.state(sampler.model))
    targets = [None] * len(flat) if sampler._param_shardings is None else jax.tree.leaves(sampler._param_shardings)
    # as _params places them: with prepared weights the stacked layer arrays stay where they are
    targets = [
        getattr(x, "sharding", None) if sampler._read_in_place(p) and t is not None else t
        for (p, x), t in zip(flat, targets)
    ]
    params = treedef.unflatten([jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s) for (_, x), s in zip(flat, targets)])
    weights = None
    if sampler.prepare_weights:
        weights = jax.eval_shape(sampler._programs._prepare_weights_impl, params)
        placed = sampler._programs.weight_shardings
        if placed is not None:
            weights = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), weights, placed)

    def arg(shape, dtype, logical):
        sharding = None if sampler.mesh is None else shd.named_sharding(sampler.mesh, logical, sampler.rules, shape)
        return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)

    k_shape, v_shape = qwen3.KVCache.shapes(sampler.cfg, batch, window)
    dt = sampler.cache_dtype
    # Per-layer buffers, as _starting_cache allocates them.
    L = sampler.cfg.num_layers
    k = tuple(arg(k_shape, dt, qwen3.CACHE_K_AXES) for _ in range(L))
    v = tuple(arg(v_shape, dt, qwen3.CACHE_V_AXES) for _ in range(L))
    row = lambda dtype: arg((batch,), dtype, ("batch",))
    prefill = (
        params,
        weights,
        k,
        v,
        row(np.int32),
        row(np.int32),
        arg((batch, chunk), np.int32, ("batch", None)),
        row(np.int32),
    )
    decode = (
        params,
        weights,
        k,
        v,
        row(np.int32),
        arg((batch, sampler.cfg.vocab_size), np.float32, ("batch", None)),
        arg((batch, 2), np.uint32, ("batch", None)),
        row(np.int32),
        row(np.float32),
        row(np.float32),
        row(np.int32),
        row(np.int32),
        row(np.int32),
        arg((batch, stop_width), np.int32, ("batch", None)),
        arg((), np.int32, ()),
    )
    return {
        "prefill": (sampler._prefill, prefill, {"size": window, "gather": True}),
        "decode": (sampler._decode, decode, {"budget": budget}),
        # with prepared weights the decode does no setup of its own: an empty program costs nothing
        "decode_setup": (jax.jit(sampler._programs.decode_setup if weights is None else lambda p: ()), (params,), {}),
    }
