"""A rolling batch over the ``Sampler``: a finished row's slot goes to the next waiting request.

``SamplerClient`` serves one ``generate(requests)`` as one sampler call that decodes until its longest
row ends, so every row that stops early leaves its slot idle until then, and a call with more rows
than a batch bucket pads up to the next bucket. ``RollingSamplerClient`` keeps at most ``slots`` rows
decoding; requests beyond that wait in a queue. Each ``step()`` is one sampler call that:

* carries on the rows still generating: they write nothing, their next-token logits come from the
  previous call (``SamplerState.carried``), their PRNG stream and remaining ``max_new_tokens`` go on,
  so a row split over calls draws what it would have drawn in one call;
* gives the free slots to waiting requests, in submission order (a request whose ``cache_key`` names
  a finished row still intact in the state appends only its new suffix, as ``SamplerClient`` does);
* carries finished rows that may be continued later (parked, ``max_new_tokens=0``) only in slots the
  batch bucket pads anyway, so keeping them costs nothing;
* stops decoding as soon as ``refill`` of the running rows have finished while requests wait (the
  sampler's ``min_done``), so their slots are refilled at once instead of idling to the end; with
  ``eager_refill`` also when nothing waits yet (in a rollout engine, a finished row's episode queues
  its next request as soon as ``step()`` returns it).

``step()`` returns the requests that finished in that call, so an engine can act on them (parse,
queue the episode's next request) while the other rows are still generating. ``generate()`` runs
``step()`` until its own requests are done, so the client is also a plain ``PolicyClient``.

What differs from ``SamplerClient``: a fresh row's PRNG stream is keyed by its seed and by its row in
the call (``Sampler``), and rows sit in different places here, so sampled tokens differ (their
distribution does not); greedy rows are the same tokens up to float rounding of different batch
shapes. The sampler must have a fixed ``cache_size``: the state lives across calls, so its capacity
is set once (``Sampler`` still sizes each call's cache window to what that call needs).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import numpy as np

from envace_jax.rl.policy_client import CallStats, GenOutput, GenRequest, check_request
from envace_jax.rl.types import ACT, REHEARSE
from envace_jax.sampling import Sampler, SamplerState, SamplingParams


@dataclasses.dataclass
class _Job:
    ticket: int
    request: GenRequest
    params: SamplingParams
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    routing: list = dataclasses.field(default_factory=list)  # a Qwen3-MoE's records, one per call
    row: int = -1  # row of the current state while running


class RollingSamplerClient:
    """``PolicyClient`` with a rolling batch of at most ``slots`` rows (see the module docstring).

    ``refill``: fraction of the running rows that must finish before a call returns early to refill
    their slots (only while requests wait, or always with ``eager_refill``; 0 < refill <= 1).
    ``continuation``: a request may append to the finished row of its ``cache_key`` (rows that are
    still generating always continue).
    """

    def __init__(
        self,
        sampler: Sampler,
        stop_token_ids: Sequence[int],
        *,
        slots: int = 32,
        refill: float = 0.25,
        continuation: bool = True,
        eager_refill: bool = False,
    ):
        if not isinstance(sampler, Sampler):
            raise TypeError(f"RollingSamplerClient(sampler): expected a Sampler, got {type(sampler).__name__}")
        if sampler.cache_size is None:
            raise ValueError("RollingSamplerClient needs a Sampler(cache_size=...): its state lives across calls")
        stops = tuple(int(t) for t in stop_token_ids)
        if not stops:
            raise ValueError("RollingSamplerClient(stop_token_ids) is empty: generations would never stop early")
        if slots < 1:
            raise ValueError(f"RollingSamplerClient(slots={slots}) must be >= 1")
        if not 0.0 < refill <= 1.0:
            raise ValueError(f"RollingSamplerClient(refill={refill}) must be in (0, 1]")
        self.sampler, self.stop_token_ids = sampler, stops
        self.slots, self.refill, self.continuation = int(slots), float(refill), continuation
        self.eager_refill = bool(eager_refill)
        self.calls: list[CallStats] = []
        self._state: SamplerState | None = None
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: list[_Job] = []
        self._parked: dict[str, tuple[int, list[int]]] = {}  # cache_key -> (row, ids the row holds)
        self._next_ticket = 0

    # ------------------------------------------------------------------ PolicyClient
    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        tickets = self.submit(requests)
        want, got = set(tickets), {}
        while want - got.keys():
            for t, _, out in self.step():
                if t in want:
                    got[t] = out
        return [got[t] for t in tickets]

    def release(self, cache_keys: Sequence[str]) -> None:
        for k in cache_keys:
            self._parked.pop(k, None)

    def reset(self) -> None:
        """Forgets every cached row (after a parameter update). Only allowed when no request is open."""
        if self._queue or self._running:
            raise RuntimeError(f"reset() with {len(self._queue)} waiting and {len(self._running)} running requests")
        self._state, self._parked = None, {}

    def release_weights(self) -> None:
        """Drops the sampler's prepared copy of the weights (``Sampler.release_weights``), e.g. before an
        update that replaces them; cached rows stay (``reset`` forgets those)."""
        self.sampler.release_weights()

    # ------------------------------------------------------------------ streaming
    def submit(self, requests: Sequence[GenRequest]) -> list[int]:
        """Queues ``requests``; returns their tickets (``step()`` reports each once, when it finishes)."""
        open_keys = {j.request.cache_key for j in list(self._queue) + self._running} - {None}
        tickets = []
        for i, r in enumerate(requests):
            check_request(i, r)
            if r.cache_key is not None:
                if r.cache_key in open_keys:
                    raise ValueError(f"requests[{i}]: cache_key {r.cache_key!r} already has an open request")
                open_keys.add(r.cache_key)
            s = r.sampling
            params = SamplingParams(
                temperature=float(s.temperature),
                top_p=float(s.top_p),
                top_k=int(s.top_k),
                max_new_tokens=int(s.max_new_tokens),
                stop_token_ids=self.stop_token_ids,
                seed=int(r.seed),
            )
            self._queue.append(_Job(self._next_ticket, r, params))
            tickets.append(self._next_ticket)
            self._next_ticket += 1
        return tickets

    @property
    def open_requests(self) -> int:
        return len(self._queue) + len(self._running)

    def step(self) -> list[tuple[int, GenRequest, GenOutput]]:
        """One sampler call; returns ``(ticket, request, output)`` of every request that finished in it."""
        if not self._queue and not self._running:
            return []
        running = self._running
        joining = [self._queue.popleft() for _ in range(min(len(self._queue), self.slots - len(running)))]
        jobs = running + joining
        # Rows of the previous state each job continues (-1: fresh) and the ids it appends.
        src, appended, prefill = [], [], 0
        for j in running:
            src.append(j.row)
            appended.append([])
        for j in joining:
            row, suffix = self._resume(j.request)
            src.append(row)
            appended.append(suffix)
            prefill += len(suffix)
        # Parked rows ride along only in slots the batch bucket pads anyway.
        spare = self.sampler.batch_bucket(len(jobs)) - len(jobs) if self._state is not None else 0
        parked = [k for k in reversed(self._parked)][: max(spare, 0)]
        params = [self._remaining(j) for j in jobs]
        waiting = len(self._queue)
        live = sum(p.max_new_tokens > 0 for p in params)
        min_done = max(1, math.ceil(self.refill * live)) if (waiting or self.eager_refill) and live else None
        if self._state is None:
            out = self.sampler.generate(
                [list(j.request.prompt_ids) for j in jobs], params, return_state=True, min_done=min_done
            )
        else:
            park = SamplingParams(max_new_tokens=0, stop_token_ids=self.stop_token_ids, temperature=0.0)
            out = self.sampler.continue_(
                self._state,
                appended + [[] for _ in parked],
                params + [park] * len(parked),
                rows=src + [self._parked[k][0] for k in parked],
                return_state=True,
                min_done=min_done,
            )
        written = [0] * len(running) + [len(a) for a in appended[len(running) :]]  # running rows carry their logits
        self.calls.append(
            CallStats(
                {r: sum(j.request.role == r for j in jobs) for r in (ACT, REHEARSE)},
                continued=sum(s >= 0 for s in src[len(running) :]),
                fresh=sum(s < 0 for s in src),
                parked=len(parked),
                prefill_tokens=prefill,
                full_prefill=False,
                row_tokens=[(j.request.role, w, len(t)) for j, w, t in zip(jobs, written, out.tokens)],
            )
        )
        return self._collect(jobs, out, parked)

    # ------------------------------------------------------------------ helpers
    def _resume(self, r: GenRequest) -> tuple[int, list[int]]:
        """(row, suffix) if ``r`` extends a parked row of its key, else (-1, whole prompt)."""
        prompt = list(r.prompt_ids)
        if self._state is None or not self.continuation or r.cache_key not in self._parked:
            return -1, prompt
        row, seen = self._parked.pop(r.cache_key)
        pending = self._state.pending[row]
        if len(prompt) >= len(seen) and prompt[: len(seen)] == seen and (len(prompt) > len(seen) or pending >= 0):
            return row, prompt[len(seen) :]
        return -1, prompt

    @staticmethod
    def _remaining(j: _Job) -> SamplingParams:
        return dataclasses.replace(j.params, max_new_tokens=j.params.max_new_tokens - len(j.ids))

    def _collect(self, jobs: list[_Job], out, parked: list[str]) -> list[tuple[int, GenRequest, GenOutput]]:
        state = out.state
        held = state.total_lengths()
        old_parked, self._parked = self._parked, {}
        for i, k in enumerate(parked, start=len(jobs)):  # parked rows hold what they held before
            row, seen = old_parked[k]
            if held[i] == len(seen):
                self._parked[k] = (i, seen)
        done, self._running = [], []
        for i, j in enumerate(jobs):
            j.ids += out.tokens[i]
            j.logprobs += out.logprobs[i]
            if out.routing is not None:  # a row spread over several calls: its pieces in order
                j.routing.append(out.routing[i])
            reason = out.finish_reasons[i]
            if reason == "running":
                j.row = i
                self._running.append(j)
                continue
            r = j.request
            if r.cache_key is not None and self.continuation:
                ids = list(r.prompt_ids) + j.ids
                # A row that could not be extended (cache_full) holds something else: forget it.
                if held[i] == len(ids):
                    self._parked[r.cache_key] = (i, ids)
            routing = np.concatenate(j.routing) if j.routing else None
            done.append((j.ticket, r, GenOutput(list(j.ids), list(j.logprobs), reason, routing)))
        self._state = state
        return done


__all__ = ["RollingSamplerClient"]
