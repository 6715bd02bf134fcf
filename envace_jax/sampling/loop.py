"""The sampler's compiled programs: prefill (write a chunk of tokens into the KV cache) and decode (the
on-device loop that samples, records and feeds one token per step).

They carry out what ``sampling.plan`` decided on the host; ``sampling.client.Sampler`` places the
arrays and calls them. Every program is jitted once per shape bucket (batch, chunk length, cache
length, token budget); per-row sampling values are arrays, so changing them never recompiles.
``SamplerPrograms.num_compilations`` counts the XLA compilations made during the sampler's calls
(``counting_compiles``), not traces: jit also compiles again, without tracing, when an argument's
placement changes (a committed array where an uncommitted one was), and that must show in the count.

Cache sizing (why the cache has ``headroom``): the model writes a padded chunk at ``end[b] + t``
and drops slots past the cache (see ``qwen3``). A row may hold at most ``capacity`` tokens; the
device cache may grow to ``capacity + headroom`` slots and every chunk is at most ``headroom`` long,
so every valid token of a chunk has a slot, even in the largest window; rows that are full or
finished write padding past ``end``, which is never read.
The device cache itself is sized per call to the bucket of what the batch needs, so attention in the
decode loop runs over the live window rather than the whole capacity.

Weights: the cached forward reads each layer's weights as a buffer of its own (``qwen3.DecodeWeights``),
sliced out of the model's stacked arrays (and, unfused on CPU, a tied head transposed). On CPU the client
has ``prepare_weights`` do that once per weights version (``sampling.weights``), with each layer's
matrices ``[out, in]``, q/k/v and gate/up concatenated (``fuse``; the head is then the ``[V, D]`` table),
and passes the result to every program, so no call copies the weights (at Qwen3-0.6B float32 the copies
were 1.9 GB in the prefill and 2.4 GB in the decode, and their page faults cost seconds per call). Passed
``weights=None`` (the default on accelerators, where the copy is a fraction of a millisecond per GB of HBM
and a persistent second copy would sit in the memory of the update), the programs slice the weights
themselves, once per call, unfused.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import qwen3
from envace_jax.sampling.ops import sample_tokens
from envace_jax.sampling.plan import STOP


def routing_dtype(num_experts: int):
    """The dtype a sampler records expert ids in: uint8 up to 256 experts (Qwen3-MoE has 128), else int16."""
    return jnp.uint8 if num_experts <= 256 else jnp.int16


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


# jax.monitoring's event for one XLA compilation (a backend compile of a jitted program, whether or not the
# persistent cache answers it); its name is jax's, recorded here since the constant lives in a private module.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_counting = threading.local()  # .programs: the SamplerPrograms whose call runs on this thread, if any
_listener_lock = threading.Lock()
_listening = False


def _on_event_duration(event: str, duration: float, **kwargs) -> None:
    programs = getattr(_counting, "programs", None)
    if programs is not None and event == BACKEND_COMPILE_EVENT:
        programs.num_compilations += 1


def _listen_for_compiles() -> None:
    """Registers the one process-wide compile listener, on first use (not at import time)."""
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_event_duration)
            _listening = True


@contextlib.contextmanager
def unusable_donations_ok():
    """Prefill donates the cache; XLA warns when it cannot reuse a buffer (e.g. a resize), which is fine."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        yield


