"""Qwen3-MoE (``Qwen3MoeForCausalLM``) in Flax NNX: the dense model's attention, norms, RoPE, head and KV cache,
with the sparse MLP of ``moe`` in the layers ``Qwen3MoeConfig.sparse_layers`` names.

Parameters (why three stacks): the attention halves of all ``L`` layers are one ``DecoderStack`` (``layers``,
the same names as the dense model's, so the checkpoint table and the sharding rules carry over); the sparse
layers' routers and experts are stacked over those layers only (``experts``: router ``[Ls, D, E]``, gate and up
``[Ls, E, D, F]``, down ``[Ls, E, F, D]``); the dense layers' MLPs (``mlp_only_layers``, ``decoder_sparse_step``)
over theirs (``dense_mlp``). The cache-free pass scans each run of consecutive layers of one kind (both released
checkpoints are one run of sparse layers), so XLA compiles one body per kind whatever the depth.

Routing: ``final_hidden_routed`` also returns the experts each token went to in each sparse layer and the sums
of transformers' load-balancing loss; with ``replay=`` it routes every token to recorded experts instead
(routing replay: the update's forward uses the sampler's choices, weighted by its own router).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from envace_jax import sharding as shd
from envace_jax.models import lora, moe, qwen3
from envace_jax.models.kv_cache import KVCache
from envace_jax.models.numerics import as_dtype
from envace_jax.models.qwen3_layer import (
    attention_sublayer,
    dense_mlp_sublayer,
    fuse_attention,
    fuse_projections,
    layer_weights,
    rms_norm,
    rope_tables,
)
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig

# Per-layer keys of a sparse layer's MLP (``Qwen3Moe.layer_params``)
ROUTER, EXPERT_GATE, EXPERT_UP, EXPERT_DOWN = "router", "expert_gate", "expert_up", "expert_down"


class SparseMlpStack(nnx.Module):
    """The routers and experts of the sparse layers, stacked along a leading ``layers`` axis."""

    def __init__(self, cfg: Qwen3MoeConfig, rngs: nnx.Rngs):
        n, D, E, F = len(cfg.sparse_layers), cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        p = lambda shape, axes: qwen3._param(
            rngs, (n, *shape), ("layers", *axes), as_dtype(cfg.param_dtype), cfg.initializer_range
        )
        self.router = p((D, E), ("embed", None))
        self.expert_gate = p((E, D, F), ("expert", "embed", "mlp"))
        self.expert_up = p((E, D, F), ("expert", "embed", "mlp"))
        self.expert_down = p((E, F, D), ("expert", "mlp", "embed"))

    def arrays(self) -> dict[str, jax.Array]:
        return {
            ROUTER: self.router[...],
            EXPERT_GATE: self.expert_gate[...],
            EXPERT_UP: self.expert_up[...],
            EXPERT_DOWN: self.expert_down[...],
        }


class DenseMlpStack(nnx.Module):
    """The SwiGLU MLPs of the dense layers of a Qwen3-MoE, stacked along a leading ``layers`` axis."""

    def __init__(self, cfg: Qwen3MoeConfig, rngs: nnx.Rngs):
        n, D, F = len(cfg.dense_layers), cfg.hidden_size, cfg.intermediate_size
        p = lambda shape, axes: qwen3._param(
            rngs, (n, *shape), ("layers", *axes), as_dtype(cfg.param_dtype), cfg.initializer_range
        )
        self.gate_proj = p((D, F), ("embed", "mlp"))
        self.up_proj = p((D, F), ("embed", "mlp"))
        self.down_proj = p((F, D), ("mlp", "embed"))

    def arrays(self) -> dict[str, jax.Array]:
        return {"gate_proj": self.gate_proj[...], "up_proj": self.up_proj[...], "down_proj": self.down_proj[...]}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RoutingRecord:
    """What ``Qwen3Moe.final_hidden_routed`` reports of its routing.

    ``experts``: int32 ``[Ls, B, T, k]``, the experts each token used in each sparse layer (the shape of a
    ``recorded=`` input); ``expert_tokens``: float32 ``[k, E]``, valid tokens whose ``j``-th choice was each
    expert, summed over the sparse layers; ``expert_probs``: float32 ``[E]``, the router probabilities of the
    valid tokens, summed likewise; ``tokens``: float32, valid tokens times sparse layers. Against a
    ``recorded=`` routing: ``recorded_tokens``, the valid tokens it holds; ``changed_tokens``, those whose own
    top-k set differs from the recorded one in at least one layer; ``changed_choices``, (token, layer) pairs
    that differ (zeros without a record)."""

    experts: jax.Array
    expert_tokens: jax.Array
    expert_probs: jax.Array
    tokens: jax.Array
    recorded_tokens: jax.Array
    changed_tokens: jax.Array
    changed_choices: jax.Array

    def aux_loss(self) -> jax.Array:
        """transformers' ``load_balancing_loss_func`` over every sparse layer at once: E * sum_{j,e} f_je P_e, with
        f the share of valid tokens whose j-th choice is e and P the mean router probability (k at balance)."""
        n = jnp.maximum(self.tokens, 1.0)
        E = self.expert_probs.shape[-1]
        return E * jnp.sum((self.expert_tokens / n) * (self.expert_probs / n)[None, :])


def _routing_sums(r: moe.Routing, valid: jax.Array, num_experts: int):
    """(``[k, E]`` valid tokens per expert and choice, ``[E]`` summed probabilities, valid count) of one layer."""
    v = valid.reshape(-1).astype(jnp.float32)
    onehot = jax.nn.one_hot(r.experts, num_experts, dtype=jnp.float32)  # [T, k, E]
    probs = jax.nn.softmax(r.logits, axis=-1)
    return jnp.einsum("t,tke->ke", v, onehot), jnp.einsum("t,te->e", v, probs), jnp.sum(v)


def _changed(r: moe.Routing, recorded: jax.Array, valid: jax.Array) -> jax.Array:
    """bool ``[B, T]``: valid recorded tokens whose own top-k set is not the recorded set."""
    own = jnp.sort(r.own.reshape(recorded.shape), axis=-1)
    return jnp.any(own != jnp.sort(recorded, axis=-1), axis=-1) & (recorded[..., 0] >= 0) & valid


def sparse_mlp_sublayer(cfg: Qwen3MoeConfig, mesh, rules, w: dict, x, replay=None):
    """The sparse MLP half of a layer: (x + experts(post_norm(x)), the ``moe.Routing`` of its ``B * T`` tokens).
    ``replay``: int ``[B, T, k]`` recorded experts (-1: none), or None. On a mesh of several devices each device
    routes its own tokens through the whole layer's experts (``_local_tokens``)."""
    h = rms_norm(x, w["post_norm"], cfg.rms_norm_eps)
    weights = (w[ROUTER], w[EXPERT_GATE], w[EXPERT_UP], w[EXPERT_DOWN])
    if mesh is not None and rules is not None and mesh.size > 1 and cfg.moe_local_tokens:
        out, r = _local_tokens(cfg, mesh, rules, h, weights, replay)
    else:
        out, r = _block(cfg, h, weights, replay, _platform(mesh))
    x = shd.constrain(x + out, ("batch", "length", "act_embed"), mesh, rules)
    return x, r


