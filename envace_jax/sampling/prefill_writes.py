"""How a ``Sampler`` call writes its rows' new tokens into the KV cache (the prefill), as a mixin of ``Sampler``.

Split from ``sampling/client.py``, which plans calls, runs the decode and keeps state. A call's prefill is
either one program per chunk of at most ``max_chunk`` tokens over every row, or, with ``split_prefill``, one
per sub-batch of rows that write (short rows not padded to the longest); with ``share_prompts`` a call whose
rows repeat prompts writes each distinct prompt once and copies its cache rows and logits to the rows that
repeat it. The methods use the sampler's programs (``_prefill``, ``_prefill_rows``, ``_prepare``), its
planner (``_plan``) and its device helpers (``_put``, ``_starting_cache``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from envace_jax.models import qwen3
from envace_jax.sampling.loop import unusable_donations_ok
from envace_jax.sampling.plan import BatchPlan, PrefillChunk


class PrefillWrites:
    """The prefill half of ``Sampler`` (see the module docstring)."""

    def _shared_prompt_plan(self, chunks, ps, plan: BatchPlan) -> tuple[BatchPlan, np.ndarray] | None:
        """(the plan of the call's distinct prompts, the distinct prompt of each of the call's slots), or
        None when no prompt repeats, or the call is not one the copy reproduces exactly: every row must
        write its whole prompt and the distinct prompts' cache window must be the call's."""
        index: dict[bytes, int] = {}
        which = np.asarray([index.setdefault(c.tobytes(), len(index)) for c in chunks], np.int32)
        if len(index) == len(chunks) or not np.array_equal(plan.lens[: plan.n], [len(c) for c in chunks]):
            return None
        first = [int(np.flatnonzero(which == u)[0]) for u in range(len(index))]
        # Seeds are not drawn here (the call's own plan drew them): these rows only write their prompts.
        sub = self._plan([chunks[i] for i in first], [ps[i] for i in first], [0] * len(first), plan.capacity)
        if sub.window != plan.window:
            return None
        slots = np.zeros((plan.batch,), np.int32)  # padding slots copy prompt 0: they end at 0, never read
        slots[: plan.n] = which
        return sub, slots

    def _write_shared_prompts(self, params, weights, plan: BatchPlan, sub: BatchPlan, slots: np.ndarray):
        """``_write_inputs`` for a call whose rows repeat prompts (``share_prompts``): the distinct prompts
        written once (``sub``), then each slot's cache rows and logits copied from its prompt's row."""
        row = ("batch",)
        k, v, _ = self._starting_cache(None, sub)
        logits, k, v, _ = self._write_inputs(params, weights, k, v, False, sub)
        src = self._put(slots, row)
        with unusable_donations_ok():
            k, v = self._prepare(k, v, src, size=plan.window, gather=True)
        return jnp.take(logits, src, axis=0), k, v, self._put(plan.end_after.astype(np.int32), row)

    def _write_inputs(self, params, weights, k, v, gather: bool, plan: BatchPlan):
        """The prefill: every row's new tokens written into the cache, in chunks of at most ``max_chunk``
        tokens (``plan.prefill``). Returns (next-token logits ``[B, V]`` of the rows that wrote, None if
        none did; k, v; each row's cache end ``[B]`` on device).

        A one-call chunk gathers and resizes the cache inside its program; sub-batch chunks
        (``split_prefill``) and a call that writes nothing work on the call's cache as it is, so it is
        gathered and resized first, by a program of its own."""
        row = ("batch",)
        logits = None
        if not plan.prefill or plan.prefill[0].groups is not None:
            if gather or k[0].shape[qwen3.CACHE_K_SLOT_AXIS] != plan.window:
                with unusable_donations_ok():
                    k, v = self._prepare(k, v, self._put(plan.gather_rows, row), size=plan.window, gather=gather)
            gather = False
        if not plan.prefill:
            end = self._put(plan.end_after.astype(np.int32), row)
        for chunk in plan.prefill:
            if chunk.groups is not None:
                logits, k, v = self._write_chunk_by_rows(params, weights, k, v, logits, plan, chunk)
                end = self._put((chunk.end + chunk.take).astype(np.int32), row)
                continue
            with unusable_donations_ok():
                lg, k, v, end = self._prefill(
                    params,
                    weights,
                    k,
                    v,
                    self._put(plan.gather_rows, row),
                    self._put(chunk.end.astype(np.int32), row),
                    self._put(plan.chunk_tokens(chunk), ("batch", None)),
                    self._put(chunk.take.astype(np.int32), row),
                    size=plan.window,
                    gather=gather,
                )
            gather = False
            last_here = chunk.last_for(plan.lens)
            logits = lg if logits is None else jnp.where(self._put(last_here, row)[:, None], lg, logits)
        return logits, k, v, end

    def _write_chunk_by_rows(self, params, weights, k, v, logits, plan: BatchPlan, chunk: PrefillChunk):
        """One split chunk: a call per sub-batch on the rows that write (``plan.split_rows``), so short
        rows are not padded to the longest. Rows whose last input token is in the chunk take its logits."""
        if logits is None:
            logits = self._put(np.zeros((plan.batch, self.cfg.vocab_size), np.float32), ("batch", None))
        last = chunk.last_for(plan.lens)
        for g in chunk.groups:
            is_last = np.zeros(g.rows.shape, bool)
            is_last[: g.n_real] = last[g.rows[: g.n_real]]
            with unusable_donations_ok():
                # a sub-batch is not split over the mesh's batch axis (its size is any bucket)
                logits, k, v = self._prefill_rows(
                    params,
                    weights,
                    k,
                    v,
                    logits,
                    self._put(g.rows, (None,)),
                    self._put(g.end.astype(np.int32), (None,)),
                    self._put(plan.group_tokens(chunk, g), (None, None)),
                    self._put(g.take.astype(np.int32), (None,)),
                    self._put(is_last, (None,)),
                )
        return logits, k, v
