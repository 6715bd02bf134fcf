"""What every GRPO worker of ``benchmarks/peers.py`` shares: reading the spec, the reward, the clock, and the
one result line. Plain Python and numpy only, since it runs in three different virtual environments
(ours, Tunix's and TRL's); the worker scripts import it as a sibling module (their folder is on
``sys.path`` because Python puts a script's own folder there).

A worker runs ``warmup + iters`` GRPO iterations of one framework on the spec's model and prompts, timing
each iteration's wall seconds and its sampling part, and prints one line ``PEER_RESULT {json}`` on stdout.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any, Sequence

RESULT_PREFIX = "PEER_RESULT "
SPEC_KEYS = (
    "framework",
    "shape",
    "model_dir",
    "model",
    "prompts",
    "group_size",
    "new_tokens",
    "temperature",
    "lr",
    "adamw",
    "clip_eps",
    "warmup",
    "iters",
    "seed",
    "threads",
)


def read_spec(path: str) -> dict[str, Any]:
    """The JSON spec the driver wrote, checked for the keys every worker reads."""
    with open(path) as f:
        spec = json.load(f)
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing:
        raise ValueError(f"peer spec {path} lacks {missing}")
    return spec


def limit_threads(threads: int) -> None:
    """Intra-op threads of the BLAS/OpenMP libraries, set before numpy, torch or jax load them. XLA's CPU
    client ignores those variables and runs its programs on one thread per core; ``threads=1`` also turns
    that off (``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    if threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


def reward(completion_ids: Sequence[int]) -> float:
    """The benchmark's reward: the share of even token ids in a completion. Deterministic, cheap, the same
    in every framework, and spread enough over random completions that GRPO advantages are not all zero."""
    ids = list(completion_ids)
    if not ids:
        return 0.0
    return sum(1 for t in ids if int(t) % 2 == 0) / len(ids)


def ids_from_text(text: str) -> list[int]:
    """Token ids back from the space-joined text the id tokenizers of the peers produce."""
    return [int(t) for t in text.split()]


def text_from_ids(ids: Sequence[int]) -> str:
    return " ".join(str(int(t)) for t in ids)


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / float(1 << 20)


class IterationClock:
    """Wall and CPU seconds of whole iterations and of the sampling inside them.

    ``begin``/``end`` bracket one iteration; ``sampling`` adds the seconds of one sampling call to the
    current iteration (a framework may sample in several calls)."""

    def __init__(self):
        self.iter_s: list[float] = []
        self.sample_s: list[float] = []
        self.cpu_s: list[float] = []
        self._t0: float | None = None
        self._c0 = 0.0
        self._sample = 0.0

    def begin(self) -> None:
        self._t0, self._c0, self._sample = time.perf_counter(), time.process_time(), 0.0

    def sampling(self, seconds: float) -> None:
        self._sample += seconds

    def end(self) -> None:
        if self._t0 is None:
            raise RuntimeError("IterationClock.end() without begin()")
        self.iter_s.append(time.perf_counter() - self._t0)
        self.cpu_s.append(time.process_time() - self._c0)
        self.sample_s.append(self._sample)
        self._t0 = None


def result(spec: dict[str, Any], clock: IterationClock, rewards: list[float], api: str, versions: dict) -> dict:
    """The result record of a worker: timed iterations after the warm-up ones."""
    w = int(spec["warmup"])
    if len(clock.iter_s) != w + int(spec["iters"]):
        raise RuntimeError(f"{spec['framework']}: ran {len(clock.iter_s)} iterations, expected {w} + {spec['iters']}")
    return {
        "framework": spec["framework"],
        "shape": spec["shape"],
        "rows": len(spec["prompts"]) * int(spec["group_size"]),
        "prompt_tokens": len(spec["prompts"][0]),
        "new_tokens": int(spec["new_tokens"]),
        "warmup_s": clock.iter_s[:w],
        "iter_s": clock.iter_s[w:],
        "sample_s": clock.sample_s[w:],
        "cpu_s": clock.cpu_s[w:],
        "mean_reward": rewards,
        "peak_rss_gib": peak_rss_gib(),
        "api": api,
        "versions": versions,
    }


def emit(record: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(record), flush=True)


def spec_path_from_argv() -> str:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} SPEC.json")
    return sys.argv[1]
