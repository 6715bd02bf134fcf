"""The weights rollouts sample from when they are not the trainer's own: copies in the compute dtype, on the
chips that sample, refreshed from the trained parameters.

* Several processes (hosts): training parameters are global arrays over every host's chips, but each host
  samples ITS OWN prompts, so it samples from a full copy on its own chips (``rollout_copy``,
  ``rollout_mesh``).
* The asynchronous pipeline (``rl.async_pipeline``): rollouts of later steps sample from older weights while
  the trainer moves on, so each rollout in flight has its own copy (``weights_copy``, ``load_weights``).
* The disaggregated layout (``mesh.rollout_chips_per_host``): the copies live on chips kept for rollouts.

The copies hold the compute dtype (``rollout_config``): every layer casts its weights to it anyway.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import lora, qwen3


def rollout_mesh(cfg: qwen3.Qwen3Config, devices: Sequence[Any]) -> Any:
    """The mesh one process samples on: its own chips, split over the ``tensor`` axis.

    A decode step reads every weight and the whole live KV cache once per token, so the host's
    chips should each hold a share of both. The sampling rules (``sharding.SAMPLE_RULES``) replicate
    weights over ``fsdp`` (to avoid an all-gather per layer per token), so a host mesh on ``fsdp``
    put a whole copy of the weights on every chip (8B in float32: 33 GB per chip, read at every
    token). On ``tensor`` the weights split by heads, MLP columns and vocabulary and the cache by
    KV heads. The tensor size is the largest divisor of the chip count that divides the KV heads;
    the rest of the chips (if any) go to ``fsdp``."""
    n = len(devices)
    tensor = max(t for t in range(1, n + 1) if n % t == 0 and cfg.num_kv_heads % t == 0)
    return shd.make_mesh(1, n // tensor, tensor, devices=devices)


def rollout_config(cfg: qwen3.Qwen3Config) -> qwen3.Qwen3Config:
    """The rollout copy's architecture: parameters stored in the compute dtype. Every layer casts its
    weights to the compute dtype anyway, so a bfloat16 copy of float32 master weights computes exactly
    the same numbers, at half the memory and half the bytes read per decode step. LoRA adapters are folded into
    the copy's weights (``lora.merged_state``): a copy is a plain model, decoding at no adapter cost."""
    return cfg.replace(param_dtype=cfg.dtype, lora_scale=0.0)


def rollout_copy(model: qwen3.Qwen3, local_mesh) -> tuple[qwen3.Qwen3, Callable[[], None]]:
    """(model the sampler reads, refresh function) for a multi-process run.

    Training parameters are global arrays sharded over every process's devices, but each process
    samples ITS OWN prompts, which a program over the global mesh cannot do (all processes would
    have to run the same batch). So each process samples from a full copy of the weights on its own
    devices (``rollout_mesh``, in the compute dtype: ``rollout_config``), refreshed from the global
    parameters after every update (a collective).
    """
    local = weights_copy(model, local_mesh)
    return local, refresher(local, model)


def _fresh(x: jax.Array, dtype) -> jax.Array:
    """``x`` in ``dtype``, always a new buffer: the trainer donates its parameters to the next update, so a
    copy that aliased them would be deleted under the sampler."""
    return x.astype(dtype) if x.dtype != dtype else jnp.copy(x)


def snapshot(model: qwen3.Qwen3) -> Any:
    """A copy of ``model``'s parameters in its compute dtype, laid out as they are (with several processes, global
    arrays sharded like the trained ones: a checkpoint can save them, which a process's own copy is not)."""
    dtype = jnp.dtype(qwen3.as_dtype(model.config.dtype))
    return jax.tree.map(lambda a: _fresh(a, dtype), lora.merged_state(model))


def load_weights(copy: qwen3.Qwen3, source: Any) -> None:
    """Puts ``source``'s parameters (a model, or a ``snapshot``) into ``copy`` (cast to its dtypes, placed as its
    arrays are). With several processes a collective: every process calls it at the same point."""
    cur = nnx.to_pure_dict(nnx.state(copy, nnx.Param))
    src = lora.merged_state(source) if isinstance(source, nnx.Module) else source
    if isinstance(src, nnx.State):
        src = nnx.to_pure_dict(src)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        host = multihost_utils.process_allgather(src, tiled=True)
        new = jax.tree.map(lambda h, c: jax.device_put(np.asarray(h).astype(c.dtype), c.sharding), host, cur)
    else:
        new = jax.tree.map(lambda a, c: jax.device_put(_fresh(a, c.dtype), c.sharding), src, cur)
    state = nnx.state(copy, nnx.Param)
    nnx.replace_by_pure_dict(state, new)
    nnx.update(copy, state)


def weights_copy(model: qwen3.Qwen3, mesh=None) -> qwen3.Qwen3:
    """A ``rollout_config`` model holding a copy of ``model``'s current parameters: on ``mesh`` (under the
    training rules, as ``rollout_copy`` lays its copy out), else where ``model`` is (its mesh and rules).
    With several processes ``mesh`` must be this process's (``rollout_mesh``); a collective."""
    cfg = rollout_config(model.config)
    if mesh is None and jax.process_count() > 1:
        raise ValueError("weights_copy: with several processes give this process's rollout mesh")
    if mesh is not None and (mesh is not model.mesh or jax.process_count() > 1):
        copy = qwen3.init_model(cfg, seed=0, mesh=mesh)
    else:
        abstract = nnx.eval_shape(lambda: qwen3.model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
        abstract.set_sharding(model.mesh, model.rules)
        src = lora.merged_state(model, ...)
        state = nnx.state(abstract)
        nnx.replace_by_pure_dict(state, jax.tree.map(lambda a, t: _fresh(a, t.dtype), src, nnx.to_pure_dict(state)))
        return nnx.merge(nnx.graphdef(abstract), state)
    load_weights(copy, model)
    return copy


def refresher(copy: qwen3.Qwen3, source: qwen3.Qwen3) -> Callable[[], None]:
    return lambda: load_weights(copy, source)


def split_devices(devices: Sequence[Any], rollout_chips_per_host: int) -> tuple[list[Any], list[Any]]:
    """(training devices, this process's rollout devices) of the disaggregated layout: the last
    ``rollout_chips_per_host`` chips of every host sample, the rest of the slice trains. ``devices``: all of
    them (``jax.devices()``), grouped into hosts by ``process_index``."""
    c = int(rollout_chips_per_host)
    by: dict[int, list[Any]] = {}
    for d in devices:
        by.setdefault(int(getattr(d, "process_index", 0)), []).append(d)
    hosts = [sorted(by[k], key=lambda d: d.id) for k in sorted(by)]
    if any(len(h) <= c for h in hosts):
        raise ValueError(
            f"mesh.rollout_chips_per_host={c} leaves no chip to train on a host of "
            f"{min(len(h) for h in hosts)} chips: it must be smaller than the chips per host"
        )
    train = [d for h in hosts for d in h[: len(h) - c]]
    me = jax.process_index()
    local = [d for d in hosts[sorted(by).index(me)][len(hosts[0]) - c :]] if me in by else []
    return train, local
