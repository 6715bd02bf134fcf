"""Qwen3 (dense) in Flax NNX: the modules (``Qwen3Config`` is in ``qwen3_config``, the KV cache in ``kv_cache``).

Layout choices (why):
- Attention weights are einsum-shaped (q ``[D, N, H]``, k/v ``[D, K, H]``,
  o ``[N, H, D]``) so sharding heads is a plain logical-axis rule and the
  Hugging Face mapping is a transpose plus reshape.
- All decoder layers live in one ``DecoderStack`` whose parameters have a
  leading ``layers`` axis; the forward pass is one ``lax.scan`` over that axis,
  so XLA compiles one layer body whatever the depth. ``scan_layers=False``
  unrolls the loop. By default (``scan_layers=None``) the cache-free pass
  (training, scoring) of a stack of at most ``UNROLL_MAX_LAYERS`` layers is
  unrolled: the scan's stacked backward residuals cost a zero fill, a write
  and a read per layer, and unrolled the 8-layer train step of
  ``benchmarks/train_step.py`` measured ~17% less CPU time; deeper stacks
  scan (the sampler's cached pass is unrolled, see below).
- RMSNorm, softmax and logits are computed in float32 whatever the compute
  dtype; parameters are stored in ``param_dtype`` and cast to ``dtype`` at use.

Attention masking has two modes:
- *No cache* (training, scoring, parity): key ``j`` is visible to query ``i`` iff
  ``j <= i`` and both carry the same non-zero segment id. Left padding is
  segment 0; packed sequences use segment ids 1, 2, ... with positions that
  restart per segment.
- *With cache* (sampling): see ``kv_cache`` (per-layer buffers, writes, chunk attention); the
  layers are unrolled over the cache's per-layer buffers whatever ``scan_layers`` says.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from envace_jax import sharding as shd
from envace_jax.models import lora, shared_prefix, vjp_ops
from envace_jax.models.kv_cache import KVCache, cache_dtype, cached_attention, visible_slots, write_chunk  # noqa: F401

# Re-exported: outside code reaches the cache's axes through ``qwen3``.
from envace_jax.models.kv_cache import CACHE_K_AXES, CACHE_K_SLOT_AXIS, CACHE_V_AXES, CACHE_V_SLOT_AXIS  # noqa: F401
from envace_jax.models.numerics import as_dtype, is_16bit_float

# The config lives in its own module; outside code reaches it through ``qwen3`` too.
from envace_jax.models.qwen3_config import REMAT_POLICIES, UNROLL_MAX_LAYERS, Qwen3Config  # noqa: F401


# ------------------------------------------------------------------------------------------
# building blocks (pure functions over arrays; modules below only hold parameters)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """RoPE's cos and sin, float32 ``[B, T, 1, head_dim / 2]``, for positions ``[B, T]``.

    Made once per forward and read by every layer's q and k: computed inside the rotation's elementwise
    chain, XLA fused the cos and sin into it and evaluated them again for every head of every layer (the
    q rotation of a 2,048-token, 16-head chunk took 15 ms with them inside, 4.6 ms reading tables)."""
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    ang = positions.astype(jnp.float32)[..., None] * inv  # [B, T, H/2]
    tables = lambda a: (jnp.cos(a)[:, :, None, :], jnp.sin(a)[:, :, None, :])
    if jax.default_backend() != "cpu":
        return tables(ang)
    # Made here is not enough on XLA CPU: it copies a cheap-looking producer into each consumer's fusion, so
    # the cos and sin were still evaluated again for every element of every layer's q and k (and it drops an
    # ``optimization_barrier`` before fusing). A conditional is a fusion boundary, so its results are made
    # once. Both branches are the same function, so which one runs never matters. The predicate reads the
    # positions: where they are data (the sampler's, the trainer's) XLA cannot fold it; the default positions
    # of a plain ``model(ids)`` are a constant, and there XLA folds the conditional away as before. (Qwen3-0.6B
    # width, bfloat16, 32 prompts of 64 tokens: a layer's q rotation 5.8 -> 1.1 ms, and the 4-layer prefill
    # program 467-532 -> 425-431 ms in three profiles; tests/models/test_models_rope_tables.py.)
    return jax.lax.cond(jnp.all(positions >= 0), tables, tables, ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE of x ``[B, T, heads, H]`` with ``rope_tables``' cos and sin, in float32."""
    h = x.shape[-1]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : h // 2], xf[..., h // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _param(rngs: nnx.Rngs | None, shape, axes, dtype, std: float | None) -> nnx.Param:
    if std is None:
        value = jnp.ones(shape, dtype)
    else:
        value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


