"""How the rollout engine asks for generations: the ``PolicyClient`` interface (``GenRequest`` in,
``GenOutput`` out) and ``SamplerClient``, its implementation over our jitted ``Sampler``.

Tests and scripted episodes implement ``PolicyClient`` with canned outputs; the engine never sees a
sampler, only this interface.

One ``generate(requests)`` is ONE sampler call, whatever the mix of ACT and REHEARSE rows: each row
gets its own ``SamplingParams`` (temperature, top-p, top-k, max_new_tokens, seed; the client's stop
ids), so both roles share one batch.

Multi-turn continuation. The client remembers, per ``cache_key``, the ids its row holds in the
sampler's state (prompt + generated). A later request with the same key whose ``prompt_ids`` extend
those ids (the engine's next ACT prompt = previous prompt + generated + closing/tool/user ids) only
appends the new suffix to that row's KV cache (``Sampler.continue_``); every other request is a fresh
prompt in the same call (``rows=-1``). Requests without a key (REHEARSE prompts, which are built anew
each time) are always fresh and are not kept.

Rows that are cached but not asked for in a call (an episode whose calls are being rehearsed) are
*parked*: carried through the call with nothing appended and ``max_new_tokens=0``, so their cache
survives until the episode's next ACT turn. They cost batch slots but no decode steps.
``park_idle=False`` drops them instead (their next turn is a fresh prefill). ``release(keys)`` drops
rows for good (the engine releases an episode's key when it ends).

When continuing is impossible the client falls back to a fresh prefill of the WHOLE prompt, never to
a shortened one:
* the key is unknown, was released, or the prompt does not extend the remembered ids -> that row is
  fresh in the same call;
* a row (kept or fresh) would not fit the state's capacity with its full ``max_new_tokens`` budget:
  if the sampler sizes its cache per call (``Sampler(cache_size=None)``), the whole call becomes one
  fresh ``generate`` (every row re-prefilled, parked rows dropped) so the new cache fits; with a fixed
  ``Sampler(cache_size=C)`` a fresh call would not have more room, so the call continues and the
  sampler itself reports ``finish_reason="cache_full"`` (a row whose appended ids do not fit gets no
  tokens and its cache is left untouched; the engine ends that episode as ``length_budget``).
For continuation to pay off in a rollout, build the sampler with ``cache_size >= rollout.max_model_len``.

Randomness: a fresh row's stream is seeded by its request's ``seed``; a continued row keeps the stream
it started with (the sampler tracks its draws), so the later requests' seeds are not used for it.
Greedy rows are identical either way (``tests/rl/test_rollout_sampler.py`` compares the two).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from envace_jax.config import RoleSampling
from envace_jax.rl.types import ACT, REHEARSE, ROLES
from envace_jax.sampling import Sampler, SamplerOutput, SamplerState, SamplingParams


# ----------------------------------------------------------------------------- the client interface


@dataclasses.dataclass
class GenRequest:
    prompt_ids: list[int]
    role: str
    sampling: RoleSampling
    seed: int
    cache_key: str | None = None  # same key across turns: the client may continue a cached prefix
    episode: int = -1  # the episode asking (for logs and scripted clients)


@dataclasses.dataclass
class GenOutput:
    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    # a Qwen3-MoE sampler's experts of each generated token, [len(ids), sparse layers, k] (routing replay)
    routing: Any = None


class PolicyClient(Protocol):
    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]: ...

    def release(self, cache_keys: Sequence[str]) -> None: ...


# ----------------------------------------------------------------------------- over our Sampler


@dataclasses.dataclass
class CallStats:
    """What one ``generate`` did (``SamplerClient.calls``)."""

    rows: dict[str, int]  # requests per role
    continued: int  # requests that appended to a cached row
    fresh: int  # requests prefilled from scratch
    parked: int  # idle cached rows carried through the call
    prefill_tokens: int  # ids written to the cache by this call's requests
    full_prefill: bool  # the call fell back to one fresh generate() for every row
    # (role, ids written, tokens generated) of each request in the call, for per-role accounting
    row_tokens: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


def check_request(i: int, r: GenRequest) -> None:
    """A request's role and prompt, checked before it reaches a sampler (``i``: its index in the call)."""
    if r.role not in ROLES:
        raise ValueError(f"requests[{i}].role={r.role!r}; expected one of {ROLES}")
    if not r.prompt_ids:
        raise ValueError(f"requests[{i}] ({r.role}, episode {r.episode}) has an empty prompt")


