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
Saving gathers one param at a time and replaces an earlier export in the folder in
one atomic step (see "writing" below).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import re
import tempfile
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from envace_jax import sharding as shd
from envace_jax.models import lora, qwen3

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

    hf_name: str  # "{i}" marks the layer index
    path: tuple[str, ...]
    layered: bool
    hf_shape: Callable[[qwen3.Qwen3Config], tuple[int, ...]]
    to_ours: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
    to_hf: Callable[[np.ndarray, qwen3.Qwen3Config], np.ndarray]
    untied_only: bool = False

    def name(self, layer: int | None = None) -> str:
        return self.hf_name.format(i=layer) if self.layered else self.hf_name


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


def active_mapping(cfg: qwen3.Qwen3Config) -> list[TensorMap]:
    return [m for m in MAPPING if not (m.untied_only and cfg.tie_word_embeddings)]


def expected_hf_tensors(cfg: qwen3.Qwen3Config) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor a checkpoint of ``cfg`` must hold."""
    out: dict[str, tuple[int, ...]] = {}
    for m in active_mapping(cfg):
        for i in range(cfg.num_layers) if m.layered else [None]:
            out[m.name(i)] = tuple(m.hf_shape(cfg))
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


def load_hf(
    path: str | os.PathLike,
    dtype: str | None = "float32",
    mesh: Mesh | None = None,
    rules: shd.Rules | None = None,
    *,
    compute_dtype: str | None = None,
    **config_overrides,
) -> qwen3.Qwen3:
    """Builds a Qwen3 from a Hugging Face directory, streaming tensors into their shardings.

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
        model = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
        for m in active_mapping(cfg):
            var = _variable(model, m.path)
            shape = tuple(var.get_value().shape)
            sharding = _target_sharding(var, shape, mesh, rules)
            if not m.layered:
                host = np.asarray(m.to_ours(reader.read(m.name()), cfg), dtype=pdt)
                var.set_value(_from_host(host, sharding))
                continue
            layers = (np.asarray(m.to_ours(reader.read(m.name(i)), cfg), dtype=pdt) for i in range(cfg.num_layers))
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


# ------------------------------------------------------------------------------------------
# writing
#
# An export replaces a folder's weights in one step. What a folder's weights are is ``weights_layout``:
# model.safetensors if present, else the index and the shards it lists. save_hf never overwrites a file
# that layout reads: every new file is written under a name nothing reads yet (through a hidden temporary
# renamed into place), and one atomic step then switches the layout: renaming the new model.safetensors
# into place, or, for a sharded export, renaming the new index into place and then removing the
# model.safetensors of an older single-file export. A process killed before that step leaves the old
# export as it was (plus unread files the next export removes); after it, the new weights are complete.
# Only then are the old weights removed: files the old layout read, shards named as HF names them, an
# index that a single file shadows, and our own temporaries. No other file in the folder is touched (a
# README, tokenizer files, a user's notes), and the folder itself stays (it may be a mount or symlink).
# config.json and generation_config.json are each replaced atomically right after the switch; for a
# re-export of the same architecture they do not change.

FILE_MODE, DIR_MODE = 0o644, 0o755  # an export is meant to be shared (served, uploaded), whatever the umask
_SHARD_NAME = re.compile(r"^model-\d{5}-of-\d{5}(-v\d+)?\.safetensors$")
_PARTIAL = re.compile(
    r"^\.(model[\w.-]*\.safetensors|model\.safetensors\.index\.json|config\.json|"
    r"generation_config\.json)\.\w+\.partial$"
)


