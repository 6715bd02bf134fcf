"""Jitted batched sampler: prefill + on-device decode loop over a device KV cache.

Usage::

    out = Sampler(model).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=64))
    out.tokens, out.logprobs, out.finish_reasons, out.lengths

Multi-turn (the rollout engine's per-step call)::

    out = sampler.generate(prompts, params, return_state=True)
    out2 = sampler.continue_(out.state, appended, params2, rows=[2, 0, -1])

``continue_`` gathers the listed rows of the previous state's cache (``-1`` = a fresh prompt in that
slot), appends each row's new tokens after what the row already holds, and decodes again, so a turn
costs the appended tokens plus the generated ones, not the whole conversation. The last generated
token of a finished row is not in the cache yet (feeding it would cost one more forward that a
finished episode never needs); it is written in front of the row's next appended chunk. A row still
generating when a call returns early (``min_done``) has fed it already and carries its next-token
logits in the state, so continuing it writes nothing (``SamplerState.carried``).

What each call does before touching the device (row resume, room, prefill chunks, window, budget)
is planned in numpy by ``sampling_plan.plan_batch``. Two compiled programs carry the plan out per
shape bucket: ``prefill`` (gather rows, resize the cache, write one right-padded chunk, logits at
each row's last token) and ``decode`` (a ``lax.while_loop`` that samples, records and feeds one
token per step until every row is done or the budget is reached). Per-row sampling values are arrays, so changing them never recompiles; shapes are bucketed
(batch, chunk length, cache length, token budget) so a long run compiles a handful of programs.
``Sampler.num_compilations`` counts traces of both.

Cache sizing (why the cache has ``headroom``): the model writes a padded chunk at ``end[b] + t``
and drops slots past the cache (see ``qwen3``). A row may hold at most ``capacity`` tokens; the
device cache may grow to ``capacity + headroom`` slots and every chunk is at most ``headroom`` long,
so every valid token of a chunk has a slot, even in the largest window; rows that are full or
finished write padding past ``end``, which is never read.
The device cache itself is sized per call to the bucket of what the batch needs, so attention in the
decode loop runs over the live window rather than the whole capacity.

Finish reasons: ``"stop"`` (a stop token was generated; it is included in the output), ``"length"``
(``max_new_tokens`` reached), ``"cache_full"`` (the row reached ``capacity``, or its appended tokens
did not fit: then nothing is written, no token is generated, and the row's cache is left as it was).
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import qwen3
from envace_jax.sampling_ops import sample_tokens
# Re-exported: the bucket helpers and finish-reason codes used to live here.
from envace_jax.sampling_plan import (CACHE_FULL, LENGTH, REASONS, RUNNING, STOP, PrevRows, bucket,  # noqa: F401
                                      plan_batch, pow2_bucket, quarter_octave_bucket)
# Re-exported: the records lived here too.
from envace_jax.sampling_records import SamplerOutput, SamplerState, SamplerStats, SamplingParams  # noqa: F401


def _resize(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Truncates or zero-pads ``x`` along ``axis`` to ``size``."""
    n = x.shape[axis]
    if size < n:
        return jax.lax.slice_in_dim(x, 0, size, axis=axis)
    if size > n:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, size - n)
        return jnp.pad(x, pad)
    return x