class SamplerClient:
    """``PolicyClient`` over a ``Sampler`` (see the module docstring)."""

    def __init__(
        self, sampler: Sampler, stop_token_ids: Sequence[int], *, continuation: bool = True, park_idle: bool = True
    ):
        if not isinstance(sampler, Sampler):
            raise TypeError(f"SamplerClient(sampler): expected a Sampler, got {type(sampler).__name__}")
        stops = tuple(int(t) for t in stop_token_ids)
        if not stops:
            raise ValueError("SamplerClient(stop_token_ids) is empty: generations would never stop early")
        self.sampler = sampler
        self.stop_token_ids = stops
        self.continuation = continuation
        self.park_idle = park_idle
        self.calls: list[CallStats] = []
        self._state: SamplerState | None = None
        self._row: dict[str, int] = {}  # cache_key -> row of self._state
        self._seen: dict[str, list[int]] = {}  # cache_key -> ids that row holds (prompt + generated)

    # ------------------------------------------------------------------ PolicyClient
    def release(self, cache_keys: Sequence[str]) -> None:
        for k in cache_keys:
            self._row.pop(k, None)
            self._seen.pop(k, None)

    def reset(self) -> None:
        """Forgets every cached row (e.g. after a parameter update, when cached keys/values are stale)."""
        self._state, self._row, self._seen = None, {}, {}

    def release_weights(self) -> None:
        """Drops the sampler's prepared copy of the weights (``Sampler.release_weights``), e.g. before an
        update that replaces them; cached rows stay (``reset`` forgets those)."""
        self.sampler.release_weights()

    @property
    def cached_keys(self) -> list[str]:
        return list(self._row)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        keys_in_call: set[str] = set()
        for i, r in enumerate(requests):
            check_request(i, r)
            if r.cache_key is not None:
                if r.cache_key in keys_in_call:
                    raise ValueError(f"requests[{i}]: cache_key {r.cache_key!r} appears twice in one call")
                keys_in_call.add(r.cache_key)
        params = [self._params(r) for r in requests]

        plan = self._plan(requests) if self.continuation and self._state is not None else None
        if plan is not None and not self._fits(plan, requests, params):
            plan = None
        if plan is None:
            out = self.sampler.generate([list(r.prompt_ids) for r in requests], params, return_state=self.continuation)
            rows_after = {}
            written = [len(r.prompt_ids) for r in requests]
            stats = CallStats(
                self._role_counts(requests),
                0,
                len(requests),
                0,
                sum(len(r.prompt_ids) for r in requests),
                self._state is not None,
            )
        else:
            src, appended, parked = plan
            park = SamplingParams(max_new_tokens=0, stop_token_ids=self.stop_token_ids, temperature=0.0)
            out = self.sampler.continue_(
                self._state,
                appended + [[] for _ in parked],
                params + [park] * len(parked),
                rows=src + [self._row[k] for k in parked],
                return_state=True,
            )
            rows_after = {k: len(requests) + j for j, k in enumerate(parked)}
            written = [len(a) for a in appended]
            stats = CallStats(
                self._role_counts(requests),
                sum(s >= 0 for s in src),
                sum(s < 0 for s in src),
                len(parked),
                sum(len(a) for a in appended),
                False,
            )
        stats.row_tokens = [(r.role, w, len(t)) for r, w, t in zip(requests, written, out.tokens)]
        self.calls.append(stats)
        self._remember(requests, out, rows_after)
        routing = out.routing or [None] * len(requests)
        return [
            GenOutput(list(t), list(lp), fr, rt)
            for t, lp, fr, rt in zip(
                out.tokens[: len(requests)],
                out.logprobs[: len(requests)],
                out.finish_reasons[: len(requests)],
                routing[: len(requests)],
            )
        ]

    # ------------------------------------------------------------------ planning
    def _params(self, r: GenRequest) -> SamplingParams:
        s = r.sampling
        return SamplingParams(
            temperature=float(s.temperature),
            top_p=float(s.top_p),
            top_k=int(s.top_k),
            max_new_tokens=int(s.max_new_tokens),
            stop_token_ids=self.stop_token_ids,
            seed=int(r.seed),
        )

    def _plan(self, requests: Sequence[GenRequest]) -> tuple[list[int], list[list[int]], list[str]]:
        """Source row (-1 = fresh) and ids to append for each request, and the keys to park."""
        assert self._state is not None
        pending = self._state.pending
        src, appended = [], []
        for r in requests:
            k = r.cache_key
            seen = self._seen.get(k) if k is not None else None
            prompt = list(r.prompt_ids)
            # A row with nothing new to append and no pending token would have no logits to start from.
            if (
                seen is not None
                and len(prompt) >= len(seen)
                and prompt[: len(seen)] == seen
                and (len(prompt) > len(seen) or pending[self._row[k]] >= 0)
            ):
                src.append(self._row[k])
                appended.append(prompt[len(seen) :])
            else:
                src.append(-1)
                appended.append(prompt)
        asked = {r.cache_key for r in requests if r.cache_key is not None}
        parked = [k for k in self._row if k not in asked] if self.park_idle else []
        return src, appended, parked

    def _fits(self, plan, requests: Sequence[GenRequest], params: Sequence[SamplingParams]) -> bool:
        """False only where a fresh generate() would give a row more room than this state has."""
        if self.sampler.cache_size is not None:
            return True
        cap = self._state.capacity
        return all(len(r.prompt_ids) + p.max_new_tokens <= cap for r, p in zip(requests, params))

    @staticmethod
    def _role_counts(requests: Sequence[GenRequest]) -> dict[str, int]:
        return {ACT: sum(r.role == ACT for r in requests), REHEARSE: sum(r.role == REHEARSE for r in requests)}

    def _remember(self, requests: Sequence[GenRequest], out: SamplerOutput, rows_after: dict[str, int]) -> None:
        old_seen = self._seen
        self._row, self._seen = {}, {}
        self._state = out.state if self.continuation else None
        if self._state is None:
            return
        held = self._state.total_lengths()
        for k, row in rows_after.items():  # parked rows hold what they held before
            if held[row] == len(old_seen[k]):
                self._row[k], self._seen[k] = row, old_seen[k]
        for i, r in enumerate(requests):
            if r.cache_key is None:
                continue
            ids = list(r.prompt_ids) + list(out.tokens[i])
            # A row the sampler could not extend (cache_full) holds something else: forget it rather
            # than guess, so its next request is a fresh prefill.
            if held[i] == len(ids):
                self._row[r.cache_key], self._seen[r.cache_key] = i, ids


def role_mix(calls: Sequence[CallStats]) -> list[tuple[int, int]]:
    """(ACT rows, REHEARSE rows) of each recorded call."""
    return [(c.rows[ACT], c.rows[REHEARSE]) for c in calls]


def summary(calls: Sequence[CallStats]) -> dict[str, Any]:
    """Totals over a client's calls (for logs)."""
    return {
        "calls": len(calls),
        "mixed_calls": sum(c.rows[ACT] > 0 and c.rows[REHEARSE] > 0 for c in calls),
        "continued": sum(c.continued for c in calls),
        "fresh": sum(c.fresh for c in calls),
        "parked": sum(c.parked for c in calls),
        "prefill_tokens": sum(c.prefill_tokens for c in calls),
        "full_prefill_fallbacks": sum(c.full_prefill for c in calls),
    }


__all__ = ["CallStats", "GenOutput", "GenRequest", "PolicyClient", "SamplerClient", "role_mix", "summary"]