def _make_dirs(path: str) -> None:
    """``os.makedirs``, with the folders it creates set to 0755 (an existing folder keeps its mode)."""
    created, p = [], os.path.abspath(path)
    while not os.path.exists(p):
        created.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    for d in created:
        os.chmod(d, DIR_MODE)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems cannot sync a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _write_atomic(out_dir: str, name: str, write: Callable[[str], None]) -> None:
    """Writes ``out_dir/name`` through a hidden temporary renamed into place, so a reader sees the old
    file or the whole new one. The file gets mode 0644 (the temporary is created 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=out_dir)
    os.close(fd)
    try:
        write(tmp)
        _fsync(tmp)  # the data is on disk before the name points at it
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, os.path.join(out_dir, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _write_json(out_dir: str, name: str, obj: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)

    _write_atomic(out_dir, name, write)


def _live_weights(out_dir: str) -> set[str]:
    """The file names (in ``out_dir``) that loading the folder reads now."""
    layout = weights_layout(out_dir)
    if layout is None:
        return set()
    if layout[0] == "single":
        return {SINGLE_FILE}
    try:
        listed = set(read_index(layout[1]).values())
    except WeightsError:  # an unreadable index reads no shard
        listed = set()
    # Only plain safetensors names inside the folder: an index is no licence to remove other files.
    return {INDEX_FILE} | {f for f in listed if os.path.basename(f) == f and f.endswith(".safetensors")}


def _shard_names(n: int, taken: set[str]) -> list[str]:
    """HF's shard names, or with a ``-v2`` (``-v3``...) tag when the folder's current export reads one of
    them (a re-export with the same shard count must not overwrite the weights it replaces)."""
    if n == 1:
        return [SINGLE_FILE]
    for version in itertools.count(1):
        tag = "" if version == 1 else f"-v{version}"
        names = [f"model-{k + 1:05d}-of-{n:05d}{tag}.safetensors" for k in range(n)]
        if not taken.intersection(names):
            return names
    raise AssertionError("unreachable")


def _remove_stale(out_dir: str, old: set[str], keep: set[str]) -> None:
    """Removes the previous export's weights and our leftover temporaries; nothing else."""
    for name in os.listdir(out_dir):
        if name in keep:
            continue
        if name in old or name in (SINGLE_FILE, INDEX_FILE) or _SHARD_NAME.match(name) or _PARTIAL.match(name):
            path = os.path.join(out_dir, name)
            if os.path.isfile(path) or os.path.islink(path):
                os.remove(path)


_ST_DTYPE = {np.dtype(np.float32): "F32", np.dtype(jnp.bfloat16): "BF16", np.dtype(np.float16): "F16"}


def parse_size(size: int | str) -> int:
    """``"5GB"`` -> 5e9 bytes (decimal, as transformers does); ``"2GiB"``, ``"500MB"``, ``"100KB"`` and ints too."""
    if isinstance(size, (int, np.integer)):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return int(size)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size {size!r} is not a size like '5GB' or '500MB'")
    unit = (m.group(2) or "B").upper()
    mult = {
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }[unit]
    return max(1, int(float(m.group(1)) * mult))


def _to_host(x: jax.Array) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _plan(cfg: qwen3.Qwen3Config, itemsize: int, max_bytes: int) -> list[list[tuple[TensorMap, int | None]]]:
    """Groups HF tensors (in our param order, so each param is gathered once) into shards."""
    shards: list[list[tuple[TensorMap, int | None]]] = [[]]
    size = 0
    for m in active_mapping(cfg):
        nbytes = int(np.prod(m.hf_shape(cfg))) * itemsize
        for i in range(cfg.num_layers) if m.layered else [None]:
            if shards[-1] and size + nbytes > max_bytes:
                shards.append([])
                size = 0
            shards[-1].append((m, i))
            size += nbytes
    return shards


def _token_ids(
    cfg: qwen3.Qwen3Config, eos_token_ids: Sequence[int] | int | None, pad_token_id: int | None
) -> qwen3.Qwen3Config:
    """``cfg`` with the given end-of-sequence and padding ids (each checked against the vocabulary)."""
    eos = (eos_token_ids,) if isinstance(eos_token_ids, (int, np.integer)) else tuple(eos_token_ids or ())
    if eos_token_ids is not None and not eos:
        raise ValueError("eos_token_ids is empty; pass None to keep the model config's")
    bad = [int(t) for t in (*eos, *(() if pad_token_id is None else (pad_token_id,))) if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"token id(s) {bad} are outside the model's vocabulary of {cfg.vocab_size}")
    kw: dict[str, Any] = {}
    if eos:
        kw["eos_token_id"] = int(eos[0]) if len(eos) == 1 else tuple(int(t) for t in eos)
    if pad_token_id is not None:
        kw["pad_token_id"] = int(pad_token_id)
    return cfg.replace(**kw)


