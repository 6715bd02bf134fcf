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
from flax import nnx
from jax.sharding import Mesh

from envace_jax import sharding as shd
from envace_jax.models import lora, shared_prefix
from envace_jax.models.kv_cache import KVCache, cache_dtype, cached_attention, visible_slots, write_chunk  # noqa: F401

# Re-exported: outside code reaches the cache's axes through ``qwen3``.
from envace_jax.models.kv_cache import CACHE_K_AXES, CACHE_K_SLOT_AXIS, CACHE_V_AXES, CACHE_V_SLOT_AXIS  # noqa: F401
from envace_jax.models.numerics import as_dtype, is_16bit_float

# The config lives in its own module; outside code reaches it through ``qwen3`` too.
from envace_jax.models.qwen3_config import REMAT_POLICIES, UNROLL_MAX_LAYERS, Qwen3Config  # noqa: F401

# The layer's building blocks live in ``qwen3_layer``; outside code reaches them through ``qwen3`` too.
from envace_jax.models.qwen3_layer import (  # noqa: F401
    _FUSED_AWAY,
    _SLOW_ROWS,
    _SLOW_ROWS_LOW_PRECISION,
    DOWN_OUT_IN,
    FUSED_GATE_UP,
    FUSED_QKV,
    O_OUT_IN,
    _blocked_attention,
    _layer,
    _project,
    _project_out_in,
    _self_attention,
    _split_heads,
    apply_rope,
    dot_out_in,
    fuse_projections,
    rms_norm,
    rope_tables,
)


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
    """Parameters of all decoder layers, stacked along a leading ``layers`` axis. ``mlp=False``: the attention
    halves only (a Qwen3-MoE keeps its MLPs in stacks of their own, ``qwen3_moe``)."""

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs, mlp: bool = True):
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
        if not mlp:
            return
        self.gate_proj = p((D, F), ("embed", "mlp"))
        self.up_proj = p((D, F), ("embed", "mlp"))
        self.down_proj = p((F, D), ("mlp", "embed"))

    def arrays(self) -> dict[str, jax.Array]:
        return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}


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


def _stack_axes(stack: nnx.Module) -> dict[str, tuple[tuple, tuple]]:
    """name -> (logical axes, shape) of one layer of a stacked module's Params (adapters left out)."""
    return {
        name: (tuple(var.logical_axes)[1:], tuple(var.get_value().shape[1:]))
        for name, var in vars(stack).items()
        if isinstance(var, nnx.Param) and not isinstance(var, nnx.LoRAParam)
    }


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
        if hasattr(cfg, "num_experts"):  # a Qwen3MoeConfig: built as a dense model it would have no experts
            raise TypeError("a Qwen3MoeConfig builds qwen3_moe.Qwen3Moe (qwen3.model_class(cfg)), not Qwen3")
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

    def layer_axes(self) -> list[dict[str, tuple[tuple, tuple]]]:
        """Each layer's weights as ``layer_params`` gives them: name -> (logical axes, shape), the ``layers``
        axis left out (LoRA adapters are merged in there, so they are not listed)."""
        return [_stack_axes(self.layers)] * self.config.num_layers

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
        return DecodeWeights([self._fuse_layer(p) for p in layers], head, bits)

    def _fuse_layer(self, p: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """One layer's weights in ``decode_weights(fuse=True)``'s layout (``fuse_projections``)."""
        return fuse_projections(p)

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
        return x, tuple(ks), tuple(vs), None  # no experts to report (qwen3_moe.Qwen3Moe reports its routing)

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
        return_routing: bool = False,
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
          return_routing: cache mode, a Qwen3-MoE (``qwen3_moe``): also return the experts each token of the
            chunk was routed to, int32 ``[Ls, B, T, k]`` (sparse layers, rows, tokens, experts per token).

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
        if return_routing and (cache is None or not hasattr(self.config, "num_experts")):
            raise ValueError("return_routing: the cached pass of a Qwen3-MoE only (a dense Qwen3 has no experts)")
        x = self.embed_tokens(input_ids, decode_weights)
        if cache is None:
            x, hidden = self._run_layers(x, positions, mask, return_hidden_states)
        else:
            # Built once per call, shared by every layer.
            visible = visible_slots(cache.end, T, cache.size)
            x, k_all, v_all, routing = self._run_layers_cached(
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
        if return_routing:
            out += (routing,)
        return out[0] if len(out) == 1 else out

    def init_cache(self, batch: int, size: int, dtype: Any = None) -> KVCache:
        return KVCache.init(self.config, batch, size, dtype)


# config class -> the model class it builds, for the architectures beside dense Qwen3; each registers itself
# when its module is imported (``envace_jax.models`` imports them all), so this module imports none of them
_MODEL_CLASSES: dict[type, type] = {}


def register_model_class(config_class: type, model: type) -> None:
    _MODEL_CLASSES[config_class] = model


def model_class(cfg: Qwen3Config) -> type:
    """The model a config builds: ``Qwen3``, or ``qwen3_moe.Qwen3Moe`` for a ``Qwen3MoeConfig``."""
    for config_class, model in _MODEL_CLASSES.items():
        if isinstance(cfg, config_class):
            return model
    return Qwen3


def init_model(
    cfg: Qwen3Config,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: shd.Rules | None = None,
    one_program: bool = False,
) -> Qwen3:
    """Random init of ``model_class(cfg)``; with a mesh the parameters are created directly in their shardings.

    Without a mesh the default builds the parameters eagerly (one small program per parameter shape);
    ``one_program=True`` compiles the whole init once instead, which is faster on a busy CPU but draws
    different values (XLA fuses the random ops differently), so a given seed's weights depend on it.
    """
    cls = model_class(cfg)
    if mesh is None and not one_program:
        return cls(cfg, rngs=nnx.Rngs(seed))
    if mesh is None:
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(seed))))
        return nnx.merge(graphdef, jax.jit(lambda: nnx.state(cls(cfg, rngs=nnx.Rngs(seed))))())
    rules = shd.TRAIN_RULES if rules is None else rules
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(seed)))
    shardings = param_shardings(abstract, mesh, rules)

    @jax.jit
    def make():
        m = cls(cfg, rngs=nnx.Rngs(seed))
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
