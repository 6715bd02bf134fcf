"""Hugging Face checkpoints <-> Qwen3 NNX: the one place that knows the HF names.

Two tables describe the HF format in both directions: ``MAPPING`` every tensor (the HF name template,
our parameter path, whether it is stacked over layers, the HF shape, and a pair of layout transforms),
``hf_config.CONFIG_KEYS`` every ``config.json`` field (read and written by ``Qwen3Config.from_hf`` / ``to_hf``).

Loading streams one HF tensor at a time: each tensor is read (one decoder layer
at a time for stacked params), transformed on the host, and placed directly in
its target sharding with ``jax.make_array_from_callback``; stacked params are
built by donating a sharded buffer and writing one layer slice per step, so the
host never holds more than one layer's tensor and the devices never hold two
copies of a stacked param. Every tensor's name, shape and dtype is checked before
any is read; a folder that does not match its config raises ``WeightsError``.
Saving (``hf_save``, re-exported here) gathers one param at a time and replaces an earlier export in the
folder in one atomic step.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from envace_jax import sharding as shd
from envace_jax.models import qwen3
from envace_jax.models.hf_layout import (  # noqa: F401  (hf_io's public names)
    WeightsError,
    WeightsFileMissing,
    read_index,
    weights_layout,
    _IGNORED,
    INDEX_FILE,
    MAPPING,
    SINGLE_FILE,
    TensorMap,
    _variable,
    active_mapping,
    expected_hf_tensors,
)
from envace_jax.models.hf_save import generation_config, iter_hf_tensors, parse_size, save_hf  # noqa: F401


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors dtype tags we convert from


def _listing(names: list[str], limit: int = 5) -> str:
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


class _Reader:
    """Opens each safetensors file of a folder once and checks every tensor's presence, shape and dtype
    against the config before any data is read; then reads one tensor at a time."""

    def __init__(self, path: str, stack: contextlib.ExitStack):
        self.stack, self.handles = stack, {}
        layout = weights_layout(path)
        if layout is None:
            raise WeightsFileMissing(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
        kind, self.source = layout
        if kind == "single":
            self.files = {name: self.source for name in self._open(self.source, path).keys()}
        else:
            self.files = {name: os.path.join(path, f) for name, f in read_index(self.source).items()}

    def _open(self, file: str, needed_by: str):
        from safetensors import SafetensorError, safe_open

        if file not in self.handles:
            if not os.path.isfile(file):
                raise WeightsFileMissing(f"{needed_by}: weights file {file} does not exist")
            try:
                self.handles[file] = self.stack.enter_context(safe_open(file, framework="numpy"))
            except SafetensorError as e:  # a cut-off file: "incomplete metadata, file not fully covered"
                raise WeightsError(f"{file}: not a readable safetensors file; truncated or corrupt ({e})") from None
        return self.handles[file]

    def _handle(self, name: str):
        file = self.files[name]
        h = self._open(file, f"tensor {name} (listed in {self.source})")
        if name not in h.keys():
            raise WeightsError(f"{self.source} lists tensor {name} in {file}, which does not hold it")
        return h

    def check(self, cfg: qwen3.Qwen3Config) -> None:
        """Every tensor ``cfg`` needs is present with its shape and a float dtype; nothing else is there."""
        expected = expected_hf_tensors(cfg)
        missing = sorted(set(expected) - set(self.files))
        if missing:
            raise WeightsError(f"{self.source}: missing tensor(s) {_listing(missing)}")
        # A tied checkpoint may still carry lm_head.weight (transformers ignores it there; so do we).
        allowed = set(expected) | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
        unexpected = sorted(n for n in set(self.files) - allowed if not _IGNORED.match(n))
        if unexpected:
            raise WeightsError(f"{self.source}: unexpected tensor(s) {_listing(unexpected)}")
        wrong = []
        for name, shape in expected.items():
            info = self._handle(name).get_slice(name)
            got, dtype = tuple(info.get_shape()), info.get_dtype()
            if got != shape:
                wrong.append(f"{self.files[name]}: tensor {name} has shape {got}, expected {shape} from the config")
            elif dtype not in _FLOAT_DTYPES:
                wrong.append(
                    f"{self.files[name]}: tensor {name} has dtype {dtype}, expected one of {list(_FLOAT_DTYPES)}"
                )
        if wrong:
            more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
            raise WeightsError("; ".join(wrong[:3]) + more)

    def read(self, name: str) -> np.ndarray:
        from safetensors import SafetensorError

        try:
            return self._handle(name).get_tensor(name)
        except SafetensorError as e:
            raise WeightsError(f"{self.files[name]}: tensor {name} cannot be read ({e})") from None


def _target_sharding(var: nnx.Variable, shape, mesh: Mesh | None, rules: shd.Rules):
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    axes = getattr(var, "logical_axes", None)
    if axes is None:
        return shd.replicated(mesh)
    return shd.named_sharding(mesh, axes, rules, shape)


def _from_host(host: np.ndarray, sharding) -> jax.Array:
    """Places a host array into ``sharding``; each device receives only its own slice."""
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _layer_sharding(sharding):
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
    return sharding


@functools.lru_cache(maxsize=64)
def _stacked_builder(shape: tuple[int, ...], dtype: Any, sharding):
    """(zeros(), write(buf, layer, i)) jitted into ``sharding``; ``buf`` is donated so the
    stacked param is written in place. Cached so params of equal shape compile once."""
    zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)

    def _write(buf, x, i):
        """buf ``[L, ...]``, x ``[...]`` (one layer), i int32 scalar -> buf with layer i replaced."""
        return jax.lax.dynamic_update_index_in_dim(buf, x, i, 0)

    write = jax.jit(_write, donate_argnums=0, out_shardings=sharding)
    return zeros, write


def _layer_slices(reader: "_Reader", m: TensorMap, cfg: qwen3.Qwen3Config, pdt):
    """One host array per layer of a stacked param, in its order (a per-expert family: that layer's experts
    read one at a time into one ``[E, ...]`` array)."""
    for i in m.layers(cfg):
        if not m.per_expert:
            yield np.asarray(m.to_ours(reader.read(m.name(i)), cfg), dtype=pdt)
            continue
        first = np.asarray(m.to_ours(reader.read(m.name(i, 0)), cfg), dtype=pdt)
        layer = np.empty((cfg.num_experts, *first.shape), pdt)
        layer[0] = first
        for e in range(1, cfg.num_experts):
            layer[e] = m.to_ours(reader.read(m.name(i, e)), cfg)
        yield layer


def load_hf(
    path: str | os.PathLike,
    dtype: str | None = "float32",
    mesh: Mesh | None = None,
    rules: shd.Rules | None = None,
    *,
    compute_dtype: str | None = None,
    **config_overrides,
) -> qwen3.Qwen3:
    """Builds a Qwen3 (or, from a ``qwen3_moe`` config.json, a ``qwen3_moe.Qwen3Moe``) from a Hugging Face
    directory, streaming tensors into their shardings.

    Args:
      path: a directory with config.json and model.safetensors (or an index + shards).
      dtype: parameter dtype (and compute dtype unless ``compute_dtype`` is given);
        ``None`` keeps the checkpoint's dtype.
      mesh: place params with ``qwen3.param_shardings`` under ``rules`` (default
        ``sharding.TRAIN_RULES``); without a mesh everything lands on the first device.
      config_overrides: extra Qwen3Config fields (e.g. ``remat_policy``, ``scan_layers``).

    Raises ``WeightsError`` (a ``ValueError``) naming the file or tensor when a weights file is truncated
    or corrupt, or a tensor is missing, unexpected, or of another shape than the config gives.
    """
    path = os.fspath(path)
    over: dict[str, Any] = dict(config_overrides)
    if dtype is not None:
        over.setdefault("param_dtype", dtype)
        over.setdefault("dtype", compute_dtype or dtype)
    elif compute_dtype is not None:
        over.setdefault("dtype", compute_dtype)
    cfg = qwen3.Qwen3Config.from_hf(path, **over)
    rules = shd.TRAIN_RULES if rules is None else rules
    pdt = qwen3.as_dtype(cfg.param_dtype)
    with contextlib.ExitStack() as stack:
        reader = _Reader(path, stack)
        reader.check(cfg)  # every name, shape and dtype, before any device memory is touched
        model = nnx.eval_shape(lambda: qwen3.model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
        for m in active_mapping(cfg):
            var = _variable(model, m.path)
            shape = tuple(var.get_value().shape)
            sharding = _target_sharding(var, shape, mesh, rules)
            if not m.layered:
                host = np.asarray(m.to_ours(reader.read(m.name()), cfg), dtype=pdt)
                var.set_value(_from_host(host, sharding))
                continue
            layers = _layer_slices(reader, m, cfg, pdt)
            if mesh is None:
                # One device: the stacked host buffer *is* the target, so no compiled writes needed.
                host = np.empty(shape, pdt)
                for i, layer in enumerate(layers):
                    host[i] = layer
                var.set_value(jax.device_put(host, sharding))
                del host
                continue
            zeros, write = _stacked_builder(shape, np.dtype(pdt), sharding)
            buf = zeros()
            layer_sh = _layer_sharding(sharding)
            for i, layer in enumerate(layers):
                buf = write(buf, _from_host(layer, layer_sh), jnp.int32(i))
            var.set_value(buf)
    if mesh is not None:
        model.set_sharding(mesh, rules)
    return model