class SamplerPrograms:
    """The jitted programs of one sampler, over one model graph and one layout.

    ``graphdef``: the model's graph (parameters are passed to every call, so the programs always read
    the live ones); ``mesh``/``rules``: the layout activations and the cache are constrained to (no
    mesh: single device); ``k_max``: candidate count of the fast sampling path (``sampling.ops``);
    ``cpu``: the devices are CPUs (the unfused decode loop then keeps the output head transposed, see
    ``qwen3.Qwen3.decode_weights``); ``fuse``: ``prepare_weights`` lays each layer's matrices out
    ``[out, in]`` and concatenates q/k/v and gate/up (``qwen3.fuse_projections``); ``compiler_options``:
    XLA options of every program; ``record_routing``: a Qwen3-MoE's decode also returns the experts of every
    generated token (``routing_dtype``).

    The jitted callables: ``prepare_weights`` (the per-layer weights every other program reads),
    ``prefill`` (gather, resize, write one chunk), ``prepare`` (gather and resize only), ``prefill_rows``
    (write one chunk on a sub-batch) and ``decode``. The writing programs take ``params`` (the model
    state: embedding, norms, head) and ``weights`` (``prepare_weights``'s output, or None: sliced in
    the program).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        *,
        mesh: jax.sharding.Mesh | None,
        rules: shd.Rules | None,
        k_max: int,
        cpu: bool,
        fuse: bool = False,
        compiler_options: Mapping[str, Any] | None = None,
        weight_shardings: Any = None,
        record_routing: bool = False,
    ):
        self._graphdef = graphdef
        self.record_routing = bool(record_routing)
        self.mesh, self.rules = mesh, rules
        self.k_max, self._cpu, self._fuse = int(k_max), bool(cpu), bool(fuse)
        self.num_compilations = 0
        _listen_for_compiles()
        jit = functools.partial(jax.jit, compiler_options=dict(compiler_options) if compiler_options else None)
        # weight_shardings: where prepare_weights puts its output (the sampling layout), on a mesh
        self.weight_shardings = weight_shardings
        self.prepare_weights = jit(self._prepare_weights_impl, out_shardings=weight_shardings)
        self.prefill = jit(self._prefill_impl, static_argnames=("size", "gather"), donate_argnums=(2, 3))
        self.prepare = jit(self._prepare_impl, static_argnames=("size", "gather"), donate_argnums=(0, 1))
        self.prefill_rows = jit(self._prefill_rows_impl, donate_argnums=(2, 3, 4))
        self.decode = jit(self._decode_impl, static_argnames=("budget",), donate_argnums=(2, 3))

    @contextlib.contextmanager
    def counting_compiles(self):
        """Counts in ``num_compilations`` every XLA compilation this thread makes inside the block (a
        sampler call: its programs and the few eager ops around them); compilation is synchronous, so
        another thread's compiles never land here."""
        outer = getattr(_counting, "programs", None)
        _counting.programs = self
        try:
            yield
        finally:
            _counting.programs = outer

    def _cache_constrain(self, k, v):
        return (
            tuple(shd.constrain(a, qwen3.CACHE_K_AXES, self.mesh, self.rules) for a in k),
            tuple(shd.constrain(a, qwen3.CACHE_V_AXES, self.mesh, self.rules) for a in v),
        )

    def _prepare_weights_impl(self, params) -> qwen3.DecodeWeights:
        """params: model state -> the per-layer weights (fused with ``fuse``; on CPU, a ``[D, V]`` head too)
        the cached forward reads (``qwen3.Qwen3.decode_weights``)."""
        return nnx.merge(self._graphdef, params).decode_weights(transpose_head=self._cpu, fuse=self._fuse)

    def _prefill_impl(self, params, weights, k, v, src, end, tokens, lens, *, size: int, gather: bool):
        """Writes one chunk per row into the (gathered, resized) cache.

        Shapes: params: model state; weights: ``prepare_weights(params)`` or None; k, v: per-layer tuples of
        ``[B_old, K, H, S_old]`` and ``[B_old, K, S_old, H]`` (see ``qwen3.KVCache``); src int32 ``[B]``
        rows of the old cache to keep (only if ``gather``); end int32 ``[B]`` tokens already held; tokens
        int32 ``[B, T]`` right-padded; lens int32 ``[B]`` valid tokens (0 = write nothing).
        Returns (logits float32 ``[B, V]`` at each row's last valid token, k, v with ``size`` slots,
        new end ``[B]``).
        """
        k, v = self._gather_resize(k, v, src, size, gather)
        model = nnx.merge(self._graphdef, params)
        logits, cache = model(
            tokens,
            cache=qwen3.KVCache(k, v, end),
            chunk_lengths=lens,
            logits_at=jnp.maximum(lens - 1, 0),
            decode_weights=weights,
        )
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
        return self._gather_resize(k, v, src, size, gather)

    def _prefill_rows_impl(self, params, weights, k, v, logits, rows, end, tokens, lens, is_last):
        """``_prefill_impl`` on the sub-batch ``rows`` (int32 ``[b]``, distinct) of the cache: their
        cache rows are gathered, written at ``end`` (``[b]``) with ``tokens`` ``[b, T]`` / ``lens``
        ``[b]``, and scattered back; ``logits`` ``[B, V]`` takes the new logits where ``is_last``."""
        model = nnx.merge(self._graphdef, params)
        sub = qwen3.KVCache(tuple(a[rows] for a in k), tuple(a[rows] for a in v), end)
        lg, cache = model(
            tokens, cache=sub, chunk_lengths=lens, logits_at=jnp.maximum(lens - 1, 0), decode_weights=weights
        )
        k = tuple(a.at[rows].set(n) for a, n in zip(k, cache.k))
        v = tuple(a.at[rows].set(n) for a, n in zip(v, cache.v))
        logits = logits.at[rows].set(jnp.where(is_last[:, None], lg.astype(logits.dtype), logits[rows]))
        return logits, *self._cache_constrain(k, v)

    def _decode_impl(
        self,
        params,
        weights,
        k,
        v,
        end,
        logits,
        keys,
        draws,
        temperature,
        top_p,
        top_k,
        n_max,
        cap_reason,
        stop_ids,
        min_done,
        *,
        budget: int,
    ):
        """On-device decode loop.

        Shapes: params, weights as in ``_prefill_impl``; k, v per-layer tuples (see ``qwen3.KVCache``); end int32
        ``[B]``; logits float32 ``[B, V]`` (next-token logits after the prefill, or carried from the previous call);
        keys uint32 ``[B, 2]``; draws int32 ``[B]`` draws already made by each row; temperature/top_p float32
        ``[B]``; top_k, n_max (tokens this row may generate), cap_reason (reason when n_max is reached) int32
        ``[B]``; stop_ids int32 ``[B, S_max]`` padded with -1; min_done int32 scalar: stop once this many rows that
        started live are done (the rest report ``RUNNING``). Returns tokens int32 ``[B, budget]``, logprobs float32
        ``[B, budget]``, n int32 ``[B]`` generated, reason int32 ``[B]``, k, v, end, and the logits after each row's
        last fed token (see ``SamplerState.carried``); with ``record_routing``, then the experts each token was
        routed to as it was fed, ``[B, budget, Ls, k]`` in ``routing_dtype``.
        """
        B = logits.shape[0]
        model = nnx.merge(self._graphdef, params)
        record = self.record_routing
        if weights is None:  # sliced once, outside the loop: the body then reads each layer where it lies
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
        c0 = (
            jnp.zeros((B, budget), jnp.int32),
            jnp.zeros((B, budget), jnp.float32),
            jnp.zeros((B,), jnp.int32),
            start,
            jnp.where(start, cap_reason, 0),
        )
        if record:
            cfg = model.config
            shape = (B, budget, len(cfg.sparse_layers), cfg.num_experts_per_tok)
            routes0 = jnp.zeros(shape, routing_dtype(cfg.num_experts))

        def cond(carry):
            i, c = carry[0], carry[5]
            finished = jnp.sum((c[3] & ~start).astype(jnp.int32))
            return (i < budget) & ~jnp.all(c[3]) & (finished < min_done)

        def body(carry):
            i, k, v, end, logits, c, *routes = carry
            tok, c = emit(i, logits, c)
            live = ~c[3]

            # Finished rows feed nothing (chunk length 0); their write lands at `end`, past what they
            # hold, and a later chunk overwrites it before any valid query can see it.
            # The step that finishes the last row does one forward nobody reads: cheaper than a
            # lax.cond, whose branches may copy the whole cache on CPU.
            logits, cache, *step_routes = model(
                tok[:, None],
                cache=qwen3.KVCache(k, v, end),
                chunk_lengths=live.astype(jnp.int32),
                logits_at=jnp.zeros((B,), jnp.int32),
                decode_weights=weights,
                return_routing=record,
            )
            if record:  # token i's experts [Ls, B, 1, k] -> column i (entries past a row's count are never read)
                routes = [routes[0].at[:, i].set(jnp.moveaxis(step_routes[0][:, :, 0], 0, 1).astype(routes[0].dtype))]
            return i + 1, cache.k, cache.v, cache.end, logits, c, *routes

        init = (jnp.int32(0), k, v, end, logits, c0, *((routes0,) if record else ()))
        _, k, v, end, last, c, *routes = jax.lax.while_loop(cond, body, init)
        tokens, lps, n, _, reason = c
        # Rows still running fed their last token: `last` holds their next-token logits. Rows that never
        # decoded keep the logits they came with (a carried row may sit out a call).
        last = shd.constrain(jnp.where(start[:, None], logits, last), ("batch", None), self.mesh, self.rules)
        return tokens, lps, n, reason, *self._cache_constrain(k, v), end, last, *routes

    def decode_setup(self, params):
        """What ``decode`` called with ``weights=None`` does once per call before its loop (the weights it
        prepares), as a function of its own: XLA's cost analysis counts a loop body once, so a decode
        step's cost is the decode program's cost less this one's (``envace_jax.aot``)."""
        w = nnx.merge(self._graphdef, params).decode_weights(transpose_head=self._cpu)
        return w.layers, w.head