@contextlib.contextmanager
def _unusable_donations_ok():
    """Prefill donates the cache; XLA warns when it cannot reuse a buffer (e.g. a resize), which is fine."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        yield


class Sampler:
    """Batched sampler over a live ``qwen3.Qwen3`` model (reads its current parameters each call).

    Keyword options:
      cache_size: tokens a row may hold (prompt + generated + appended); default per ``generate``
        call: bucketed prompt length + largest ``max_new_tokens``.
      max_chunk: longest chunk written by one prefill call (longer inputs are split); also the
        cache headroom (see the module docstring).
      length_buckets / batch_buckets: sorted sizes to round chunk lengths / batch sizes up to
        (default powers of two, chunks at least 16).
      window_buckets: sorted device-cache sizes to round a call's need up to (default four per
        power of two, at least 64); the size never exceeds ``capacity + headroom``.
      k_max: candidate count of the fast sampling path (see ``sampling_ops``).
      split_prefill: a prefill chunk whose rows write very different lengths (a rolling batch: resumed
        rows write a pending token and a short suffix, joining rows a whole prompt) runs as up to two sub-batch
        calls on the rows that write, instead of padding every row to the longest
        (``sampling_plan.split_rows``); same tokens, fewer computed slots. ``split_min_rows``: the
        smallest sub-batch (powers of two from it: fewer shapes to compile).
      mesh, rules: sample under this mesh; parameters are resharded to ``rules`` (default
        ``SAMPLE_RULES``) only if they are not already laid out that way.
      compiler_options: XLA options of the sampler's programs (``jax.jit(compiler_options=...)``), e.g.
        to time a scheduler setting against the default (``benchmarks/sampler.py --compare-options``).
    """

    def __init__(self, model: qwen3.Qwen3, *, cache_size: int | None = None, max_chunk: int = 512,
                 length_buckets: Sequence[int] | None = None, batch_buckets: Sequence[int] | None = None,
                 window_buckets: Sequence[int] | None = None, k_max: int = 64, mesh: jax.sharding.Mesh | None = None, rules: shd.Rules | None = None,
                 seed: int = 0, split_prefill: bool = True, split_min_rows: int = 8,
                 compiler_options: Mapping[str, Any] | None = None):
        if not isinstance(model, qwen3.Qwen3):
            raise TypeError(f"Sampler(model): expected a qwen3.Qwen3, got {type(model).__name__}")
        if cache_size is not None and cache_size < 1:
            raise ValueError(f"Sampler(cache_size={cache_size}) must be >= 1")
        if max_chunk < 1:
            raise ValueError(f"Sampler(max_chunk={max_chunk}) must be >= 1")
        self.model = model
        self.cfg = model.config
        self.cache_size = cache_size
        self.max_chunk = int(max_chunk)
        self.length_buckets = tuple(length_buckets) if length_buckets else None
        self.batch_buckets = tuple(batch_buckets) if batch_buckets else None
        self.window_buckets = tuple(window_buckets) if window_buckets else None
        self.k_max = int(k_max)
        self.split_prefill, self.split_min_rows = bool(split_prefill), int(split_min_rows)
        self.mesh = mesh if mesh is not None else model.mesh
        self.rules = dict(rules if rules is not None else shd.SAMPLE_RULES) if self.mesh is not None else None
        self._seed_rng = np.random.default_rng(seed)
        self.num_compilations = 0
        self.stats = SamplerStats()
        self.timed = False
        self._spare: tuple[jax.Array, jax.Array] | None = None
        # A second module object sharing the live arrays, carrying the sampling rules for activation
        # constraints; only its graphdef is used, the parameters come from `model` at every call.
        graphdef, state = nnx.split(model)
        shadow = nnx.merge(graphdef, state)
        shadow.set_sharding(self.mesh, self.rules)
        self._graphdef = nnx.graphdef(shadow)
        self._param_shardings = (qwen3.param_shardings(model, self.mesh, self.rules)
                                 if self.mesh is not None else None)
        devices = self.mesh.devices.flat if self.mesh is not None else jax.devices()
        self._cpu = all(d.platform == "cpu" for d in devices)
        self.compiler_options = dict(compiler_options) if compiler_options else None
        jit = functools.partial(jax.jit, compiler_options=self.compiler_options)
        self._prefill = jit(self._prefill_impl, static_argnames=("size", "gather"), donate_argnums=(1, 2))
        self._prepare = jit(self._prepare_impl, static_argnames=("size", "gather"), donate_argnums=(0, 1))
        self._prefill_rows = jit(self._prefill_rows_impl, donate_argnums=(1, 2, 3))
        self._decode = jit(self._decode_impl, static_argnames=("budget",), donate_argnums=(1, 2))

    # ---------------------------------------------------------------- jitted programs
    def _cache_constrain(self, k, v):
        return (tuple(shd.constrain(a, qwen3.CACHE_K_AXES, self.mesh, self.rules) for a in k),
                tuple(shd.constrain(a, qwen3.CACHE_V_AXES, self.mesh, self.rules) for a in v))

    def _prefill_impl(self, params, k, v, src, end, tokens, lens, *, size: int, gather: bool):
        """Writes one chunk per row into the (gathered, resized) cache.

        Shapes: params: model state; k, v: per-layer tuples of ``[B_old, K, H, S_old]`` and
        ``[B_old, K, S_old, H]`` (see ``qwen3.KVCache``); src int32 ``[B]`` rows of the old cache to
        keep (only if ``gather``); end int32 ``[B]`` tokens already held; tokens int32 ``[B, T]``
        right-padded; lens int32 ``[B]`` valid tokens (0 = write nothing).
        Returns (logits float32 ``[B, V]`` at each row's last valid token, k, v with ``size`` slots,
        new end ``[B]``).
        """
        self.num_compilations += 1
        k, v = self._gather_resize(k, v, src, size, gather)
        model = nnx.merge(self._graphdef, params)
        logits, cache = model(tokens, cache=qwen3.KVCache(k, v, end), chunk_lengths=lens,
                              logits_at=jnp.maximum(lens - 1, 0))
        return logits, *self._cache_constrain(cache.k, cache.v), cache.end

    def _gather_resize(self, k, v, src, size: int, gather: bool):
        """The call's cache: rows gathered from the previous state (if ``gather``), resized to ``size``."""
        if gather:
            k, v = tuple(a[src] for a in k), tuple(a[src] for a in v)
        k = tuple(_resize(a, qwen3.CACHE_K_SLOT_AXIS, size) for a in k)
        v = tuple(_resize(a, qwen3.CACHE_V_SLOT_AXIS, size) for a in v)
        return self._cache_constrain(k, v)

    def _prepare_impl(self, k, v, src, *, size: int, gather: bool):
        """The cache of the call before its first sub-batch prefill (what ``_prefill_impl`` does first)."""
        self.num_compilations += 1
        return self._gather_resize(k, v, src, size, gather)

    def _prefill_rows_impl(self, params, k, v, logits, rows, end, tokens, lens, is_last):
        """``_prefill_impl`` on the sub-batch ``rows`` (int32 ``[b]``, distinct) of the cache: their
        cache rows are gathered, written at ``end`` (``[b]``) with ``tokens`` ``[b, T]`` / ``lens``
        ``[b]``, and scattered back; ``logits`` ``[B, V]`` takes the new logits where ``is_last``."""
        self.num_compilations += 1
        model = nnx.merge(self._graphdef, params)
        sub = qwen3.KVCache(tuple(a[rows] for a in k), tuple(a[rows] for a in v), end)
        lg, cache = model(tokens, cache=sub, chunk_lengths=lens, logits_at=jnp.maximum(lens - 1, 0))
        k = tuple(a.at[rows].set(n) for a, n in zip(k, cache.k))
        v = tuple(a.at[rows].set(n) for a, n in zip(v, cache.v))
        logits = logits.at[rows].set(jnp.where(is_last[:, None], lg.astype(logits.dtype), logits[rows]))
        return logits, *self._cache_constrain(k, v)

    def _decode_impl(self, params, k, v, end, logits, keys, draws, temperature, top_p, top_k, n_max,
                     cap_reason, stop_ids, min_done, *, budget: int):
        """On-device decode loop.

        Shapes: k, v per-layer tuples (see ``qwen3.KVCache``); end int32 ``[B]``; logits float32 ``[B, V]`` (next-token
        logits after the prefill, or carried from the previous call); keys uint32 ``[B, 2]``; draws int32 ``[B]`` draws already made by
        each row; temperature/top_p float32 ``[B]``; top_k, n_max (tokens this row may generate),
        cap_reason (reason when n_max is reached) int32 ``[B]``; stop_ids int32 ``[B, S_max]``
        padded with -1; min_done int32 scalar: stop once this many rows that started live are done
        (the rest report ``RUNNING``). Returns tokens int32 ``[B, budget]``, logprobs float32
        ``[B, budget]``, n int32 ``[B]`` generated, reason int32 ``[B]``, k, v, end, and the logits
        after each row's last fed token (see ``SamplerState.carried``).
        """
        self.num_compilations += 1
        B = logits.shape[0]
        model = nnx.merge(self._graphdef, params)
        # Sliced once, outside the loop: the body then reads each layer's weights where they lie.
        weights = model.decode_weights(transpose_head=self._cpu)

        def emit(i, logits, c):
            tokens, lps, n, done, reason = c
            tok, lp = sample_tokens(logits, keys, draws + i, temperature, top_p, top_k, k_max=self.k_max)
            live = ~done
            tokens = tokens.at[:, i].set(jnp.where(live, tok, 0))
            lps = lps.at[:, i].set(jnp.where(live, lp, 0.0))
            n = jnp.where(live, i + 1, n)
            is_stop = jnp.any(tok[:, None] == stop_ids, axis=-1)
            hit = live & (is_stop | (n >= n_max))
            reason = jnp.where(hit, jnp.where(is_stop, STOP, cap_reason), reason)
            return tok, (tokens, lps, n, done | hit, reason)

        start = n_max <= 0
        c0 = (jnp.zeros((B, budget), jnp.int32), jnp.zeros((B, budget), jnp.float32),
              jnp.zeros((B,), jnp.int32), start, jnp.where(start, cap_reason, 0))

        def cond(carry):
            i, *_, c = carry
            finished = jnp.sum((c[3] & ~start).astype(jnp.int32))
            return (i < budget) & ~jnp.all(c[3]) & (finished < min_done)

        def body(carry):
            i, k, v, end, logits, c = carry
            tok, c = emit(i, logits, c)
            live = ~c[3]

            # Finished rows feed nothing (chunk length 0); their write lands at `end`, past what they
            # hold, and a later chunk overwrites it before any valid query can see it.
            # The step that finishes the last row does one forward nobody reads: cheaper than a
            # lax.cond, whose branches may copy the whole cache on CPU.
            logits, cache = model(tok[:, None], cache=qwen3.KVCache(k, v, end), chunk_lengths=live.astype(jnp.int32),
                                  logits_at=jnp.zeros((B,), jnp.int32), decode_weights=weights)
            return i + 1, cache.k, cache.v, cache.end, logits, c

        _, k, v, end, last, c = jax.lax.while_loop(cond, body, (jnp.int32(0), k, v, end, logits, c0))
        tokens, lps, n, _, reason = c
        # Rows still running fed their last token: `last` holds their next-token logits. Rows that never
        # decoded keep the logits they came with (a carried row may sit out a call).
        last = shd.constrain(jnp.where(start[:, None], logits, last), ("batch", None), self.mesh, self.rules)
        return tokens, lps, n, reason, *self._cache_constrain(k, v), end, last

    # ---------------------------------------------------------------- ahead-of-time compilation
    def program_specs(self, batch: int, chunk: int, window: int, budget: int, stop_width: int = 4):
        """The two compiled programs at one shape bucket, with abstract arguments (``envace_jax.aot``).

        ``"prefill"``: ``batch`` rows gathered from an earlier ``window``-slot cache (as ``continue_``
        does) and a ``chunk``-token chunk written into it; ``"decode"``: the on-device loop of
        ``budget`` steps over that cache; ``"decode_setup"``: decode's work before its loop, for
        costing (see ``_decode_setup``). Returns ``{name: (jitted fn, args, static kwargs)}``; the
        arguments are ShapeDtypeStructs laid out as ``_run`` places them (parameters in ``rules``).
        """
        leaves, treedef = jax.tree.flatten(nnx.state(self.model))
        targets = ([None] * len(leaves) if self._param_shardings is None
                   else jax.tree.leaves(self._param_shardings))
        params = treedef.unflatten([jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                                    for x, s in zip(leaves, targets)])

        def arg(shape, dtype, logical):
            sharding = None if self.mesh is None else shd.named_sharding(self.mesh, logical, self.rules, shape)
            return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)

        k_shape, v_shape = qwen3.KVCache.shapes(self.cfg, batch, window)
        dt = qwen3.as_dtype(self.cfg.dtype)
        # Per-layer buffers, as _run allocates them.
        L = self.cfg.num_layers
        k = tuple(arg(k_shape, dt, qwen3.CACHE_K_AXES) for _ in range(L))
        v = tuple(arg(v_shape, dt, qwen3.CACHE_V_AXES) for _ in range(L))
        row = lambda dtype: arg((batch,), dtype, ("batch",))
        prefill = (params, k, v, row(np.int32), row(np.int32), arg((batch, chunk), np.int32, ("batch", None)),
                   row(np.int32))
        decode = (params, k, v, row(np.int32), arg((batch, self.cfg.vocab_size), np.float32, ("batch", None)),
                  arg((batch, 2), np.uint32, ("batch", None)), row(np.int32), row(np.float32), row(np.float32),
                  row(np.int32), row(np.int32), row(np.int32), arg((batch, stop_width), np.int32, ("batch", None)),
                  arg((), np.int32, ()))
        return {"prefill": (self._prefill, prefill, {"size": window, "gather": True}),
                "decode": (self._decode, decode, {"budget": budget}),
                "decode_setup": (jax.jit(self._decode_setup), (params,), {})}

    def _decode_setup(self, params):
        """What ``_decode_impl`` does once per call before its loop (the weights it prepares), as a
        program of its own: XLA's cost analysis counts a loop body once, so a decode step's cost is the
        decode program's cost less this one (``envace_jax.aot``)."""
        w = nnx.merge(self._graphdef, params).decode_weights(transpose_head=self._cpu)
        return w.layers, w.head

    # ---------------------------------------------------------------- host side
    def _params(self):
        state = nnx.state(self.model)
        if self._param_shardings is None:
            return state
        leaves = jax.tree.leaves(state)
        targets = jax.tree.leaves(self._param_shardings)
        if all(getattr(a, "sharding", None) == s for a, s in zip(leaves, targets)):
            return state
        return jax.device_put(state, self._param_shardings)

    def _put(self, x: np.ndarray, logical: tuple):
        if self.mesh is None:
            return jnp.asarray(x)
        return jax.device_put(x, shd.named_sharding(self.mesh, logical, self.rules, x.shape))

    def _norm_params(self, params, n: int) -> list[SamplingParams]:
        if isinstance(params, SamplingParams):
            return [params] * n
        params = list(params)
        if len(params) != n:
            raise ValueError(f"params: got {len(params)} SamplingParams for {n} rows")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params[{i}] is a {type(p).__name__}, not SamplingParams")
        return params

    def _check_tokens(self, seqs, name: str, allow_empty: bool):
        V = self.cfg.vocab_size
        out = []
        for i, s in enumerate(seqs):
            a = np.asarray(list(s), dtype=np.int64)
            if a.ndim != 1:
                raise ValueError(f"{name}[{i}] must be a flat list of token ids")
            if not allow_empty and a.size == 0:
                raise ValueError(f"{name}[{i}] is empty")
            if a.size and (a.min() < 0 or a.max() >= V):
                raise ValueError(f"{name}[{i}] has token ids outside [0, {V})")
            out.append(a.astype(np.int32))
        return out

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 *, return_state: bool = False, min_done: int | None = None) -> SamplerOutput:
        """Samples a continuation of every prompt (see the module docstring for the outputs).

        ``min_done``: return as soon as this many rows have finished; the others report
        ``"running"`` (continue them with ``continue_``, nothing appended, the rest of their budget).
        """
        if len(prompts) == 0:
            raise ValueError("prompts is empty")
        chunks = self._check_tokens(prompts, "prompts", allow_empty=False)
        ps = self._norm_params(params, len(chunks))
        if self.cache_size is not None:
            capacity = self.cache_size
        else:
            longest = max(len(c) for c in chunks)
            capacity = bucket(longest, self.length_buckets, 16) + max(p.max_new_tokens for p in ps)
        return self._run(None, chunks, ps, capacity, return_state, min_done)

    def continue_(self, state: SamplerState, appended: Sequence[Sequence[int]],
                  params: SamplingParams | Sequence[SamplingParams], *, rows: Sequence[int] | None = None,
                  return_state: bool = False, min_done: int | None = None) -> SamplerOutput:
        """Appends ``appended[i]`` to row ``rows[i]`` of ``state`` and decodes on.

        ``rows`` (default: all rows in order) picks and orders the rows to keep; ``-1`` starts a
        fresh prompt (``appended[i]`` is then the whole prompt). ``state`` is consumed.
        """
        if not isinstance(state, SamplerState):
            raise TypeError(f"state must be a SamplerState, got {type(state).__name__}")
        if state.consumed:
            raise ValueError("state was already consumed by an earlier continue_ call")
        rows = list(range(state.batch_size)) if rows is None else [int(r) for r in rows]
        if len(rows) != len(appended):
            raise ValueError(f"rows has {len(rows)} entries but appended has {len(appended)}")
        if not rows:
            raise ValueError("appended is empty")
        for i, r in enumerate(rows):
            if r < -1 or r >= state.batch_size:
                raise ValueError(f"rows[{i}]={r} is not a row of the state (size {state.batch_size}) or -1")
        chunks = self._check_tokens(appended, "appended", allow_empty=True)
        for i, (r, c) in enumerate(zip(rows, chunks)):
            if r < 0 and c.size == 0:
                raise ValueError(f"appended[{i}] is empty but rows[{i}] = -1 asks for a fresh prompt")
        ps = self._norm_params(params, len(chunks))
        return self._run((state, np.asarray(rows, np.int64)), chunks, ps, state.capacity, return_state, min_done)

    def batch_bucket(self, n: int) -> int:
        """The padded batch size of a call with ``n`` rows."""
        return bucket(n, self.batch_buckets, 1)

    def _run(self, prev, chunks, ps, capacity: int, return_state: bool, min_done: int | None) -> SamplerOutput:
        if min_done is not None and min_done < 1:
            raise ValueError(f"min_done={min_done} must be >= 1 (or None: decode until every row is done)")
        n = len(chunks)
        B = self.batch_bucket(n)
        t0 = time.perf_counter()
        seeds = [p.seed if p.seed is not None else int(self._seed_rng.integers(2**31)) for p in ps]
        prev_rows = None
        if prev is not None:
            st, rows = prev
            prev_rows = PrevRows(ends=st.ends, pending=st.pending, keys=st.keys, draws=st.draws, rows=rows)
        plan = plan_batch(chunks, ps, seeds, capacity, batch=B, max_chunk=self.max_chunk, prev=prev_rows,
                          length_buckets=self.length_buckets, window_buckets=self.window_buckets,
                          split_prefill=self.split_prefill, split_min_rows=self.split_min_rows)

        params = self._params()
        # Kept rows that write nothing and were still generating decode on from their carried logits.
        carry = np.zeros((B,), bool)
        if prev is not None:
            st = prev[0]
            k, v, gather = st.k, st.v, True
            st.consumed = True
            kept_idle = (plan.src[:n] >= 0) & (plan.lens[:n] == 0)
            if st.carried is not None:
                carry[:n] = kept_idle & st.carried[np.maximum(plan.src[:n], 0)]
            # A kept row that writes nothing, holds no pending token and carries no logits has nothing
            # to decode from.
            lost = np.flatnonzero(kept_idle & ~carry[:n] & (plan.n_max[:n] > 0))
            if lost.size:
                raise ValueError(f"continue_: rows {lost.tolist()} append nothing to a row that holds no pending "
                                 f"token or carried logits, so they have nothing to decode from; append tokens "
                                 f"or ask for max_new_tokens=0")
        elif self._spare is not None and self._spare[0][0].shape[0] == B:
            k, v = self._spare
            gather = False
        else:
            k_shape, v_shape = qwen3.KVCache.shapes(self.cfg, B, plan.window)
            dt = qwen3.as_dtype(self.cfg.dtype)
            k = tuple(self._put(np.zeros(k_shape, dt), qwen3.CACHE_K_AXES) for _ in range(self.cfg.num_layers))
            v = tuple(self._put(np.zeros(v_shape, dt), qwen3.CACHE_V_AXES) for _ in range(self.cfg.num_layers))
            gather = False
        self._spare = None

        # Prefill, in chunks of at most max_chunk tokens per row.
        row = ("batch",)
        logits = None
        # Sub-batch prefills and a call that writes nothing work on the call's cache as it is: gather and
        # resize it first (a one-call prefill does that inside its program).
        if not plan.prefill or plan.prefill[0].groups is not None:
            if gather or k[0].shape[qwen3.CACHE_K_SLOT_AXIS] != plan.window:
                with _unusable_donations_ok():
                    k, v = self._prepare(k, v, self._put(plan.gather_rows, row), size=plan.window, gather=gather)
            gather = False
        if not plan.prefill:
            end_dev = self._put(plan.end_after.astype(np.int32), row)
        for chunk in plan.prefill:
            if chunk.groups is not None:
                if logits is None:
                    logits = self._put(np.zeros((B, self.cfg.vocab_size), np.float32), ("batch", None))
                last = chunk.last_for(plan.lens)
                for g in chunk.groups:
                    is_last = np.zeros(g.rows.shape, bool)
                    is_last[:g.n_real] = last[g.rows[:g.n_real]]
                    with _unusable_donations_ok():
                        # a sub-batch is not split over the mesh's batch axis (its size is any bucket)
                        logits, k, v = self._prefill_rows(
                            params, k, v, logits, self._put(g.rows, (None,)),
                            self._put(g.end.astype(np.int32), (None,)),
                            self._put(plan.group_tokens(chunk, g), (None, None)),
                            self._put(g.take.astype(np.int32), (None,)), self._put(is_last, (None,)))
                end_dev = self._put((chunk.end + chunk.take).astype(np.int32), row)
                continue
            with _unusable_donations_ok():
                lg, k, v, end_dev = self._prefill(
                    params, k, v, self._put(plan.gather_rows, row), self._put(chunk.end.astype(np.int32), row),
                    self._put(plan.chunk_tokens(chunk), ("batch", None)),
                    self._put(chunk.take.astype(np.int32), row), size=plan.window, gather=gather)
            gather = False
            last_here = chunk.last_for(plan.lens)
            logits = lg if logits is None else jnp.where(self._put(last_here, row)[:, None], lg, logits)
        if carry.any():
            held = shd.constrain(jnp.take(prev[0].logits, self._put(plan.gather_rows, row), axis=0),
                                 ("batch", None), self.mesh, self.rules)
            logits = held if logits is None else jnp.where(self._put(carry, row)[:, None], held, logits)
        if logits is None:   # no row writes or carries anything: none decodes
            logits = self._put(np.zeros((B, self.cfg.vocab_size), np.float32), ("batch", None))
        if self.timed:
            logits.block_until_ready()
        t1 = time.perf_counter()

        tokens, lps, n_gen, reason, k, v, end_dev, last_logits = self._decode(
            params, k, v, end_dev, logits, self._put(plan.keys, ("batch", None)), self._put(plan.draws, row),
            self._put(plan.temperature, row), self._put(plan.top_p, row), self._put(plan.top_k, row),
            self._put(plan.n_max.astype(np.int32), row), self._put(plan.cap_reason.astype(np.int32), row),
            self._put(plan.stop_ids, ("batch", None)), jnp.int32(B + 1 if min_done is None else min_done),
            budget=plan.budget)

        tokens, lps, n_gen, reason = jax.device_get((tokens, lps, n_gen, reason))
        st = self.stats
        st.calls += 1
        st.rows += n
        st.batch_rows += B
        steps = int(n_gen.max()) if n_gen.size else 0
        st.decode_steps += steps
        st.slot_steps += B * steps
        st.generated_tokens += int(n_gen.sum())
        st.prefill_tokens += int(plan.lens.sum())
        st.prefill_slots += sum(c.slots for c in plan.prefill)
        if self.timed:
            st.prefill_s += t1 - t0
            st.decode_s += time.perf_counter() - t1
        out = SamplerOutput(
            tokens=[tokens[i, : n_gen[i]].tolist() for i in range(n)],
            logprobs=[lps[i, : n_gen[i]].tolist() for i in range(n)],
            finish_reasons=[REASONS[int(reason[i])] for i in range(n)],
            lengths=[int(n_gen[i]) for i in range(n)],
            prefill_logits=logits[:n],
        )
        if return_state:
            running = (reason[:n] == RUNNING) & (n_gen[:n] > 0)
            ends, pending, draws = plan.next_state(tokens, n_gen, running)
            carried = running | (carry[:n] & (n_gen[:n] == 0))
            # float32 [B, V] kept only when a row needs it (at Qwen3's vocabulary, ~600 KB a row)
            out.state = SamplerState(k=k, v=v, ends=ends, pending=pending, keys=plan.keys[:n].copy(),
                                     draws=draws, capacity=capacity, logits=last_logits if carried.any() else None,
                                     carried=carried)
        else:
            self._spare = (k, v)
        return out
