"""The sampler's host side: ``Sampler`` checks a call's inputs, has ``sampling.plan`` plan it, places
the arrays on the devices, runs ``sampling.loop``'s programs and reads the results back.

One call (``Sampler._run``) goes through these steps, one method each: plan the call on the host,
take the cache it starts from, find the kept rows that decode from carried logits, write the new
tokens (prefill), choose the logits each row decodes from, decode, count the work, and read the
outputs and the next state back.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax import fast_defaults, jit_maps
from envace_jax import sharding as shd
from envace_jax.models import qwen3
from envace_jax.sampling.loop import SamplerPrograms
from envace_jax.sampling.prefill_writes import PrefillWrites
from envace_jax.sampling.plan import REASONS, RUNNING, BatchPlan, PrevRows, bucket, plan_batch
from envace_jax.sampling.records import SamplerOutput, SamplerState, SamplerStats, SamplingParams
from envace_jax.sampling.weights import PreparedWeights, weight_shardings


class Sampler(PrefillWrites):
    """Batched sampler over a live ``qwen3.Qwen3`` model (reads its current parameters each call).

    Keyword options:
      cache_size: tokens a row may hold (prompt + generated + appended); default per ``generate``
        call: bucketed prompt length + largest ``max_new_tokens``.
      max_chunk: longest chunk written by one prefill call (longer inputs are split); also the
        cache headroom (see ``sampling.loop``).
      length_buckets / batch_buckets: sorted sizes to round chunk lengths / batch sizes up to
        (default powers of two, chunks at least 16).
      window_buckets: sorted device-cache sizes to round a call's need up to (default four per
        power of two, at least 64); the size never exceeds ``capacity + headroom``.
      k_max: candidate count of the fast sampling path (see ``sampling.ops``).
      split_prefill: a prefill chunk whose rows write very different lengths (a rolling batch: resumed
        rows write a pending token and a short suffix, joining rows a whole prompt) runs as up to two sub-batch
        calls on the rows that write, instead of padding every row to the longest
        (``sampling.plan.split_rows``); same tokens, fewer computed slots. ``split_min_rows``: the
        smallest sub-batch (powers of two from it: fewer shapes to compile).
      mesh, rules: sample under this mesh; parameters are resharded to ``rules`` (default
        ``SAMPLE_RULES``) only if they are not already laid out that way.
      compiler_options: XLA options of the sampler's programs (``jax.jit(compiler_options=...)``), e.g.
        to time a scheduler setting against the default (``benchmarks/sampler.py --compare-options``).
      prepare_weights: keep the weights in the programs' per-layer layout between calls, made once per
        weights version (``sampling.weights``), instead of slicing them in every program call. Costs one
        more copy of the layer weights in memory; default: on CPU only (see ``sampling.loop``).
      fuse_projections: the prepared weights hold each layer's matrices ``[out, in]``, q/k/v and gate/up
        as one matrix each, and the head ``[V, D]`` (``qwen3.fuse_projections``): fewer, wider products per
        step, each faster on XLA CPU in that layout, same tokens. Default: with
        ``prepare_weights`` and no mesh (on a mesh, heads split over devices would not line up with
        the concatenation); needs ``prepare_weights`` (else every call would copy the weights).
      programs_of: another ``Sampler`` of a model with the same architecture (and the same options):
        this one runs that sampler's compiled programs instead of compiling its own (the programs take the
        weights as an argument). Several samplers over several weights versions of one model (the
        asynchronous pipeline's rollouts, ``rl.async_pipeline``) then compile each shape once.
      share_prompts: a ``generate`` call whose rows repeat a prompt (a GRPO group: ``n`` completions of
        each prompt) writes each distinct prompt into the cache once, then copies its cache rows and
        next-token logits to the rows that repeat it; every row still samples with its own seed.
        Same tokens as writing every row, up to float32 summation order. On one device only. Default
        (None): on without a mesh or on a mesh of one device (``envace_jax.fast_defaults``).
      record_routing: a Qwen3-MoE's sampler records the experts each generated token was routed to, in
        every sparse layer (``SamplerOutput.routing``), for routing replay in the update; default (None):
        on for a Qwen3-MoE. Costs ``rows x budget x sparse layers x k`` bytes of device memory per call.
    """

    def __init__(
        self,
        model: qwen3.Qwen3,
        *,
        cache_size: int | None = None,
        max_chunk: int = 512,
        length_buckets: Sequence[int] | None = None,
        batch_buckets: Sequence[int] | None = None,
        window_buckets: Sequence[int] | None = None,
        k_max: int = 64,
        mesh: jax.sharding.Mesh | None = None,
        rules: shd.Rules | None = None,
        seed: int = 0,
        split_prefill: bool = True,
        split_min_rows: int = 8,
        compiler_options: Mapping[str, Any] | None = None,
        prepare_weights: bool | None = None,
        fuse_projections: bool | None = None,
        share_prompts: bool | None = None,
        programs_of: "Sampler | None" = None,
        record_routing: bool | None = None,
    ):
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
        share_prompts = fast_defaults.share_repeated_prompts(share_prompts, self.mesh)
        if share_prompts and self.mesh is not None and self.mesh.size > 1:
            # The distinct prompts' batch is any size: it would not split over a mesh's batch axis.
            raise ValueError(f"Sampler(share_prompts=True) runs on one device, not on a mesh of {self.mesh.size}")
        self.share_prompts = bool(share_prompts)
        self.rules = dict(rules if rules is not None else shd.SAMPLE_RULES) if self.mesh is not None else None
        self._seed_rng = np.random.default_rng(seed)
        self.stats = SamplerStats()
        self.timed = False
        self._spare: tuple[jax.Array, jax.Array] | None = None
        # A second module object sharing the live arrays, carrying the sampling rules for activation
        # constraints; only its graphdef is used, the parameters come from `model` at every call.
        graphdef, state = nnx.split(model)
        shadow = nnx.merge(graphdef, state)
        shadow.set_sharding(self.mesh, self.rules)
        self._param_shardings = qwen3.param_shardings(model, self.mesh, self.rules) if self.mesh is not None else None
        devices = self.mesh.devices.flat if self.mesh is not None else jax.devices()
        cpu = all(d.platform == "cpu" for d in devices)
        self.prepare_weights = cpu if prepare_weights is None else bool(prepare_weights)
        if fuse_projections is None:
            fuse_projections = self.prepare_weights and self.mesh is None
        elif fuse_projections and not self.prepare_weights:
            raise ValueError("Sampler(fuse_projections=True) needs prepare_weights: else every call copies the weights")
        elif fuse_projections and self.mesh is not None:
            raise ValueError("Sampler(fuse_projections=True) is for a sampler without a mesh")
        self.fuse_projections = bool(fuse_projections)
        self.cache_dtype = qwen3.cache_dtype(self.cfg, cpu)
        self.compiler_options = dict(compiler_options) if compiler_options else None
        moe = hasattr(self.cfg, "num_experts")
        if record_routing and not moe:
            raise ValueError("Sampler(record_routing=True): a dense Qwen3 has no experts to record")
        self.record_routing = moe if record_routing is None else bool(record_routing)
        if programs_of is not None:
            self._programs = self._shared_programs(programs_of, nnx.graphdef(shadow))
        else:
            self._programs = self._new_programs(shadow, model, cpu)
        self._prepared = PreparedWeights(model, self._programs.prepare_weights)
        # The calls `_run` makes (attributes, so a test can wrap them and see the arguments of a real call).
        self._prefill, self._prepare = self._programs.prefill, self._programs.prepare
        self._prefill_rows, self._decode = self._programs.prefill_rows, self._programs.decode

    def _new_programs(self, shadow, model, cpu: bool) -> SamplerPrograms:
        return SamplerPrograms(
            nnx.graphdef(shadow),
            mesh=self.mesh,
            rules=self.rules,
            k_max=self.k_max,
            cpu=cpu,
            fuse=self.fuse_projections,
            compiler_options=self.compiler_options,
            record_routing=self.record_routing,
            weight_shardings=weight_shardings(model, self.mesh, self.rules, transpose_head=cpu)
            if self.prepare_weights
            else None,
        )

    def _shared_programs(self, other: "Sampler", graphdef) -> SamplerPrograms:
        """``other``'s programs, after checking they compute what this sampler's own would."""
        mine = (
            graphdef,
            self.mesh,
            self.rules,
            self.k_max,
            self.fuse_projections,
            self.compiler_options,
            self.record_routing,
        )
        theirs = (
            other._programs._graphdef,
            other.mesh,
            other.rules,
            other.k_max,
            other.fuse_projections,
            other.compiler_options,
            other.record_routing,
        )
        names = ("model graph", "mesh", "rules", "k_max", "fuse_projections", "compiler_options", "record_routing")
        differ = [n for n, a, b in zip(names, mine, theirs) if a != b]
        if differ or self.prepare_weights != other.prepare_weights:
            raise ValueError(f"Sampler(programs_of=...): the other sampler differs in {differ or ['prepare_weights']}")
        return other._programs

    @property
    def num_compilations(self) -> int:
        """XLA compilations made during this sampler's calls so far (a few per new shape bucket: its
        programs and the eager ops around them; a repeated call with the same buckets adds none)."""
        return self._programs.num_compilations

    # ---------------------------------------------------------------- ahead-of-time compilation
    def program_specs(self, batch: int, chunk: int, window: int, budget: int, stop_width: int = 4):
        """The compiled programs at one shape bucket, with abstract arguments (``sampling.specs``)."""
        from envace_jax.sampling.specs import program_specs

        return program_specs(self, batch, chunk, window, budget, stop_width)

    # ---------------------------------------------------------------- host side
    def _params(self):
        """The model state as the programs take it: on a mesh, leaves resharded to the sampling rules
        where they are not laid out that way, except, with ``prepare_weights``, the stacked layer arrays,
        which only the preparation reads (it lays out its per-layer output itself)."""
        state = nnx.state(self.model)
        if self._param_shardings is None:
            return state
        flat, treedef = jax.tree_util.tree_flatten_with_path(state)
        targets = jax.tree.leaves(self._param_shardings)
        out = []
        for (path, a), s in zip(flat, targets):
            keep = self._read_in_place(path) or getattr(a, "sharding", None) == s
            out.append(a if keep else jax.device_put(a, s))
        return treedef.unflatten(out)

    def _read_in_place(self, path) -> bool:
        """Whether the state leaf at ``path`` goes to the programs where it lies: the stacked layer arrays,
        when only the weight preparation reads them."""
        return self.prepare_weights and getattr(path[0], "key", None) == "layers"

    def _weights(self, params) -> qwen3.DecodeWeights | None:
        """The per-layer weights (and CPU head) every program reads, prepared once per weights version
        (``sampling.weights``); None without ``prepare_weights``: the programs slice the weights themselves."""
        if not self.prepare_weights:
            return None
        before = self._prepared.preparations
        weights = self._prepared.get(params)
        self.stats.weight_preparations += self._prepared.preparations - before
        return weights

    @property
    def prepared_weights(self) -> qwen3.DecodeWeights | None:
        """The prepared weights held now (None: not prepared yet, released, or ``prepare_weights`` off)."""
        return self._prepared.current

    def release_weights(self) -> None:
        """Drops the prepared weights (the next call prepares them again), e.g. to keep their copy out
        of the memory peak of an optimizer update that shares the devices."""
        self._prepared.release()

    def _put(self, x: np.ndarray, logical: tuple):
        """``x`` on the device(s), always committed: a program's outputs are committed (the parameters
        are, once placed), and a cache reused from the last call must match the placement of a freshly
        made one, or jit compiles the program again for the new placement."""
        if self.mesh is None:
            return jax.device_put(x, self._device())
        return jax.device_put(x, shd.named_sharding(self.mesh, logical, self.rules, x.shape))

    def _zeros(self, shape: tuple, dtype, logical: tuple) -> jax.Array:
        """Zeros made on the device(s), placed (and committed) as ``_put`` places arrays."""
        if self.mesh is None:
            return jnp.zeros(shape, dtype, device=self._device())
        return jnp.zeros(shape, dtype, device=shd.named_sharding(self.mesh, logical, self.rules, shape))

    def _device(self) -> jax.Device:
        """The single device the parameters live on (no mesh)."""
        leaf = jax.tree.leaves(nnx.state(self.model))[0]
        return next(iter(leaf.devices()))

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

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        return_state: bool = False,
        min_done: int | None = None,
    ) -> SamplerOutput:
        """Samples a continuation of every prompt (outputs: see the package docstring, ``envace_jax.sampling``).

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

    def continue_(
        self,
        state: SamplerState,
        appended: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        rows: Sequence[int] | None = None,
        return_state: bool = False,
        min_done: int | None = None,
    ) -> SamplerOutput:
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
        """One call of ``generate`` (``prev`` None) or ``continue_`` (``prev``: the state and, per call row,
        the row of it that the call row continues, -1 for a fresh prompt); ``chunks[i]`` the checked tokens
        row ``i`` appends, ``ps[i]`` its params. The steps are the methods below, in this order."""
        if min_done is not None and min_done < 1:
            raise ValueError(f"min_done={min_done} must be >= 1 (or None: decode until every row is done)")
        # A run that compiles many shapes would otherwise hit vm.max_map_count and crash in a compile.
        jit_maps.release_if_near_limit()
        with self._programs.counting_compiles():
            return self._run_counted(prev, chunks, ps, capacity, return_state, min_done)

    def _run_counted(self, prev, chunks, ps, capacity: int, return_state: bool, min_done: int | None):
        t0 = time.perf_counter()
        state, rows = prev if prev is not None else (None, None)
        plan = self._plan_call(state, rows, chunks, ps, capacity)
        params = self._params()
        weights = self._weights(params)
        if state is not None:
            state.consumed = True  # its cache goes to this call's programs, which donate it
        carry = self._carried_rows(state, plan)
        shared = self._shared_prompt_plan(chunks, ps, plan) if state is None and self.share_prompts else None
        if shared is None:
            k, v, gather = self._starting_cache(state, plan)
            logits, k, v, end = self._write_inputs(params, weights, k, v, gather, plan)
        else:
            logits, k, v, end = self._write_shared_prompts(params, weights, plan, *shared)
        logits = self._decode_start_logits(logits, state, plan, carry)
        if self.timed:
            logits.block_until_ready()
        t1 = time.perf_counter()
        tokens, lps, n_gen, reason, k, v, _, last_logits, *routes = self._run_decode(
            params, weights, k, v, end, logits, plan, min_done
        )
        tokens, lps, n_gen, reason, routes = jax.device_get((tokens, lps, n_gen, reason, routes))
        self._count(plan, n_gen, t0, t1, prefill_plan=shared[0] if shared is not None else plan)
        out = self._output(plan, tokens, lps, n_gen, reason, logits)
        if routes:  # [B, budget, Ls, k]: each row's generated tokens' experts
            out.routing = [routes[0][i, : n_gen[i]] for i in range(plan.n)]
        if return_state:
            out.state = self._next_state(plan, tokens, n_gen, reason, carry, k, v, last_logits)
        else:
            self._spare = (k, v)
        return out

    def _plan_call(self, state: SamplerState | None, rows: np.ndarray | None, chunks, ps, capacity: int) -> BatchPlan:
        """Everything the call decides before touching the device (row resume, room, prefill chunks, cache
        window, decode budget), in numpy, by ``plan.plan_batch``: one place, testable without a model.
        Rows without a seed draw one here, in row order, from the sampler's own seed stream."""
        seeds = [p.seed if p.seed is not None else int(self._seed_rng.integers(2**31)) for p in ps]
        prev_rows = None
        if state is not None:
            prev_rows = PrevRows(ends=state.ends, pending=state.pending, keys=state.keys, draws=state.draws, rows=rows)
        return self._plan(chunks, ps, seeds, capacity, prev_rows)

    def _plan(self, chunks, ps, seeds, capacity: int, prev: PrevRows | None = None) -> BatchPlan:
        """``plan.plan_batch`` of ``chunks`` under this sampler's batch, length and window buckets and
        prefill settings (every plan of a call is made here, so they agree on the cache window)."""
        return plan_batch(
            chunks,
            ps,
            seeds,
            capacity,
            batch=self.batch_bucket(len(chunks)),
            max_chunk=self.max_chunk,
            prev=prev,
            length_buckets=self.length_buckets,
            window_buckets=self.window_buckets,
            split_prefill=self.split_prefill,
            split_min_rows=self.split_min_rows,
        )

    def _carried_rows(self, state: SamplerState | None, plan: BatchPlan) -> np.ndarray:
        """bool ``[batch]``: kept rows that write nothing and were still generating when the last call
        returned (``min_done``); they decode on from the logits the state carries, not from a prefill.

        A kept row that writes nothing, holds no pending token and carries no logits has nothing to
        decode from: refused here rather than decoded from zero logits."""
        carry = np.zeros((plan.batch,), bool)
        if state is None:
            return carry
        n = plan.n
        kept_idle = (plan.src[:n] >= 0) & (plan.lens[:n] == 0)
        if state.carried is not None:
            carry[:n] = kept_idle & state.carried[np.maximum(plan.src[:n], 0)]
        lost = np.flatnonzero(kept_idle & ~carry[:n] & (plan.n_max[:n] > 0))
        if lost.size:
            raise ValueError(
                f"continue_: rows {lost.tolist()} append nothing to a row that holds no pending "
                f"token or carried logits, so they have nothing to decode from; append tokens "
                f"or ask for max_new_tokens=0"
            )
        return carry

    def _starting_cache(self, state: SamplerState | None, plan: BatchPlan):
        """(k, v, gather): the cache the call starts from, before any gather or resize.

        A continuation starts from the state's cache (``gather``: its rows are picked by ``plan.src``); a
        fresh call reuses the cache the previous call without ``return_state`` left behind when its shape
        (batch and window) is the call's (no new allocation: the prefill writes into it in place), else
        allocates zeros on the device. Only an exact match is reused: a spare resized by the prefill would
        make a program per (old window, new window) pair, and the resize allocates the new window anyway.
        The spare is dropped either way, so at most one cache outlives its call."""
        k_shape, v_shape = qwen3.KVCache.shapes(self.cfg, plan.batch, plan.window)
        if state is not None:
            k, v, gather = state.k, state.v, True
        elif self._spare is not None and self._spare[0][0].shape == k_shape:
            (k, v), gather = self._spare, False
        else:
            self._spare = None  # freed before the new cache is made
            dt = self.cache_dtype
            k = tuple(self._zeros(k_shape, dt, qwen3.CACHE_K_AXES) for _ in range(self.cfg.num_layers))
            v = tuple(self._zeros(v_shape, dt, qwen3.CACHE_V_AXES) for _ in range(self.cfg.num_layers))
            gather = False
        self._spare = None
        return k, v, gather

    def _decode_start_logits(self, logits, state: SamplerState | None, plan: BatchPlan, carry: np.ndarray):
        """float32 ``[B, V]``: the logits each row's first sampled token comes from: the prefill's, or,
        for ``carry`` rows, the ones the state carried; zeros when no row writes or carries anything
        (then no row decodes)."""
        row = ("batch",)
        if carry.any():
            held = shd.constrain(
                jnp.take(state.logits, self._put(plan.gather_rows, row), axis=0), ("batch", None), self.mesh, self.rules
            )
            logits = held if logits is None else jnp.where(self._put(carry, row)[:, None], held, logits)
        if logits is None:
            logits = self._put(np.zeros((plan.batch, self.cfg.vocab_size), np.float32), ("batch", None))
        return logits

    def _run_decode(self, params, weights, k, v, end, logits, plan: BatchPlan, min_done: int | None):
        """The on-device decode loop over the plan's per-row values (device arrays: tokens, logprobs,
        generated counts, reasons, k, v, end, last logits; see ``SamplerPrograms._decode_impl``).
        Without ``min_done`` the loop's early stop is set past the batch (``batch + 1`` rows), so it runs
        until every row is done or the budget is spent."""
        row = ("batch",)
        return self._decode(
            params,
            weights,
            k,
            v,
            end,
            logits,
            self._put(plan.keys, ("batch", None)),
            self._put(plan.draws, row),
            self._put(plan.temperature, row),
            self._put(plan.top_p, row),
            self._put(plan.top_k, row),
            self._put(plan.n_max.astype(np.int32), row),
            self._put(plan.cap_reason.astype(np.int32), row),
            self._put(plan.stop_ids, ("batch", None)),
            jnp.int32(plan.batch + 1 if min_done is None else min_done),
            budget=plan.budget,
        )

    def _count(self, plan: BatchPlan, n_gen: np.ndarray, t0: float, t1: float, prefill_plan: BatchPlan) -> None:
        """Adds the call's work to ``self.stats`` (rows, padded slots, decode steps, prefill tokens and
        slots; wall seconds only when ``timed``), so callers can account utilisation and padding.
        ``prefill_plan``: the plan whose prefill ran (``plan``, or the distinct prompts' one)."""
        st = self.stats
        st.calls += 1
        st.rows += plan.n
        st.batch_rows += plan.batch
        steps = int(n_gen.max()) if n_gen.size else 0
        st.decode_steps += steps
        st.slot_steps += plan.batch * steps
        st.generated_tokens += int(n_gen.sum())
        st.prefill_tokens += int(prefill_plan.lens.sum())
        st.prefill_slots += sum(c.slots for c in prefill_plan.prefill)
        if self.timed:
            st.prefill_s += t1 - t0
            st.decode_s += time.perf_counter() - t1

    def _output(self, plan: BatchPlan, tokens, lps, n_gen, reason, logits) -> SamplerOutput:
        """The call's rows (batch padding dropped), each cut to the tokens it generated."""
        n = plan.n
        return SamplerOutput(
            tokens=[tokens[i, : n_gen[i]].tolist() for i in range(n)],
            logprobs=[lps[i, : n_gen[i]].tolist() for i in range(n)],
            finish_reasons=[REASONS[int(reason[i])] for i in range(n)],
            lengths=[int(n_gen[i]) for i in range(n)],
            prefill_logits=logits[:n],
        )

    def _next_state(self, plan: BatchPlan, tokens, n_gen, reason, carry, k, v, last_logits) -> SamplerState:
        """What ``continue_`` needs of this call: the cache, and per row its end, pending token and PRNG
        draws (``BatchPlan.next_state``); rows still running, and carried rows that sat this call out,
        carry their next-token logits."""
        n = plan.n
        running = (reason[:n] == RUNNING) & (n_gen[:n] > 0)
        ends, pending, draws = plan.next_state(tokens, n_gen, running)
        carried = running | (carry[:n] & (n_gen[:n] == 0))
        # float32 [B, V] kept only when a row needs it (at Qwen3's vocabulary, ~600 KB a row)
        return SamplerState(
            k=k,
            v=v,
            ends=ends,
            pending=pending,
            keys=plan.keys[:n].copy(),
            draws=draws,
            capacity=plan.capacity,
            logits=last_logits if carried.any() else None,
            carried=carried,
        )
