"""Qwen3-MoE's sparse MLP block: the router and dropless experts, with one interface and three dispatches.

Routing (as transformers' ``Qwen3MoeTopKRouter``): logits ``h @ W_router`` in the compute dtype, a softmax
over all experts in float32, the top ``k`` probabilities, divided by their sum when ``norm_topk_prob``.
Every token reaches its ``k`` experts (dropless, as MaxText's and Tunix's defaults): with a capacity a
token's output would depend on the rest of the batch, and in RL the sampler's batch is not the update's.

``route`` also takes recorded expert ids (routing replay, issue 51 item 4): the same experts are used, and
their weights still come from this forward's router probabilities, so the router keeps its gradient.

Expert weights are stacked ``gate``/``up`` ``[E, D, F]`` and ``down`` ``[E, F, D]`` (``[in, out]`` like the
dense projections). The dispatches compute the same block (``experts``):

- ``"dense"``: every expert on every token, weighted by a ``[T, E]`` matrix that is zero off the top k.
  E times the work; a reference and the cheapest choice for a handful of experts.
- ``"ragged"``: the token copies sorted by expert and ``jax.lax.ragged_dot`` over the groups: the grouped
  matmul MaxText and Tunix run on TPU. XLA CPU expands it into a dense masked product (about E times the
  work), so it is not the CPU path.
- ``"megablox"``: the sorted copies through megablox's grouped matmul (``jax.experimental.pallas.ops.tpu.megablox``,
  a Pallas TPU kernel whose backward computes the weight gradient group by group, ``tgmm``). On TPU, XLA's own
  ``ragged_dot`` gradient with respect to the experts' weights is a dense product over every expert (E times the
  work: 42.6 TFLOP a layer per v5p chip for a Qwen3-30B-A3B update at 4,096 tokens a chip, ahead of time,
  docs/moe.md). Interpreted (slowly) on CPU, for tests.
- ``"blocked"``: the sorted copies padded per expert to blocks of ``block`` rows; a scan runs one
  ``[block, D] x [D, F]`` product per block with that block's expert's weights, skipping blocks past the
  last used one. Work ~ (T k + E block) rows instead of T E: the CPU path at many experts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

DISPATCHES = ("dense", "ragged", "blocked", "megablox")


class Routing(NamedTuple):
    weights: jax.Array  # float32 [T, k]: each token's weight for each of its experts
    experts: jax.Array  # int32 [T, k]: the experts used, most probable first unless replayed
    logits: jax.Array  # float32 [T, E]: the router logits (for the load-balancing loss)
    own: jax.Array  # int32 [T, k]: the router's own top k (equal to experts without replay)


def route(h2: jax.Array, router: jax.Array, top_k: int, norm_topk_prob: bool, replay: jax.Array | None = None):
    """``Routing`` of tokens ``h2`` ``[T, D]`` under ``router`` ``[D, E]``. ``replay`` (int ``[T, k]``): use
    these experts instead of the top k (routing replay), their weights this forward's probabilities; a token
    whose row holds -1 (nothing recorded) takes its own top k."""
    logits = jnp.dot(h2, router.astype(h2.dtype), preferred_element_type=jnp.float32).astype(h2.dtype)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, own = jax.lax.top_k(probs, top_k)
    experts = own
    if replay is not None:
        if replay.shape != (h2.shape[0], top_k):
            raise ValueError(f"routing replay: expert ids {replay.shape}, expected {(h2.shape[0], top_k)}")
        recorded = replay[:, :1] >= 0
        experts = jnp.where(recorded, replay.astype(jnp.int32), own)
        weights = jnp.take_along_axis(probs, experts, axis=-1)
    if norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return Routing(weights, experts.astype(jnp.int32), logits.astype(jnp.float32), own.astype(jnp.int32))


def _swiglu(x, gate, up, down):
    """SwiGLU expert MLP of rows ``x`` ``[M, D]``, accumulated in float32, returned in x's dtype."""
    g = jnp.dot(x, gate, preferred_element_type=jnp.float32)
    u = jnp.dot(x, up, preferred_element_type=jnp.float32)
    a = (jax.nn.silu(g) * u).astype(x.dtype)
    return jnp.dot(a, down, preferred_element_type=jnp.float32).astype(x.dtype)


def _dense(h2, r: Routing, gate, up, down):
    E = gate.shape[0]
    mix = jnp.zeros((h2.shape[0], E), jnp.float32).at[jnp.arange(h2.shape[0])[:, None], r.experts].add(r.weights)
    each = jax.vmap(lambda g, u, d: _swiglu(h2, g, u, d))(gate, up, down)  # [E, T, D]
    return jnp.einsum("te,etd->td", mix, each.astype(jnp.float32))