def generation_config(cfg: qwen3.Qwen3Config) -> dict[str, Any]:
    """``generation_config.json``: the ids transformers' ``generate`` stops at and pads with."""
    eos = list(cfg.eos_token_ids)
    gen = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "pad_token_id": cfg.pad_token_id,
    }
    return {k: v for k, v in gen.items() if v is not None}


def save_hf(
    model: qwen3.Qwen3,
    out_dir: str | os.PathLike,
    max_shard_size: int | str = "5GB",
    *,
    eos_token_ids: Sequence[int] | int | None = None,
    pad_token_id: int | None = None,
) -> list[str]:
    """Writes config.json, generation_config.json and safetensors shards (plus an index if >1).

    Loadable by ``transformers.AutoModelForCausalLM.from_pretrained``. Tensors are
    written in the params' dtype. In a multi-process run every process must call
    this (params are gathered collectively); only process 0 writes files.

    An existing export in ``out_dir`` is replaced in one atomic step (see the comment at "writing"):
    a run killed part-way leaves the previous export loadable; afterwards none of its weights files
    remain, and other files in the folder are kept. Files get mode 0644, folders it creates 0755. One
    export into a folder at a time.

    Args:
      eos_token_ids, pad_token_id: the tokenizer's stop and padding ids (e.g. ``codec.stop_token_ids``,
        ``tokenizer.pad_token_id``), written into config.json and generation_config.json so that
        transformers' ``generate`` stops where our sampler does; default: the model config's.
    Returns the written safetensors file names (on processes other than 0: the names of a fresh folder).
    """
    from safetensors.numpy import save_file

    if model.config.lora_scale:  # LoRA adapters: the export is the merged model (models/lora.py); ours keeps them
        model = lora.merge_into_base(nnx.clone(model))
    cfg: qwen3.Qwen3Config = _token_ids(model.config, eos_token_ids, pad_token_id)
    out_dir = os.fspath(out_dir)
    writer = jax.process_index() == 0
    old: set[str] = set()
    if writer:
        _make_dirs(out_dir)
        old = _live_weights(out_dir)
    pdt = np.dtype(qwen3.as_dtype(cfg.param_dtype))
    plan = _plan(cfg, pdt.itemsize, parse_size(max_shard_size))
    n = len(plan)
    names = _shard_names(n, old)
    weight_map: dict[str, str] = {}
    total = 0
    cached: tuple[tuple[str, ...], np.ndarray] | None = None
    for fname, entries in zip(names, plan):
        tensors: dict[str, np.ndarray] = {}
        for m, i in entries:
            if cached is None or cached[0] != m.path:
                cached = None  # drop the previous param before gathering the next
                cached = (m.path, _to_host(_variable(model, m.path)[...]))
            ours = cached[1] if i is None else cached[1][i]
            hf = np.ascontiguousarray(m.to_hf(ours, cfg).astype(pdt))
            if hf.shape != tuple(m.hf_shape(cfg)):
                raise ValueError(f"tensor {m.name(i)}: produced shape {hf.shape}, expected {m.hf_shape(cfg)}")
            tensors[m.name(i)] = hf
            weight_map[m.name(i)] = fname
            total += hf.nbytes
        if writer:  # a single file's rename is the switch; a shard's name is one nothing reads yet
            _write_atomic(out_dir, fname, lambda tmp, shard=tensors: save_file(shard, tmp, metadata={"format": "pt"}))
        del tensors
    if not writer:
        return names
    if n > 1:
        _write_json(out_dir, INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
        if os.path.lexists(os.path.join(out_dir, SINGLE_FILE)):
            os.remove(os.path.join(out_dir, SINGLE_FILE))  # the switch: the single file no longer shadows the index
    _fsync(out_dir)
    _write_json(out_dir, "config.json", cfg.to_hf())
    _write_json(out_dir, "generation_config.json", generation_config(cfg))
    _remove_stale(out_dir, old, keep=set(names) | ({INDEX_FILE} if n > 1 else set()))
    _fsync(out_dir)
    return names


def iter_hf_tensors(model: qwen3.Qwen3) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(hf_name, array)`` in HF layout, one param gathered at a time."""
    cfg = model.config
    for m in active_mapping(cfg):
        host = _to_host(_variable(model, m.path)[...])
        for i in range(cfg.num_layers) if m.layered else [None]:
            yield m.name(i), m.to_hf(host if i is None else host[i], cfg)