class Embedding(nnx.Module):
    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.embedding = _param(
            rngs,
            (cfg.vocab_size, cfg.hidden_size),
            ("vocab", "embed"),
            as_dtype(cfg.param_dtype),
            cfg.initializer_range,
        )


class RMSNorm(nnx.Module):
    def __init__(self, cfg: Qwen3Config, dim: int):
        self.scale = _param(None, (dim,), ("norm",), as_dtype(cfg.param_dtype), None)


class DecoderStack(nnx.Module):
    """Parameters of all decoder layers, stacked along a leading ``layers`` axis."""

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        L, D, F, N, K, H = (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        pd, std = as_dtype(cfg.param_dtype), cfg.initializer_range
        p = lambda shape, axes, s=std: _param(rngs, (L, *shape), ("layers", *axes), pd, s)
        self.input_norm = p((D,), ("norm",), None)
        self.q_proj = p((D, N, H), ("embed", "heads", "head_dim"))
        self.k_proj = p((D, K, H), ("embed", "kv_heads", "head_dim"))
        self.v_proj = p((D, K, H), ("embed", "kv_heads", "head_dim"))
        self.o_proj = p((N, H, D), ("heads", "head_dim", "embed"))
        self.q_norm = p((H,), ("norm",), None)
        self.k_norm = p((H,), ("norm",), None)
        self.post_norm = p((D,), ("norm",), None)
        self.gate_proj = p((D, F), ("embed", "mlp"))
        self.up_proj = p((D, F), ("embed", "mlp"))
        self.down_proj = p((F, D), ("mlp", "embed"))

    def arrays(self) -> dict[str, jax.Array]:
        return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}


def _project(x, w, spec: str, n_in: int):
    """``einsum(spec, x, w)`` for x ``[B, T, *in]`` and w ``[*in, *out]`` (``n_in`` contracted dims), as
    ``vjp_ops.dense`` on 2-D views: accumulated in float32 and rounded to x's dtype once, and a backward that
    writes gradients in the arrays' own layouts. The 2-D views serve the sampler's cached path too (with two
    contracted axes, XLA CPU transposed o_proj's weights at every decode step). The float32 result is also
    the fast path for bfloat16 on CPU: a bfloat16 product asked for a bfloat16 result ran 5-10x slower on XLA
    CPU than the same product with a float32 result (on a Xeon with AMX, the weight products of a 28-layer
    0.6B decode step at 8 rows: 778 ms against 81 ms; ``docs/performance.md``)."""
    k_in = int(np.prod(w.shape[:n_in]))
    y = vjp_ops.dense(x.reshape(-1, k_in), w.reshape(k_in, -1))
    return y.reshape(x.shape[:2] + w.shape[n_in:])


