"""Keeping a long CPU run under the kernel's limit on memory mappings (``vm.max_map_count``).

XLA's CPU backend compiles every program with LLVM's JIT, whose in-process memory mapper gives each compiled
kernel its own code, read-only and data pages, with different permissions: several mappings per kernel that
Linux cannot merge (llvm/llvm-project#63236). A run that compiles many shapes reaches Linux's default limit of
65,530 mappings per process, and the next compile fails with "LLVM compilation error: Cannot allocate memory"
and a segmentation fault while most of the RAM is free. The demo on the wire world with rehearsal memories in
its RL prompts (prompts of many lengths, rows up to 768 tokens) did so at RL step 125 of 192 (2026-12-05;
about 11,000 mappings during its first RL steps, most of them anonymous code and read-only pages).

``release_if_near_limit`` drops every compiled program (``jax.clear_caches``) once the process holds more than
``fraction`` of the limit, which returns their mappings; a program still in use is compiled again at its next
call (read back from the persistent compilation cache where one is set, as the demo sets). It reads
``/proc/self/maps`` at most once per ``interval_s``, so callers may call it every step. Elsewhere than Linux it
does nothing.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Callable

logger = logging.getLogger(__name__)

MAPS = "/proc/self/maps"
LIMIT = "/proc/sys/vm/max_map_count"
_last_check = [float("-inf")]


def map_count() -> int | None:
    """The mappings this process holds (None where ``/proc`` has no maps file)."""
    try:
        with open(MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def map_limit() -> int | None:
    """The kernel's per-process limit (None where it cannot be read)."""
    try:
        with open(LIMIT) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def release_if_near_limit(
    fraction: float = 0.75, interval_s: float = 10.0, log: Callable[[str], None] = logger.warning
) -> bool:
    """Drops every compiled program when the process holds more than ``fraction`` of the mapping limit; checks
    at most once per ``interval_s`` seconds. Returns whether it dropped them."""
    now = time.monotonic()
    if now - _last_check[0] < interval_s:
        return False
    _last_check[0] = now
    count, limit = map_count(), map_limit()
    if count is None or limit is None or count <= fraction * limit:
        return False
    import jax

    jax.clear_caches()
    gc.collect()
    log(
        f"{count:,} memory mappings of the limit of {limit:,} (vm.max_map_count), most of them compiled XLA programs: "
        f"dropped the compiled programs ({map_count():,} mappings now); those in use compile again at their next "
        "call. Raising the limit (sysctl -w vm.max_map_count=262144) avoids the recompiles."
    )
    return True


__all__ = ["map_count", "map_limit", "release_if_near_limit"]