def _platform(mesh) -> str:
    """Where the program runs: the mesh's devices (an ahead-of-time TPU compile on a CPU host), else the default."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def _block(cfg: Qwen3MoeConfig, h, weights, replay, platform: str, tensor_axes: tuple[str, ...] = ()):
    """``moe.sparse_block`` of ``h`` ``[B, T, D]``; with ``tensor_axes`` the experts' hidden width is split over
    those mesh axes and the partial outputs are summed over them."""
    k = cfg.num_experts_per_tok
    out, r = moe.sparse_block(
        h,
        *weights,
        top_k=k,
        norm_topk_prob=cfg.norm_topk_prob,
        dispatch=cfg.dispatch(platform),
        block=cfg.moe_block or None,
        replay=None if replay is None else replay.reshape(-1, k),
        platform=platform,
    )
    if tensor_axes:
        out = jax.lax.psum(out, tensor_axes)
    return out, r


def _local_tokens(cfg: Qwen3MoeConfig, mesh, rules, h, weights, replay):
    """The sparse block under ``shard_map``: each device sorts and runs only the tokens it holds, through every
    expert of the layer, whose weights it gathers over the FSDP axes like a dense layer's (their hidden width
    stays split over the tensor axes, the partial outputs summed there). Tokens never move between devices.
    Left to XLA (``moe_local_tokens=False``), the partitioned global sort and grouped matmul of a Qwen3-30B-A3B
    update needed 107 GB per v5p chip for two layers, against 12.5 GB this way (benchmarks/moe_dispatch_aot.py,
    docs/moe.md)."""
    B, T, D = h.shape
    bs, ls = shd.logical_to_spec(("batch", "length"), rules, mesh, (B, T))
    F = weights[1].shape[-1]
    ms = shd.logical_to_spec(("mlp",), rules, mesh, (F,))[0] if "mlp" in rules else None
    tensor_axes = () if ms is None else ((ms,) if isinstance(ms, str) else tuple(ms))
    taken = set(tensor_axes)
    if taken & set(jax.tree.leaves((bs, ls))):  # a token axis and the experts' width on one mesh axis
        ms, tensor_axes = None, ()
    P = jax.sharding.PartitionSpec
    w_specs = (P(), P(None, None, ms), P(None, None, ms), P(None, ms, None))
    tok = P(bs, ls, None)

    def local(h, *args):
        *ws, rep = args
        out, r = _block(cfg, h, ws, rep, _platform(mesh), tensor_axes)
        b, t = h.shape[:2]
        return out, moe.Routing(*(a.reshape(b, t, -1) for a in r))

    args = (h, *weights, replay)
    specs = (tok, *w_specs, None if replay is None else tok)
    routing_specs = moe.Routing(tok, tok, tok, tok)
    out, r = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(tok, routing_specs), check_vma=False)(*args)
    return out, moe.Routing(*(a.reshape(B * T, -1) for a in r))


def _runs(cfg: Qwen3MoeConfig) -> list[tuple[bool, int, int, int]]:
    """Maximal runs of consecutive layers of one kind: (sparse, first layer, layer count, first index in its
    kind's stack)."""
    out, seen = [], {True: 0, False: 0}
    for kind, group in itertools.groupby(range(cfg.num_layers), key=cfg.is_sparse):
        layers = list(group)
        out.append((kind, layers[0], len(layers), seen[kind]))
        seen[kind] += len(layers)
    return out


class Qwen3Moe(qwen3.Qwen3):
    """Qwen3MoeForCausalLM. Called like ``Qwen3``: int32 ids ``[B, T]`` -> float32 logits ``[B, T, V]``."""

    def __init__(self, cfg: Qwen3MoeConfig, *, rngs: nnx.Rngs | None = None):
        if not isinstance(cfg, Qwen3MoeConfig):
            raise TypeError(f"Qwen3Moe needs a Qwen3MoeConfig, got {type(cfg).__name__}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        self.embed = qwen3.Embedding(cfg, rngs)
        self.layers = qwen3.DecoderStack(cfg, rngs, mlp=False)
        self.experts = SparseMlpStack(cfg, rngs)
        self.dense_mlp = DenseMlpStack(cfg, rngs) if cfg.dense_layers else None
        self.norm = qwen3.RMSNorm(cfg, cfg.hidden_size)
        if not cfg.tie_word_embeddings:
            self.lm_head = qwen3._param(
                rngs,
                (cfg.hidden_size, cfg.vocab_size),
                ("embed", "vocab"),
                as_dtype(cfg.param_dtype),
                cfg.initializer_range,
            )
        self.mesh = None
        self.rules = None

    # -- per-layer weights -----------------------------------------------------------------
    def _mlp_arrays(self, sparse: bool) -> dict[str, jax.Array]:
        return self.experts.arrays() if sparse else self.dense_mlp.arrays()

    def _run_params(self, sparse: bool, first: int, count: int, first_in_kind: int) -> dict[str, jax.Array]:
        """The stacked weights of one run of layers (attention and MLP)."""
        att = {k: a[first : first + count] for k, a in self.layers.arrays().items()}
        mlp = {k: a[first_in_kind : first_in_kind + count] for k, a in self._mlp_arrays(sparse).items()}
        return {**att, **mlp}

    def layer_params(self) -> list[dict[str, jax.Array]]:
        """Each layer's weights (attention and its MLP), LoRA adapters (attention only) merged once here."""
        out = []
        for sparse, first, count, k0 in _runs(self.config):
            run = lora.merged(self._run_params(sparse, first, count, k0), self.config.lora_scale, stacked=True)
            out += [{k: a[i] for k, a in run.items()} for i in range(count)]
        return out

    def layer_axes(self) -> list[dict[str, tuple[tuple, tuple]]]:
        att = qwen3._stack_axes(self.layers)
        sparse = {ROUTER: "router", EXPERT_GATE: "expert_gate", EXPERT_UP: "expert_up", EXPERT_DOWN: "expert_down"}
        mlp = {k: qwen3._stack_axes(self.experts)[v] for k, v in sparse.items()}
        dense = qwen3._stack_axes(self.dense_mlp) if self.dense_mlp is not None else {}
        return [{**att, **(mlp if self.config.is_sparse(i) else dense)} for i in range(self.config.num_layers)]

    def _fuse_layer(self, p: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """A sparse layer fuses its attention only; its experts stay as they are."""
        return fuse_attention(p) if ROUTER in p else fuse_projections(p)

    # -- layers ------------------------------------------------------------------------------
    def _layer(self, p: dict, x, rope, mask, cache_kv, replay=None):
        """One layer of either kind: (x, new cache or None, ``moe.Routing`` or None)."""
        cfg, mesh, rules = self.config, self.mesh, self.rules
        w = layer_weights(cfg, p)
        x, new_kv = attention_sublayer(cfg, mesh, rules, w, x, rope, mask, cache_kv)
        if ROUTER in w:
            x, r = sparse_mlp_sublayer(cfg, mesh, rules, w, x, replay)
            return x, new_kv, r
        return dense_mlp_sublayer(cfg, mesh, rules, w, x), new_kv, None

    def _run_layers_cached(self, x, positions, visible, cache: KVCache, layer_params):
        """The cache path (see ``Qwen3``): also the experts of the chunk's tokens, int32 ``[Ls, B, T, k]``."""
        layers = self.layer_params() if layer_params is None else layer_params
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        ks, vs, experts = [], [], []
        B, T = x.shape[:2]
        for p, k_cache, v_cache in zip(layers, cache.k, cache.v, strict=True):
            x, (k_cache, v_cache), r = self._layer(p, x, rope, visible, (k_cache, v_cache, cache.end))
            ks.append(k_cache)
            vs.append(v_cache)
            if r is not None:
                experts.append(r.experts.reshape(B, T, -1))
        routing = jnp.stack(experts) if experts else jnp.zeros((0, B, T, self.config.num_experts_per_tok), jnp.int32)
        return x, tuple(ks), tuple(vs), routing

    def _run_layers_routed(self, x, positions, mask, collect_hidden: bool, valid, recorded, replay: bool):
        """The cache-free pass: (x, hidden ``[L, B, T, D]`` or None, ``RoutingRecord``). ``valid`` ``[B, T]``:
        the tokens the load-balancing sums count; ``recorded``: int ``[Ls, B, T, k]`` (-1: nothing recorded)
        or None, compared with this pass's routing, and with ``replay`` used in its place."""
        cfg = self.config
        B, T = x.shape[:2]
        k, E, Ls = cfg.num_experts_per_tok, cfg.num_experts, len(cfg.sparse_layers)
        if recorded is not None and recorded.shape != (Ls, B, T, k):
            raise ValueError(
                f"routing replay: expert ids of shape {tuple(recorded.shape)}, expected {(Ls, B, T, k)} "
                "(sparse layers, rows, tokens, experts per token)"
            )
        if replay and recorded is None:
            raise ValueError("routing replay needs the recorded experts (recorded=)")
        rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        hidden, experts, changed = [], [], []
        sums = (jnp.zeros((k, E), jnp.float32), jnp.zeros((E,), jnp.float32), jnp.zeros((), jnp.float32))
        for sparse, first, count, k0 in _runs(cfg):
            params = self._run_params(sparse, first, count, k0)
            rec = None if recorded is None or not sparse else recorded[k0 : k0 + count].astype(jnp.int32)

            def body(y, xs, sparse=sparse):
                p, rc = xs
                y, _, r = self._layer(p, y, rope, mask, None, rc if replay else None)
                if not sparse:
                    return y, ((y if collect_hidden else None), None, None, None)
                diff = None if rc is None else _changed(r, rc, valid)
                return y, (
                    (y if collect_hidden else None),
                    r.experts.reshape(B, T, k),
                    _routing_sums(r, valid, E),
                    diff,
                )

            body = qwen3._remat(body, cfg.remat_policy)
            if cfg.scans():
                x, (hid, ex, s, diff) = jax.lax.scan(body, x, (params, rec))
            else:
                outs = []
                for i in range(count):
                    x, o = body(x, jax.tree.map(lambda a, i=i: a[i], (params, rec)))
                    outs.append(o)
                hid, ex, s, diff = jax.tree.map(lambda *a: jnp.stack(a), *outs)
            if collect_hidden:
                hidden.append(hid)
            if sparse:
                experts.append(ex)
                sums = jax.tree.map(lambda a, b: a + jnp.sum(b, axis=0), sums, s)
                if diff is not None:
                    changed.append(diff)
        ex = jnp.concatenate(experts) if experts else jnp.zeros((0, B, T, k), jnp.int32)
        zero = jnp.zeros((), jnp.float32)
        if changed:
            diff = jnp.concatenate(changed)  # [Ls, B, T]
            has = (recorded[0, ..., 0] >= 0) & valid
            stats = (jnp.sum(has, dtype=jnp.float32), jnp.sum(jnp.any(diff, 0), dtype=jnp.float32))
            stats += (jnp.sum(diff, dtype=jnp.float32),)
        else:
            stats = (zero, zero, zero)
        record = RoutingRecord(ex, *sums, *stats)
        return x, (jnp.concatenate(hidden) if collect_hidden else None), record

    def _run_layers(self, x, positions, mask, collect_hidden: bool):
        valid = jnp.ones(x.shape[:2], bool)
        x, hidden, _ = self._run_layers_routed(x, positions, mask, collect_hidden, valid, None, False)
        return x, hidden

    # -- forward -----------------------------------------------------------------------------
    def final_hidden_routed(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        *,
        recorded: jax.Array | None = None,
        replay: bool = False,
    ) -> tuple[jax.Array, RoutingRecord]:
        """``final_hidden`` and the ``RoutingRecord`` of the pass (its sums count the tokens with a non-zero
        segment id). ``recorded``: int ``[Ls, B, T, k]`` experts a sampler routed each token to (-1 where it
        recorded nothing), compared with this pass's own choice; ``replay``: route the recorded tokens to
        them (routing replay), weighted by this pass's router probabilities."""
        positions, mask = self._no_cache_mask(input_ids, positions, segment_ids)
        valid = jnp.ones(input_ids.shape, bool) if segment_ids is None else segment_ids != 0
        x, _, record = self._run_layers_routed(
            self.embed_tokens(input_ids), positions, mask, False, valid, recorded, replay
        )
        return self._final_norm(x), record


qwen3.register_model_class(Qwen3MoeConfig, Qwen3Moe)