def _blocked_attention(q, k, v, mask, block: int, unroll: bool):
    """``vjp_ops.attention`` over query blocks of ``block`` rows, each under ``jax.checkpoint``: forward
    and backward hold one block's ``[B, K, G, block, S]`` scores at a time. Every query row is computed
    exactly as in one dense call (its softmax spans all keys). ``unroll`` writes the blocks out in
    the program instead of a loop (the scan_layers=False debugging mode, and XLA cost counts)."""
    B, T, N, H = q.shape
    n = -(-T // block)
    pad = n * block - T
    qb = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(B, n, block, N, H).swapaxes(0, 1)
    mb = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(B, n, block, mask.shape[-1]).swapaxes(0, 1)
    one = jax.checkpoint(lambda qi, mi: vjp_ops.attention(qi, k, v, mi))
    if unroll:
        out = jnp.stack([one(qb[i], mb[i]) for i in range(n)])
    else:
        out = jax.lax.map(lambda xs: one(*xs), (qb, mb))
    return out.swapaxes(0, 1).reshape(B, n * block, N, H)[:, :T]


def _self_attention(cfg: Qwen3Config, mesh, rules, q, k, v, mask):
    """No-cache attention: in query blocks when the row is long and its sequence axis is not already
    split over devices (then each device holds only its share of the queries). ``mask`` is the
    ``[B, T, T]`` causal mask, or a ``shared_prefix.PrefixLayout`` (``Qwen3.final_hidden_shared``)."""
    if isinstance(mask, shared_prefix.PrefixLayout):

        def attend(qi, ki, vi, m, causal):
            if cfg.attention_block and qi.shape[1] > cfg.attention_block:
                return _blocked_attention(qi, ki, vi, m, cfg.attention_block, unroll=not cfg.scans())
            return vjp_ops.attention(qi, ki, vi, m, causal=causal)

        return shared_prefix.attention(mask, q, k, v, attend)
    B, T = q.shape[:2]
    split = (
        mesh is not None
        and rules is not None
        and shd.logical_to_spec(("batch", "length"), rules, mesh, (B, T))[1] is not None
    )
    if cfg.attention_block and T > cfg.attention_block and not split:
        return _blocked_attention(q, k, v, mask, cfg.attention_block, unroll=not cfg.scans())
    # The cache-free mask is causal: query blocks skip the keys after them (vjp_ops.causal_blocks).
    return vjp_ops.attention(q, k, v, mask, causal=True)


# Keys of a layer's weights after ``fuse_projections``, each ``[out, in]``: [q | k | v] and [gate | up] as one
# matrix each, o_proj and down_proj transposed.
FUSED_QKV, FUSED_GATE_UP, O_OUT_IN, DOWN_OUT_IN = "qkv_proj", "gate_up_proj", "o_proj_out_in", "down_proj_out_in"
_FUSED_AWAY = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj", "down_proj")


def fuse_projections(p: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One layer's weights for a decode loop, each matrix ``[out, in]`` (PyTorch's ``Linear`` layout): q/k/v
    concatenated into ``[(N + 2K) * H, D]``, gate/up into ``[2F, D]``, o_proj as ``[D, N * H]`` and down_proj
    as ``[D, F]``.

    Why concatenated: a decode step multiplies a few rows by every weight matrix, and XLA CPU runs each
    product as a call of its own that reads the activation again and splits its small ``M`` over threads
    again; two wider products do the same arithmetic in fewer, larger calls. Why ``[out, in]``: XLA CPU's
    product of a few rows with a matrix whose contracted axis is its minor (contiguous) one ran faster than
    with the model's ``[in, out]`` layout at every shape of a 0.6B step we timed (``docs/performance.md``).
    Both copy the weights, so the layout is made once per weights version (the sampler's prepared weights),
    never per call."""
    out = {k: v for k, v in p.items() if k not in _FUSED_AWAY}
    D = p["q_proj"].shape[0]
    out[FUSED_QKV] = jnp.concatenate([p[n].reshape(D, -1) for n in ("q_proj", "k_proj", "v_proj")], axis=1).T
    out[FUSED_GATE_UP] = jnp.concatenate([p["gate_proj"], p["up_proj"]], axis=1).T
    out[O_OUT_IN] = p["o_proj"].reshape(-1, D).T
    out[DOWN_OUT_IN] = p["down_proj"].T
    return out


# YNN, XLA CPU's matmul library, multiplied 4-15 rows by a weight matrix more slowly than 16 rows on the
# 2-core Xeon we timed: the weight products of a 28-layer, 0.6B-wide decode step took 242-251 ms at 4 or 8
# rows and 215 ms at the same rows padded to 16 (1-3 rows: 85-150 ms, faster unpadded). In bfloat16 every
# count below 16 is slow: 1 row took 628 ms against 78 ms padded to 16 (the padded bfloat16 products run on
# the Xeon's AMX tiles). Products of the sampler's decode loop pad such row counts to 16; the zero rows'
# outputs are dropped.
_SLOW_ROWS = range(4, 16)
_SLOW_ROWS_LOW_PRECISION = range(1, 16)


def dot_out_in(x2: jax.Array, w: jax.Array, **kw) -> jax.Array:
    """``x2 @ w.T`` for x2 ``[M, in]`` and w ``[out, in]``, with ``M`` in ``_SLOW_ROWS`` (float32) or
    ``_SLOW_ROWS_LOW_PRECISION`` (other dtypes) padded to 16 rows."""
    M = x2.shape[0]
    slow = _SLOW_ROWS if x2.dtype == jnp.float32 else _SLOW_ROWS_LOW_PRECISION
    xp = jnp.pad(x2, ((0, 16 - M), (0, 0))) if M in slow else x2
    return jax.lax.dot_general(xp, w, (((1,), (1,)), ((), ())), **kw)[:M]


def _project_out_in(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """``x @ w.T`` for x ``[B, T, *in]`` (its trailing axes flattened) and w ``[out, in]``: ``[B, T, out]`` in
    ``out_dtype`` (default x's), accumulated in float32 (see ``_project``)."""
    y = dot_out_in(x.reshape(x.shape[0] * x.shape[1], -1), w, preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(x.shape[:2] + (w.shape[0],))


def _split_heads(qkv: jax.Array, cfg: Qwen3Config):
    """``[B, T, (N + 2K) * H]`` (a fused q/k/v product) -> q ``[B, T, N, H]``, k and v ``[B, T, K, H]``."""
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    B, T = qkv.shape[:2]
    q = qkv[..., : N * H].reshape(B, T, N, H)
    k = qkv[..., N * H : (N + K) * H].reshape(B, T, K, H)
    v = qkv[..., (N + K) * H :].reshape(B, T, K, H)
    return q, k, v


def _layer(cfg: Qwen3Config, mesh, rules, p: dict, x, rope, mask, cache_kv):
    """One decoder layer. ``rope``: the chunk's ``rope_tables`` (cos, sin), made once for all layers.
    ``cache_kv``: None, or this layer's ``(k_cache, v_cache, end)`` (then ``mask`` is the ``[B, T, S]``
    visible-slot mask): the chunk's keys and values are written at ``end + t`` first, then attended to
    with the rest. Returns (x, the layer's new (k_cache, v_cache) or None)."""
    dt = as_dtype(cfg.dtype)
    p = lora.merged(p, cfg.lora_scale)  # LoRA adapters, if any: this layer's W + scale * A @ B (models/lora.py)
    w = {k: v.astype(dt) if k not in ("input_norm", "post_norm", "q_norm", "k_norm") else v for k, v in p.items()}
    eps = cfg.rms_norm_eps
    h = rms_norm(x, w["input_norm"], eps)
    fused = FUSED_QKV in w  # fuse_projections(): four [out, in] products, q/k/v and gate/up one each
    if fused:
        q, k, v = _split_heads(_project_out_in(h, w[FUSED_QKV]), cfg)
    else:
        q = _project(h, w["q_proj"], "btd,dnh->btnh", 1)
        k = _project(h, w["k_proj"], "btd,dkh->btkh", 1)
        v = _project(h, w["v_proj"], "btd,dkh->btkh", 1)
    q = apply_rope(rms_norm(q, w["q_norm"], eps), *rope)
    k = apply_rope(rms_norm(k, w["k_norm"], eps), *rope)
    q = shd.constrain(q, ("batch", "length", "act_heads", None), mesh, rules)
    if cache_kv is None:
        new_kv = None
        attn = _self_attention(cfg, mesh, rules, q, k, v, mask)
    else:
        k_cache, v_cache, end = cache_kv
        new_kv = write_chunk(k_cache, v_cache, k, v, end)
        attn = cached_attention(q, *new_kv, mask)  # a float32 cache is read as it lies (kv_cache.cache_dtype)
    x = x + (_project_out_in(attn, w[O_OUT_IN]) if fused else _project(attn, w["o_proj"], "btnh,nhd->btd", 2))
    x = shd.constrain(x, ("batch", "length", "act_embed"), mesh, rules)
    h = rms_norm(x, w["post_norm"], eps)
    if fused:
        # SiLU(gate) * up on the product's float32 result, rounded once: XLA CPU runs this elementwise
        # chain about 3x slower in bfloat16 than in float32 (a 2,048-token chunk of the 0.6B width:
        # 13 against 4.5 ms per layer).
        gu = _project_out_in(h, w[FUSED_GATE_UP], jnp.float32)
        g, u = gu[..., : cfg.intermediate_size], gu[..., cfg.intermediate_size :]
        act = (jax.nn.silu(g) * u).astype(dt)
    else:
        g = _project(h, w["gate_proj"], "btd,df->btf", 1)
        u = _project(h, w["up_proj"], "btd,df->btf", 1)
        act = jax.nn.silu(g) * u
    act = shd.constrain(act, ("batch", "length", "act_mlp"), mesh, rules)
    x = x + (_project_out_in(act, w[DOWN_OUT_IN]) if fused else _project(act, w["down_proj"], "btf,fd->btd", 1))
    x = shd.constrain(x, ("batch", "length", "act_embed"), mesh, rules)
    return x, new_kv


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeWeights:
    """``Qwen3.decode_weights()``: per-layer parameter dicts and an optional head (a pytree, so the sampler
    can prepare it once per weights version and pass it to its programs). The head is ``[D, V]``, or with
    ``out_in`` layers ``[V, D]`` (None: the model's own, e.g. a tied embedding read as it lies)."""

    layers: list[dict[str, jax.Array]]
    head: jax.Array | None = None
    # A 16-bit float embedding table's bit patterns (uint16), gathered in its place: XLA CPU has no bfloat16
    # gather, and converted the whole table to float32 first in every program that embeds (Qwen3-0.6B: 106 ms
    # per program, so twice per sampler call). Made with the fused layout (``fuse=True``), else None.
    embed_bits: jax.Array | None = None

    @property
    def out_in(self) -> bool:
        """The layers hold ``fuse_projections``' ``[out, in]`` matrices (then so does the head)."""
        return bool(self.layers) and FUSED_QKV in self.layers[0]


def _remat(fn, policy: str):
    if policy == "none":
        return fn
    pol = {
        "full": None,
        "dots": jax.checkpoint_policies.checkpoint_dots,
        "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }[policy]
    return jax.checkpoint(fn, policy=pol)


class Qwen3(nnx.Module):
    """Qwen3ForCausalLM. Call with int32 ids ``[B, T]``; returns float32 logits ``[B, T, V]``."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        self.embed = Embedding(cfg, rngs)
        self.layers = DecoderStack(cfg, rngs)
        self.norm = RMSNorm(cfg, cfg.hidden_size)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(
                rngs,
                (cfg.hidden_size, cfg.vocab_size),
                ("embed", "vocab"),
                as_dtype(cfg.param_dtype),
                cfg.initializer_range,
            )
        # Activation sharding: set by sharding.place()/hf_io.load_hf when a mesh is used.
        self.mesh: Mesh | None = None
        self.rules: dict | None = None

    # -- helpers --------------------------------------------------------------------------
    def set_sharding(self, mesh: Mesh | None, rules: shd.Rules | None) -> None:
        self.mesh, self.rules = mesh, (dict(rules) if rules is not None else None)

    def head_weight(self) -> tuple[jax.Array, str]:
        """The vocabulary projection and its layout: the embedding ``[V, D]`` (``"vd"``) when tied,
        else the lm_head ``[D, V]`` (``"dv"``)."""
        if self.config.tie_word_embeddings:
            return self.embed.embedding[...], "vd"
        return self.lm_head[...], "dv"

    def _final_norm(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.norm.scale[...], self.config.rms_norm_eps)

    def _head(self, x: jax.Array, weights: "DecodeWeights | None" = None) -> jax.Array:
        """Logits of the final-normed ``x``, with the head of ``weights`` (``decode_weights()``) if it has one."""
        x = self._final_norm(x)
        out_in = weights is not None and weights.out_in
        if weights is not None and weights.head is not None:
            w, layout = weights.head, ("vd" if out_in else "dv")
        else:
            w, layout = self.head_weight()
        w = w.astype(as_dtype(self.config.dtype))
        if out_in and layout == "vd":  # the decode loop's products: few rows, padded (see _SLOW_ROWS)
            y = dot_out_in(x.reshape(-1, x.shape[-1]), w, preferred_element_type=jnp.float32)
            return y.reshape(x.shape[:-1] + (w.shape[0],))
        spec = "...d,vd->...v" if layout == "vd" else "...d,dv->...v"
        return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)

    def embed_tokens(self, input_ids: jax.Array, weights: "DecodeWeights | None" = None) -> jax.Array:
        """The rows of the embedding table, or of ``weights.embed_bits`` (its bit patterns) when given."""
        if weights is not None and weights.embed_bits is not None:
            table = self.embed.embedding[...]
            x = jax.lax.bitcast_convert_type(jnp.take(weights.embed_bits, input_ids, axis=0), table.dtype)
        else:
            x = jnp.take(self.embed.embedding[...], input_ids, axis=0)
        x = x.astype(as_dtype(self.config.dtype))
        return shd.constrain(x, ("batch", "length", "act_embed"), self.mesh, self.rules)

    def layer_params(self) -> list[dict[str, jax.Array]]:
        """Each layer's parameters, sliced out of the stacked arrays (for the cache path); LoRA adapters, if any,
        merged into their weights here, once per weights version a sampler prepares."""
        stacked = lora.merged(self.layers.arrays(), self.config.lora_scale, stacked=True)
        return [{name: a[i] for name, a in stacked.items()} for i in range(self.config.num_layers)]

    def decode_weights(self, transpose_head: bool = False, fuse: bool = False) -> "DecodeWeights":
        """The weights a decode loop reads, prepared once outside it (pass as ``decode_weights=``).

        ``transpose_head``: also materialise a tied embedding as a ``[D, V]`` head (was ~7% faster per
        decode step on an AMD EPYC at batch 32 and a 32k vocabulary, than the cost of one transpose per call;
        on accelerators the product reads the table as it is).
        ``fuse``: each layer's matrices ``[out, in]``, q/k/v and gate/up concatenated (``fuse_projections``),
        and the head ``[V, D]`` (a tied embedding as it lies; ``transpose_head`` is then ignored), and a 16-bit
        float embedding's bit patterns (``DecodeWeights.embed_bits``): for weights prepared once per weights
        version.
        """
        w, layout = self.head_weight()
        if fuse:
            head = jnp.transpose(w) if layout == "dv" else None
        else:
            head = jnp.transpose(w) if transpose_head and layout == "vd" else None
        layers = self.layer_params()
        if not fuse:
            return DecodeWeights(layers, head)
        table = self.embed.embedding[...]
        bits = None
        if is_16bit_float(table.dtype):
            bits = jax.lax.bitcast_convert_type(table, jnp.uint16)
        return DecodeWeights([fuse_projections(p) for p in layers], head, bits)

    def _run_layers_cached(self, x, positions, visible, cache: KVCache, layer_params):
        """The cache path: layers unrolled over the per-layer cache buffers (see ``kv_cache``)."""
        layers = self.layer_params() if layer_params is None else layer_params
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        ks, vs = [], []
        for p, k_cache, v_cache in zip(layers, cache.k, cache.v, strict=True):
            x, (k_cache, v_cache) = _layer(
                self.config, self.mesh, self.rules, p, x, rope, visible, (k_cache, v_cache, cache.end)
            )
            ks.append(k_cache)
            vs.append(v_cache)
        return x, tuple(ks), tuple(vs)

    def _run_layers(self, x, positions, mask, collect_hidden: bool):
        cfg, mesh, rules = self.config, self.mesh, self.rules
        params = self.layers.arrays()
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)  # once for all layers, outside the remat

        def body(y, xs):
            p, _ = xs
            y, _ = _layer(cfg, mesh, rules, p, y, rope, mask, None)
            return y, (y if collect_hidden else None)

        body = _remat(body, cfg.remat_policy)
        layer_ids = jnp.arange(cfg.num_layers, dtype=jnp.int32)
        if cfg.scans():
            x, hidden = jax.lax.scan(body, x, (params, layer_ids))
        else:
            outs = []
            for i in range(cfg.num_layers):
                x, o = body(x, (jax.tree.map(lambda a: a[i], params), layer_ids[i]))
                outs.append(o)
            hidden = jnp.stack(outs) if collect_hidden else None
        return x, hidden

    @staticmethod
    def _no_cache_mask(input_ids, positions, segment_ids):
        """Default positions and the ``[B, T, T]`` causal same-segment mask of a cache-free call."""
        B, T = input_ids.shape
        idx = jnp.arange(T, dtype=jnp.int32)
        if segment_ids is None:
            segment_ids = jnp.ones((B, T), jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(idx, (B, T))
        mask = (
            (idx[None, :, None] >= idx[None, None, :])
            & (segment_ids[:, :, None] == segment_ids[:, None, :])
            & (segment_ids[:, None, :] != 0)
        )
        return positions, mask

    # -- forward --------------------------------------------------------------------------
    def final_hidden(
        self, input_ids: jax.Array, positions: jax.Array | None = None, segment_ids: jax.Array | None = None
    ) -> jax.Array:
        """Hidden states ``[B, T, D]`` after the final norm (what the vocabulary projection reads), for
        callers that fuse the projection with their loss (``rl.head_logprobs``). Cache-free; arguments
        as in ``__call__``."""
        positions, mask = self._no_cache_mask(input_ids, positions, segment_ids)
        x, _ = self._run_layers(self.embed_tokens(input_ids), positions, mask, False)
        return self._final_norm(x)

    def final_hidden_shared(
        self,
        prefix_tokens: jax.Array,
        suffix_tokens: jax.Array,
        layout: shared_prefix.PrefixLayout,
        full_index: jax.Array,
    ) -> jax.Array:
        """``final_hidden`` of rows that begin with shared prefixes, each prefix computed once
        (``models.shared_prefix``): prefixes ``[P, Lp]`` and suffixes ``[R, Ls]`` int32, and
        ``full_index`` int32 ``[R, L]``, the flat token (prefixes first, then suffixes) that holds each
        position of a row. Returns ``[R, L, D]`` in the rows' own layout. On one device only."""
        if self.mesh is not None and self.mesh.size > 1:
            # The flat [1, N] layout has no batch axis to split over devices.
            raise ValueError(f"final_hidden_shared runs on one device, not a mesh of {self.mesh.size}")
        P, Lp = prefix_tokens.shape
        R, Ls = suffix_tokens.shape
        D = self.config.hidden_size
        if Lp != layout.prefix_width:
            raise ValueError(f"prefix tokens are {Lp} wide but the layout says {layout.prefix_width}")
        x = jnp.concatenate(
            [self.embed_tokens(prefix_tokens).reshape(P * Lp, D), self.embed_tokens(suffix_tokens).reshape(R * Ls, D)]
        )[None]
        x, _ = self._run_layers(x, shared_prefix.flat_positions(layout, Ls), layout, False)
        return self._final_norm(x)[0][full_index]

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        *,
        cache: KVCache | None = None,
        chunk_lengths: jax.Array | None = None,
        logits_at: jax.Array | None = None,
        return_hidden_states: bool = False,
        decode_weights: "DecodeWeights | None" = None,
    ):
        """Forward pass.

        Args:
          input_ids: int32 ``[B, T]``.
          positions: int32 ``[B, T]``; default ``arange(T)`` (no cache) or ``cache.end + arange(T)``.
          segment_ids: int32 ``[B, T]``, 0 = padding (no-cache mode only).
          cache: a KVCache; the chunk is written at slots ``cache.end[b] + t``.
          chunk_lengths: int32 ``[B]`` valid tokens per row of this chunk (cache mode);
            the returned cache's ``end`` is advanced by it (default ``T``).
          logits_at: int32 ``[B]``; if given, return logits ``[B, V]`` at that index only
            (skips the vocabulary projection everywhere else).
          return_hidden_states: also return ``[L + 1, B, T, D]`` hidden states
            (embeddings, then each layer's output; the last one before the final norm; no-cache mode).
          decode_weights: cache mode: ``decode_weights()`` computed once outside a decode loop, so the
            loop body reads each layer's weights where they lie instead of slicing them every step.

        Returns:
          float32 logits ``[B, T, V]`` (or ``[B, V]``); with a cache, ``(logits, new_cache)``;
          with ``return_hidden_states``, the hidden states are appended to the tuple.
        """
        B, T = input_ids.shape
        if cache is None:
            positions, mask = self._no_cache_mask(input_ids, positions, segment_ids)
        else:
            if segment_ids is not None:
                raise ValueError("segment_ids are not used with a KV cache; right-pad chunks and pass chunk_lengths")
            if return_hidden_states:
                raise ValueError("return_hidden_states is not supported with a KV cache")
            if positions is None:
                positions = cache.end[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
        x = self.embed_tokens(input_ids, decode_weights)
        if cache is None:
            x, hidden = self._run_layers(x, positions, mask, return_hidden_states)
        else:
            # Built once per call, shared by every layer.
            visible = visible_slots(cache.end, T, cache.size)
            x, k_all, v_all = self._run_layers_cached(
                x, positions, visible, cache, decode_weights.layers if decode_weights is not None else None
            )
        if logits_at is not None:
            x = jnp.take_along_axis(x, logits_at[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        logits = self._head(x, decode_weights)
        out: tuple = (logits,)
        if cache is not None:
            lengths = jnp.full((B,), T, jnp.int32) if chunk_lengths is None else chunk_lengths.astype(jnp.int32)
            out += (KVCache(k_all, v_all, cache.end + lengths),)
        if return_hidden_states:
            emb = self.embed_tokens(input_ids)
            out += (jnp.concatenate([emb[None], hidden], axis=0),)
        return out[0] if len(out) == 1 else out

    def init_cache(self, batch: int, size: int, dtype: Any = None) -> KVCache:
        return KVCache.init(self.config, batch, size, dtype)


def init_model(
    cfg: Qwen3Config,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: shd.Rules | None = None,
    one_program: bool = False,
) -> Qwen3:
    """Random init; with a mesh the parameters are created directly in their shardings.

    Without a mesh the default builds the parameters eagerly (one small program per parameter shape);
    ``one_program=True`` compiles the whole init once instead, which is faster on a busy CPU but draws
    different values (XLA fuses the random ops differently), so a given seed's weights depend on it.
    """
    if mesh is None and not one_program:
        return Qwen3(cfg, rngs=nnx.Rngs(seed))
    if mesh is None:
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(seed))))
        return nnx.merge(graphdef, jax.jit(lambda: nnx.state(Qwen3(cfg, rngs=nnx.Rngs(seed))))())
    rules = shd.TRAIN_RULES if rules is None else rules
    abstract = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(seed)))
    shardings = param_shardings(abstract, mesh, rules)

    @jax.jit
    def make():
        m = Qwen3(cfg, rngs=nnx.Rngs(seed))
        return nnx.state(m)

    graphdef, _ = nnx.split(abstract)
    state = jax.jit(make, out_shardings=shardings)()
    model = nnx.merge(graphdef, state)
    model.set_sharding(mesh, rules)
    return model


def param_shardings(model: nnx.Module, mesh: Mesh, rules: shd.Rules):
    """A state-shaped tree of NamedShardings from each Param's ``logical_axes`` metadata."""
    state = nnx.state(model)

    def one(var):
        axes = getattr(var, "logical_axes", None)
        shape = var.get_value().shape
        if axes is None:
            return shd.replicated(mesh)
        return shd.named_sharding(mesh, axes, rules, shape)

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def place(model: Qwen3, mesh: Mesh, rules: shd.Rules = shd.TRAIN_RULES) -> Qwen3:
    """Reshards an existing model's parameters onto ``mesh`` under ``rules`` (in place)."""
    shardings = param_shardings(model, mesh, rules)
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, shardings))
    model.set_sharding(mesh, rules)
    return model
