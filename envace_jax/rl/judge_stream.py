"""Judging that streams: a user turn that ends goes to the judge at once, while the other episodes generate.

The synchronous engine judges every turn that ended in a micro-step before the next sampler call, so the
batch waits for the slowest verdict of each step (the reference's judge is a served Qwen3-30B-A3B that answers
over HTTP in seconds). ``JudgeStream`` sends each micro-step's ended turns to the judge as one call on a pool
of ``workers`` threads (an ``HttpJudge`` also bounds its requests in flight, across callers) and the engine
moves on: the episodes waiting for a verdict sit out, the others generate.

When a verdict takes effect is fixed by the schedule, not by when it arrives: the verdicts of turns submitted
at tick ``t`` (the engine's loop count) are applied at tick ``t + 1``, after that tick's sampler call, waiting
for them there if they are not back yet. Which episodes share a sampler call, and so every token, log-prob and
seed, is then the same whatever the judge's latency, and a run repeats bit for bit (``rl.async_pipeline``
needs that to resume an interrupted run exactly). The price: an episode whose verdict came back early waits for
the end of the next call, at most one sampler call per judged turn.

Host-side only; no jax.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence


class JudgeStream:
    """Ended turns submitted at one tick, their verdicts handed back at the next (see the module docstring).

    ``judge(episodes) -> verdicts`` is the engine's ``TurnJudge``; it runs on this stream's threads and only
    reads the episodes, which the engine does not touch while they wait (state ``INTERACTING``).
    ``on_wait(t0, t1)``: called with the span of every wait for verdicts (the step's phase timeline).
    """

    def __init__(self, judge: Callable[[Sequence[Any]], list[Any]], workers: int = 8, on_wait: Callable | None = None):
        if workers < 1:
            raise ValueError(f"JudgeStream(workers={workers}) must be >= 1")
        self.judge = judge
        self.on_wait = on_wait
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge-stream")
        self._pending: list[tuple[int, list[Any], Future]] = []  # (tick, episodes, verdicts), in order
        self._submitted: set[int] = set()  # ids of the episodes waiting for a verdict
        self.calls = 0  # judge calls made
        self.wait_s = 0.0  # seconds the engine waited for verdicts

    def __enter__(self) -> "JudgeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def waiting(self, episode_id: int) -> bool:
        """Whether the episode's turn is with the judge."""
        return episode_id in self._submitted

    def submit(self, episodes: Sequence[Any], tick: int) -> None:
        """Sends the ended turns of ``episodes`` (one judge call) at ``tick``."""
        episodes = list(episodes)
        if not episodes:
            return
        for e in episodes:
            if e.episode_id in self._submitted:
                raise RuntimeError(f"episode {e.episode_id} is already waiting for a verdict")
            self._submitted.add(e.episode_id)
        self.calls += 1
        self._pending.append((tick, episodes, self._pool.submit(self.judge, episodes)))

    def due(self, tick: int) -> list[tuple[Any, Any]]:
        """``(episode, verdict)`` of every call submitted before ``tick``, in submission order, waiting for the
        ones not back yet. A judge that raised raises here; a call returning the wrong count is an error."""
        ready = [p for p in self._pending if p[0] < tick]
        self._pending = [p for p in self._pending if p[0] >= tick]
        out = []
        for _, episodes, future in ready:
            t0 = time.perf_counter()
            verdicts = future.result()
            t1 = time.perf_counter()
            self.wait_s += t1 - t0
            if self.on_wait is not None and t1 - t0 > 1e-4:
                self.on_wait(t0, t1)
            if len(verdicts) != len(episodes):
                raise RuntimeError(f"judge returned {len(verdicts)} verdicts for {len(episodes)} episodes")
            for e, v in zip(episodes, verdicts):
                self._submitted.discard(e.episode_id)
                out.append((e, v))
        return out

    def close(self) -> None:
        """Stops the pool without waiting for verdicts no one will read (a cancelled rollout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pending, self._submitted = [], set()
