"""The building blocks of a Qwen3 decoder layer: pure functions over arrays (``qwen3`` holds the parameters in
modules and re-exports these). Norms and rotary tables, the projections (2-D dense products with a float32
result), self-attention with and without the KV cache, the sampler's fused weight layout, and ``_layer``: one
decoder layer, with LoRA adapters merged into its weights when it carries them (``models/lora.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envace_jax import sharding as shd
from envace_jax.models import lora, shared_prefix, vjp_ops
from envace_jax.models.kv_cache import cached_attention, write_chunk
from envace_jax.models.numerics import as_dtype
from envace_jax.models.qwen3_config import Qwen3Config


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
    out = fuse_attention(p)
    out[FUSED_GATE_UP] = jnp.concatenate([out.pop("gate_proj"), out.pop("up_proj")], axis=1).T
    out[DOWN_OUT_IN] = out.pop("down_proj").T
    return out


def fuse_attention(p: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``fuse_projections`` of the attention weights only (q/k/v one ``[out, in]`` matrix, o_proj ``[D, N * H]``);
    every other weight as it is (a sparse layer's experts: ``qwen3_moe``)."""
    out = {k: v for k, v in p.items() if k not in ("q_proj", "k_proj", "v_proj", "o_proj")}
    D = p["q_proj"].shape[0]
    out[FUSED_QKV] = jnp.concatenate([p[n].reshape(D, -1) for n in ("q_proj", "k_proj", "v_proj")], axis=1).T
    out[O_OUT_IN] = p["o_proj"].reshape(-1, D).T
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


_NORMS = ("input_norm", "post_norm", "q_norm", "k_norm")


def layer_weights(cfg: Qwen3Config, p: dict) -> dict:
    """One layer's weights as its sublayers read them: LoRA adapters, if any, merged (``models/lora.py``), every
    matrix cast to the compute dtype (the norms' scales stay as stored)."""
    dt = as_dtype(cfg.dtype)
    p = lora.merged(p, cfg.lora_scale)  # LoRA adapters, if any: this layer's W + scale * A @ B (models/lora.py)
    return {k: v.astype(dt) if k not in _NORMS else v for k, v in p.items()}


def _layer(cfg: Qwen3Config, mesh, rules, p: dict, x, rope, mask, cache_kv):
    """One decoder layer. ``rope``: the chunk's ``rope_tables`` (cos, sin), made once for all layers.
    ``cache_kv``: None, or this layer's ``(k_cache, v_cache, end)`` (then ``mask`` is the ``[B, T, S]``
    visible-slot mask): the chunk's keys and values are written at ``end + t`` first, then attended to
    with the rest. Returns (x, the layer's new (k_cache, v_cache) or None)."""
    w = layer_weights(cfg, p)
    x, new_kv = attention_sublayer(cfg, mesh, rules, w, x, rope, mask, cache_kv)
    return dense_mlp_sublayer(cfg, mesh, rules, w, x), new_kv


def attention_sublayer(cfg: Qwen3Config, mesh, rules, w: dict, x, rope, mask, cache_kv):
    """The attention half of a layer (``layer_weights``' ``w``): x + attention(input_norm(x)); arguments and
    result as in ``_layer``."""
    eps = cfg.rms_norm_eps
    h = rms_norm(x, w["input_norm"], eps)
    fused = FUSED_QKV in w  # fuse_projections(): q/k/v one [out, in] product, o_proj [out, in]
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
    return shd.constrain(x, ("batch", "length", "act_embed"), mesh, rules), new_kv


def dense_mlp_sublayer(cfg: Qwen3Config, mesh, rules, w: dict, x):
    """The dense MLP half of a layer: x + SwiGLU(post_norm(x))."""
    dt = as_dtype(cfg.dtype)
    h = rms_norm(x, w["post_norm"], cfg.rms_norm_eps)
    if FUSED_GATE_UP in w:
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
    x = x + (
        _project_out_in(act, w[DOWN_OUT_IN]) if DOWN_OUT_IN in w else _project(act, w["down_proj"], "btf,fd->btd", 1)
    )
    return shd.constrain(x, ("batch", "length", "act_embed"), mesh, rules)
