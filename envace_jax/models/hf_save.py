"""Writing a Qwen3 as a Hugging Face checkpoint (``save_hf``, re-exported by ``hf_io``): one parameter gathered at a
time, an earlier export in the folder replaced in one atomic step."""

from __future__ import annotations

import contextlib
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

from envace_jax.models import lora, qwen3
from envace_jax.models.hf_layout import (
    INDEX_FILE,
    SINGLE_FILE,
    TensorMap,
    WeightsError,
    _variable,
    active_mapping,
    read_index,
    weights_layout,
)

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


def _plan(cfg: qwen3.Qwen3Config, itemsize: int, max_bytes: int) -> list[list[tuple[TensorMap, str, tuple[int, ...]]]]:
    """Groups HF tensors (in our param order, so each param is gathered once) into shards: (family, HF name,
    index into our param) each."""
    shards: list[list[tuple[TensorMap, str, tuple[int, ...]]]] = [[]]
    size = 0
    for m in active_mapping(cfg):
        nbytes = int(np.prod(m.hf_shape(cfg))) * itemsize
        for name, index in m.entries(cfg):
            if shards[-1] and size + nbytes > max_bytes:
                shards.append([])
                size = 0
            shards[-1].append((m, name, index))
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
        for m, name, index in entries:
            if cached is None or cached[0] != m.path:
                cached = None  # drop the previous param before gathering the next
                cached = (m.path, _to_host(_variable(model, m.path)[...]))
            hf = np.ascontiguousarray(m.to_hf(cached[1][index], cfg).astype(pdt))
            if hf.shape != tuple(m.hf_shape(cfg)):
                raise ValueError(f"tensor {name}: produced shape {hf.shape}, expected {m.hf_shape(cfg)}")
            tensors[name] = hf
            weight_map[name] = fname
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
        for name, index in m.entries(cfg):
            yield name, m.to_hf(host[index], cfg)