def _sorted_copies(r: Routing, num_experts: int):
    """(the token of each copy in expert order, that order, the copies' experts ``[T k]`` in token order,
    the number of copies of each expert ``[E]``)."""
    k = r.experts.shape[1]
    flat = r.experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    return order // k, order, flat, jnp.zeros((num_experts,), jnp.int32).at[flat].add(1)


def _combine(y_sorted, order, r: Routing):
    """Copies' outputs in expert order ``[T k, D]`` -> the tokens' weighted sums ``[T, D]`` (float32)."""
    T, k = r.experts.shape
    y = jnp.zeros_like(y_sorted).at[order].set(y_sorted)
    return jnp.einsum("tkd,tk->td", y.reshape(T, k, -1).astype(jnp.float32), r.weights)


def _grouped(h2, r: Routing, gate, up, down, matmul, row_multiple: int = 1):
    """The SwiGLU experts over the token copies sorted by expert, ``matmul(x, w, group_sizes)`` a grouped matmul
    with a float32 result. ``row_multiple``: the copies are padded with zero rows to a multiple of it, the padding
    counted in the last expert's group and dropped after."""
    token, order, _, sizes = _sorted_copies(r, gate.shape[0])
    M = token.shape[0]
    pad = (-M) % row_multiple
    x = jnp.pad(h2[token], ((0, pad), (0, 0)))
    sizes = sizes.at[-1].add(pad)
    a = (jax.nn.silu(matmul(x, gate, sizes)) * matmul(x, up, sizes)).astype(h2.dtype)
    y = matmul(a, down, sizes).astype(h2.dtype)[:M]
    return _combine(y, order, r)


def _ragged(h2, r: Routing, gate, up, down):
    mm = lambda x, w, sizes: jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)
    return _grouped(h2, r, gate, up, down, mm)


@jax.custom_vjp
def _block_matmul(x: jax.Array, w: jax.Array, block_expert: jax.Array, used: jax.Array) -> jax.Array:
    """``[n, b, K] x [E, K, N] -> [n, b, N]``: block i times its expert's matrix ``w[block_expert[i]]``, float32;
    zeros for blocks not ``used``. A scan of one product per block; the custom backward is two more scans
    (the input's gradient block by block, the weights' gradient added in place per block), so neither pass
    keeps a per-block copy of an expert's weights."""
    return _block_matmul_fwd(x, w, block_expert, used)[0]


def _one_block(xb, wb, u):
    return jax.lax.cond(
        u,
        lambda: jnp.dot(xb, wb, preferred_element_type=jnp.float32),
        lambda: jnp.zeros((xb.shape[0], wb.shape[1]), jnp.float32),
    )


def _block_matmul_fwd(x, w, block_expert, used):
    def step(_, xs):
        xb, e, u = xs
        return None, _one_block(xb, w[e], u)

    _, y = jax.lax.scan(step, None, (x, block_expert, used))
    return y, (x, w, block_expert, used)


_MEGABLOX_ROWS = 128  # megablox's row tile: the sorted copies are padded to a multiple of it


def _megablox(h2, r: Routing, gate, up, down, interpret: bool):
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    tile = lambda n: n if n < 128 else 128
    mm = lambda x, w, sizes: gmm(
        x, w, sizes, jnp.float32, (_MEGABLOX_ROWS, tile(w.shape[1]), tile(w.shape[2])), interpret=interpret
    )
    return _grouped(h2, r, gate, up, down, mm, _MEGABLOX_ROWS)


def _block_matmul_bwd(res, dy):
    x, w, block_expert, used = res

    def dx_step(_, xs):
        dyb, e, u = xs
        return None, _one_block(dyb.astype(w.dtype), w[e].T, u).astype(x.dtype)

    _, dx = jax.lax.scan(dx_step, None, (dy, block_expert, used))
    # The weight gradient one expert at a time, each written once as a scan output: a carried [E, K, N] sum
    # updated per block was zero-filled first and then read and written again at every block (at Qwen3-30B-A3B's
    # width 805 MB per matrix, about 3x the traffic of writing it once).
    E = w.shape[0]
    count = jnp.zeros((E,), jnp.int32).at[block_expert].add(used.astype(jnp.int32))  # used blocks per expert
    first = jnp.cumsum(count) - count  # used blocks come first, in expert order

    def dw_step(_, e):
        def add(i, acc):
            b = first[e] + i
            return acc + jnp.dot(x[b].T, dy[b].astype(x.dtype), preferred_element_type=jnp.float32)

        return None, jax.lax.fori_loop(0, count[e], add, jnp.zeros(w.shape[1:], jnp.float32)).astype(w.dtype)

    _, dw = jax.lax.scan(dw_step, None, jnp.arange(E))
    return dx, dw, None, None


