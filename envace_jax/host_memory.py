"""Keep freed host memory inside the process: faster CPU steps, the same numbers.

XLA's CPU runtime allocates the temporaries of each program run as one block and frees it when the run
ends. glibc serves a block above its mmap threshold (32 MiB at most by default) straight from the kernel
and unmaps it again on free, so every step of a CPU training loop faults fresh zero-filled pages back in:
the 8 x 512 train step of ``benchmarks/train_step.py`` (41.6M parameters) takes a 2.9 GB block, about
0.8 million page faults and 2-7 s of kernel time per step; the demo's SFT step about 0.19 s of kernel
time in 0.5 s. PyTorch's CPU tensors go through the same glibc calls and pay the same.

Three glibc settings keep that memory for the next step: one malloc arena (allocations made on XLA's
worker threads otherwise come from per-thread heaps of at most 64 MiB, which hand large blocks to mmap
whatever the threshold), and mmap and trim thresholds above any block a step takes. glibc reads them
only when a process starts (``mallopt`` takes an ``int``, too small for a 2.9 GB block), so
``retain_freed_memory`` re-executes the interpreter with them set. The price is that the process keeps
its peak heap until it exits. Allocation does not change any computed value: runs stay bit-identical.

Used by the CPU demo's entry points (``launch/demo.py``, ``launch/pretrain.py``) and, on request, by the
benchmarks (``--retain-freed-memory``). Set ``ENVACE_GLIBC_HEAP=default`` to keep glibc's defaults.
"""

from __future__ import annotations

import os
import platform
import sys

# 1 TiB: above any block a step on one host takes, and still a size_t glibc accepts.
_NEVER = str(1 << 40)
RETAIN_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": _NEVER, "MALLOC_TRIM_THRESHOLD_": _NEVER}
# Set in the re-executed process, so it never re-executes again (also when the user set some of
# RETAIN_ENV's variables to values of their own, which are kept).
_MARK = "ENVACE_GLIBC_HEAP"


def applies() -> bool:
    """Whether the settings mean anything here: Linux with glibc."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def retaining() -> bool:
    """Whether this process started with every RETAIN_ENV variable set (to any value)."""
    return all(k in os.environ for k in RETAIN_ENV)


def retain_freed_memory() -> None:
    """Re-executes the running script (``sys.orig_argv``: interpreter options and arguments as given)
    with RETAIN_ENV added to its environment, and returns without doing anything when that is already
    so, when ``ENVACE_GLIBC_HEAP`` is set (``default``: the user opts out; ``retained``: this is the
    re-executed process) or off glibc. Call it first thing in a script's main, before any work."""
    if _MARK in os.environ or retaining() or not applies():
        return
    env = {**RETAIN_ENV, **os.environ, _MARK: "retained"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def describe() -> str:
    """One line for a benchmark's or run's header: which heap policy this process runs under."""
    if retaining():
        return "glibc heap: freed memory retained (" + ", ".join(f"{k}={os.environ[k]}" for k in RETAIN_ENV) + ")"
    return "glibc heap: defaults (large freed blocks return to the kernel)"