_block_matmul.defvjp(_block_matmul_fwd, _block_matmul_bwd)


def _blocked(h2, r: Routing, gate, up, down, block: int):
    E, D = gate.shape[0], h2.shape[1]
    M = r.experts.size
    token, order, flat, sizes = _sorted_copies(r, E)
    padded = (sizes + block - 1) // block * block
    pad_start = jnp.cumsum(padded) - padded  # each expert's first row in the padded layout
    start = jnp.cumsum(sizes) - sizes  # ... and in the sorted copies
    sorted_expert = flat[order]
    pos = pad_start[sorted_expert] + jnp.arange(M) - start[sorted_expert]  # each sorted copy's padded row
    n_blocks = -(-(M + E * (block - 1)) // block)  # static bound on the padded rows, in blocks
    x = jnp.zeros((n_blocks * block, D), h2.dtype).at[pos].set(h2[token]).reshape(n_blocks, block, D)
    ends = jnp.cumsum(padded)
    first_row = jnp.arange(n_blocks) * block
    block_expert = jnp.minimum(jnp.searchsorted(ends, first_row, side="right"), E - 1).astype(jnp.int32)
    used = first_row < ends[-1]  # blocks past the last expert's group hold only padding
    g = _block_matmul(x, gate, block_expert, used)
    u = _block_matmul(x, up, block_expert, used)
    a = (jax.nn.silu(g) * u).astype(h2.dtype)
    y = _block_matmul(a, down, block_expert, used).astype(h2.dtype)
    return _combine(y.reshape(n_blocks * block, D)[pos], order, r)


def auto_block(copies: int, num_experts: int) -> int:
    """The ``blocked`` dispatch's rows per block for ``copies`` = tokens x k: the mean copies per expert, as
    a power of two in [8, 128]. Each expert's group is padded to whole blocks, so a block much larger than
    the groups runs mostly padding (64-row blocks at 4 copies an expert: 16x the work) and a much smaller one
    reads each expert's weights for many small products."""
    mean = max(copies // max(num_experts, 1), 1)
    return int(min(128, max(8, 1 << (mean - 1).bit_length())))


def experts(
    h2: jax.Array,
    r: Routing,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    *,
    dispatch: str = "blocked",
    block: int | None = None,
    platform: str | None = None,
) -> jax.Array:
    """The experts' weighted output ``[T, D]`` (h2's dtype) for tokens ``h2`` ``[T, D]`` routed by ``r``.
    ``block``: rows per block of the ``blocked`` dispatch (default ``auto_block``). ``platform``: where the
    program runs (default ``jax.default_backend()``); ``megablox`` is interpreted on CPU."""
    if dispatch == "megablox":
        out = _megablox(h2, r, gate, up, down, interpret=(platform or jax.default_backend()) == "cpu")
    elif dispatch == "dense":
        out = _dense(h2, r, gate, up, down)
    elif dispatch == "ragged":
        out = _ragged(h2, r, gate, up, down)
    elif dispatch == "blocked":
        block = auto_block(r.experts.size, gate.shape[0]) if block is None else block
        if block < 1:
            raise ValueError(f"moe: block={block} must be >= 1")
        out = _blocked(h2, r, gate, up, down, block)
    else:
        raise ValueError(f"moe: dispatch {dispatch!r}; choose from {DISPATCHES}")
    return out.astype(h2.dtype)


def sparse_block(
    h: jax.Array,
    router: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    *,
    top_k: int,
    norm_topk_prob: bool,
    dispatch: str = "blocked",
    block: int | None = None,
    replay: jax.Array | None = None,
    platform: str | None = None,
) -> tuple[jax.Array, Routing]:
    """The whole sparse MLP on ``h`` ``[..., D]``: (output of h's shape, the routing of its flattened tokens)."""
    h2 = h.reshape(-1, h.shape[-1])
    r = route(h2, router, top_k, norm_topk_prob, replay)
    out = experts(h2, r, gate, up, down, dispatch=dispatch, block=block, platform=platform)
    return out.reshape(h.shape), r
