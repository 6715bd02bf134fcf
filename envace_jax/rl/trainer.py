"""Train state and the jitted update (RL policy loss or SFT cross-entropy).

The model's parameters are split once (``nnx.split``) into a graph definition and
a Param state; the update is a pure function of (params, optimizer state, batch)
compiled with ``jax.jit``. After every optimizer step the live ``nnx.Module`` is
updated in place, so the sampler, which reads the module's state, always samples
from the current weights without a copy.

Micro-batching is exact: each micro-batch returns the gradient of its loss *sum*
together with the loss *count*; gradients and counts are added up and the sum is
divided by the total count once, so N micro-batches give the same update as one
big batch in every aggregation mode.

Neighbours: the optimizer is built in ``rl.optim``, rows are placed on the mesh (and padded
for multi-process lockstep) by ``rl.placement``, and the PPO epochs over a batch are the RL
step's (``rl.step.ppo_update``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from envace_jax import fast_defaults
from envace_jax import sharding as shd
from envace_jax.config import LossConfig, OptimConfig  # defined with every other knob
from envace_jax.rl import loss as loss_lib
from envace_jax.rl import placement, prefix_plan
from envace_jax.rl.batch import TrainBatch
from envace_jax.rl.head_logprobs import fused_token_logprobs, gathered_token_logprobs
from envace_jax.rl.optim import make_optimizer, make_schedule, scaled_norm  # make_*: re-exported
from envace_jax.rl.placement import opt_state_shardings, process_micro_batch_rows  # noqa: F401  (re-exported)
from envace_jax.rl.types import ROLE_ID


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


def _committed(tree):
    """Each array committed to the device it is on (a no-op for arrays already committed)."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding) if isinstance(x, jax.Array) else x, tree)


class Trainer:
    """Holds params + optimizer state for one policy and applies RL or SFT updates."""

    def __init__(
        self,
        model: nnx.Module,
        optim: OptimConfig = OptimConfig(),
        loss: LossConfig = LossConfig(),
        *,
        micro_batch_size: int = 8,
        mesh: Mesh | None = None,
        ref_model: nnx.Module | None = None,
        pad_micro_batches: bool = False,
        gather_trained: bool = True,
        share_prefixes: bool | None = None,
    ):
        """``pad_micro_batches``: fill a short last micro-batch with zero-weight rows, so batches of any
        row count reuse one compiled program per width (several processes always pad, in lockstep).
        ``gather_trained``: run the vocabulary head on the trained positions only (those with a loss
        weight) when they are at most 3/4 of a micro-batch's positions (``placement.trained_positions``);
        the loss and its gradient are the same, up to float32 summation order.
        ``share_prefixes``: run the tokens that the rows of a GRPO group share (their prompt) through the
        model once per micro-batch instead of once per row (``rl.prefix_plan``,
        ``Qwen3.final_hidden_shared``), when that saves at least a tenth of the positions; the same
        log-probs up to float32 summation order. On one device only (no mesh, or a mesh of one); the default
        (None) is on there (``envace_jax.fast_defaults``)."""
        if loss.entropy_coef:
            # The fused vocabulary head returns log-probs only; an entropy bonus set here would silently
            # not be applied.
            raise ValueError(
                f"loss.entropy_coef={loss.entropy_coef}: the Trainer's update has no entropy term "
                "(its fused vocabulary head returns log-probs only); set it to 0"
            )
        self.model, self.optim_cfg, self.loss_cfg = model, optim, loss
        self.pad_micro_batches = bool(pad_micro_batches)
        self.gather_trained = bool(gather_trained)
        # A Qwen3-MoE's forward also reports its routing (the load-balancing loss, routing replay and its metric)
        self.moe = hasattr(model, "final_hidden_routed")
        if not self.moe and (loss.router_aux_coef or loss.routing_replay):
            raise ValueError("loss.router_aux_coef and loss.routing_replay apply to a Qwen3-MoE; this model is dense")
        if self.moe and share_prefixes:
            raise ValueError("share_prefixes: a Qwen3-MoE's update runs its rows as they are (routing is per row)")
        share_prefixes = False if self.moe else share_prefixes
        self.share_prefixes = fast_defaults.share_repeated_prompts(share_prefixes, mesh)
        if self.share_prefixes and mesh is not None and mesh.size > 1:
            raise ValueError(f"share_prefixes runs on one device, not on a mesh of {mesh.size} devices")
        self.micro_batch_size = int(micro_batch_size)
        if self.micro_batch_size <= 0:
            raise ValueError(f"trainer.micro_batch_size must be positive, got {micro_batch_size}")
        self.mesh = mesh
        # LoRA (models/lora.py): only the adapters train; the base weights are a frozen argument of every program
        # (never closed over as constants, never in the optimizer state or the gradient)
        self.lora = bool(model.config.lora_scale)
        self.trainable = nnx.LoRAParam if self.lora else nnx.Param
        if self.lora:
            self.graphdef, params, _, self.rest = nnx.split(model, nnx.LoRAParam, nnx.Param, ...)
        else:
            self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.tx = make_optimizer(optim)
        # A model whose parameters are ShapeDtypeStructs (``nnx.eval_shape``) gives an abstract trainer:
        # no device work, state as ShapeDtypeStructs, for lowering the update ahead of time (envace_jax.aot).
        self.abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
        if mesh is None and not self.abstract:
            # Weights made from host arrays (a checkpoint, safetensors) and the optimizer state jit(tx.init)
            # makes are not committed to a device, while the update's outputs are: without this the first
            # update's programs are keyed on uncommitted inputs and the second update compiles them again
            # (~1.5 s on the demo's model).
            params = _committed(params)
            nnx.update(model, params)
            if self.lora:
                nnx.update(model, _committed(self.frozen))
        self._opt_shardings = opt_state_shardings(self.tx, params, mesh) if mesh is not None else None
        if self.abstract:
            self.opt_state = jax.eval_shape(self.tx.init, params)
            if self._opt_shardings is not None:
                self.opt_state = jax.tree.map(
                    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.opt_state, self._opt_shardings
                )
        else:
            self.opt_state = self._on_mesh(jax.jit(self.tx.init, out_shardings=self._opt_shardings)(params))
            if mesh is None:  # committed like the parameters (see above)
                self.opt_state = _committed(self.opt_state)
        self.step = 0
        self.ref_params = None
        if loss.kl_coef > 0:
            if ref_model is None:  # a frozen copy of the starting policy
                self.ref_params = params if self.abstract else jax.tree.map(jnp.copy, params)
            else:
                self.ref_params = nnx.state(ref_model, self.trainable)
        self._grad_fns: dict[str, Callable] = {}
        out_sh = None
        if mesh is not None:
            # Pinned so the moments keep their parameters' sharding step after step (left to XLA, the
            # outputs of an update are free to come back replicated).
            out_sh = (jax.tree.map(lambda x: x.sharding, params), self._opt_shardings, shd.replicated(mesh))
        self._apply = jax.jit(self._apply_impl, donate_argnums=(0, 1), out_shardings=out_sh)

    # ------------------------------------------------------------------ state
    @property
    def params(self):
        """The trained parameters: every Param, or the LoRA adapters alone."""
        return nnx.state(self.model, self.trainable)

    @property
    def frozen(self):
        """The base weights a LoRA trainer does not train (None without LoRA): the programs' last argument."""
        if not self.lora:
            return None
        return nnx.state(self.model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state, "step": self.step}

    def _on_mesh(self, tree):
        return placement.replicate_unplaced(tree, self.mesh)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        nnx.update(self.model, state["params"])

        # A restored leaf may come back on one local device (Orbax restores scalars that way); put it
        # where the live optimizer state lives, or the jitted update sees mixed device sets.
        def place(new, cur):
            if isinstance(cur, jax.Array) and getattr(new, "sharding", None) != cur.sharding:
                return jax.device_put(np.asarray(new), cur.sharding)
            return new

        self.opt_state = self._on_mesh(jax.tree.map(place, state["opt_state"], self.opt_state))
        self.step = int(state["step"])

    @property
    def nonfinite_steps(self) -> int:
        return int(self.opt_state.total_notfinite)

    # ------------------------------------------------------------------ losses
    def _forward_logp(self, params, mb, frozen=None):
        return self._forward_routed(params, mb, frozen)[0]

    def _forward_routed(self, params, mb, frozen=None):
        """(token log-probs ``[B, L]``, a Qwen3-MoE's ``RoutingRecord`` or None)."""
        states = (params, frozen, self.rest) if frozen is not None else (params, self.rest)
        model = nnx.merge(self.graphdef, *states)
        record = None
        # The vocabulary projection is fused with the log-softmax (no [B, T, V] logits kept twice).
        if "full_index" in mb:  # a prefix_plan: each shared prompt computed once
            shared = prefix_plan.layout(mb)
            hidden = model.final_hidden_shared(mb["prefix_tokens"], mb["suffix_tokens"], shared, mb["full_index"])
        elif self.moe:
            # the sampler's record [B, L, Ls, k] -> [Ls, B, L, k]; replayed with loss.routing_replay, else compared
            recorded = jnp.moveaxis(mb["routing"], 2, 0) if "routing" in mb else None
            replay = self.loss_cfg.routing_replay and recorded is not None
            hidden, record = model.final_hidden_routed(
                mb["tokens"], mb["positions"], mb["segment_ids"], recorded=recorded, replay=replay
            )
        else:
            hidden = model.final_hidden(mb["tokens"], mb["positions"], mb["segment_ids"])
        return self._token_logprobs(model, hidden, mb), record

    def _moe_terms(self, out: dict, record) -> None:
        """Adds a Qwen3-MoE's load-balancing loss (``loss.router_aux_coef`` times the loss count of this
        micro-batch, so the update divides it back to the coefficient times the mean) and its routing metrics."""
        if record is None:
            return
        aux = record.aux_loss()
        one = jnp.ones((), jnp.float32)
        if self.loss_cfg.router_aux_coef:
            s, n = out["loss"]
            out["loss"] = (s + self.loss_cfg.router_aux_coef * aux * n, n)
        out["router_aux_loss"] = (aux, one)
        sparse = record.experts.shape[0]
        out["routing/changed_tokens"] = (record.changed_tokens, record.recorded_tokens)
        out["routing/changed_choices"] = (record.changed_choices, record.recorded_tokens * sparse)

    def _token_logprobs(self, model, hidden, mb):
        head, layout = model.head_weight()
        if "trained_index" in mb:
            return gathered_token_logprobs(
                hidden,
                head,
                mb["targets"],
                mb["trained_index"],
                mb["temperature"][:, None],
                head_layout=layout,
                compute_dtype=model.config.dtype,
            )
        return fused_token_logprobs(
            hidden,
            head,
            mb["targets"],
            mb["temperature"][:, None],
            head_layout=layout,
            compute_dtype=model.config.dtype,
        )

    def _rl_sums(
        self, params, mb, ref_params, frozen=None, old_from_update: bool = False, behaviour: tuple | None = None
    ):
        c = self.loss_cfg
        logp, record = self._forward_routed(params, mb, frozen)
        ref_logp = None
        if ref_params is not None:
            ref_logp = jax.lax.stop_gradient(self._forward_logp(ref_params, mb, frozen))
        # old_from_update: pi_old is the policy at these very weights (one optimizer step per batch), so
        # its log-probs are this pass's, held constant; mb["old_logprobs"] stays the sampler's for the metric
        old = jax.lax.stop_gradient(logp) if old_from_update else mb["old_logprobs"]
        # behaviour = (mode, cap): decoupled PPO, old is the proximal policy and mb["behaviour_logprobs"] the
        # sampler's (loss.behaviour_weights)
        is_kw = {}
        if behaviour is not None:
            is_kw = dict(
                behaviour_logp=mb["behaviour_logprobs"], behaviour_mode=behaviour[0], behaviour_cap=behaviour[1]
            )
        out = loss_lib.policy_loss(
            logp,
            old,
            mb["advantages"],
            mb["loss_weights"],
            clip_low=c.clip_low,
            clip_high=c.clip_high,
            dual_clip=c.dual_clip,
            log_ratio_clamp=c.log_ratio_clamp,
            ref_logp=ref_logp,
            kl_coef=c.kl_coef,
            kl_type=c.kl_type,
            agg=c.agg,
            role_ids=mb["role_ids"],
            role_balanced=c.role_balanced,
            role_counts=mb.get("role_counts"),
            ratio_level=c.ratio_level,
            agg_norm=c.agg_norm,
            **is_kw,
        )
        w = mb["loss_weights"]
        diff = jnp.abs(jax.lax.stop_gradient(logp) - mb["old_logprobs"]) * w
        for name, rid in ROLE_ID.items():
            rw = w * (mb["role_ids"][:, None] == rid)
            out[f"logp_mismatch/{name}"] = (jnp.sum(diff * rw), jnp.sum(rw))
        self._moe_terms(out, record)
        return out["loss"][0], out

    def _sft_sums(self, params, mb, ref_params, frozen=None):
        del ref_params
        logp, record = self._forward_routed(params, mb, frozen)
        w = mb["loss_weights"]
        out = {"loss": (-jnp.sum(logp * w), jnp.sum(w))}
        self._moe_terms(out, record)
        for name, rid in ROLE_ID.items():
            rw = w * (mb["role_ids"][:, None] == rid)
            out[f"nll/{name}"] = (-jnp.sum(jax.lax.stop_gradient(logp) * rw), jnp.sum(rw))
        return out["loss"][0], out

    def _grad_fn(self, kind: str, old_from_update: bool = False, behaviour: tuple | None = None):
        key = kind + ("/old_from_update" if old_from_update else "") + (f"/is_{behaviour}" if behaviour else "")
        if key not in self._grad_fns:
            if kind == "rl":
                fn = functools.partial(self._rl_sums, old_from_update=old_from_update, behaviour=behaviour)
            else:
                fn = self._sft_sums
            self._grad_fns[key] = jax.jit(jax.grad(fn, has_aux=True))
        return self._grad_fns[key]

    def program(self, name: str) -> Callable:
        """A jitted program of the update, for lowering with abstract arguments (``envace_jax.aot``).

        ``"grad"``: (params, micro-batch dict, ref params or None[, frozen]) -> (gradient sums, metric (sum,
        count) pairs) of the RL loss; ``"apply"``: (params, opt state, gradient sums, count) -> (params, opt
        state, grad norm); ``"logprobs"``: (params, micro-batch dict[, frozen]) -> float32 ``[B, L]``. ``frozen``:
        a LoRA trainer's base weights (``Trainer.frozen``); without LoRA it is left out.
        """
        if name == "grad":
            return self._grad_fn("rl")
        if name == "apply":
            return self._apply
        if name == "logprobs":
            return self._logprob_fn()
        raise ValueError(f"Trainer.program({name!r}): choose 'grad', 'apply' or 'logprobs'")

    def _logprob_fn(self) -> Callable:
        fn = self._grad_fns.get("logp")
        if fn is None:
            fn = self._grad_fns["logp"] = jax.jit(self._forward_logp)
        return fn

    def _apply_impl(self, params, opt_state, grads, count):
        # the mean gradient is grads / count; the optimizer takes the scale instead of a divided copy, so the
        # step holds no parameter-sized temporary (optim.make_optimizer)
        scale = 1.0 / jnp.maximum(count, 1.0)
        if getattr(self.tx.update, "takes_grad_scale", False):
            gnorm = scaled_norm(grads, scale)
            updates, opt_state = self.tx.update(grads, opt_state, params, grad_scale=scale)
        else:  # another optax transformation: the divided copy
            grads = jax.tree.map(lambda g: g * scale, grads)
            gnorm = optax.tree.norm(grads)
            updates, opt_state = self.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, gnorm

    # ------------------------------------------------------------------ update
    def _device_batch(self, arrays: dict[str, np.ndarray]):
        return placement.device_batch(arrays, self.mesh)

    def _local_micro_batches(self, batch: TrainBatch) -> list[dict[str, np.ndarray]]:
        loss_lib.check_temperature(batch.temperature)  # the jitted forward divides by it
        if self.moe and batch.routing is None:
            # every micro-batch of a Qwen3-MoE carries a routing record (-1: none), so a batch without one (an
            # SFT batch, another policy's rows, a process's placeholder row) runs the same program as the rest
            cfg = self.model.config
            shape = (*batch.tokens.shape, len(cfg.sparse_layers), cfg.num_experts_per_tok)
            batch = TrainBatch(**{**batch.arrays(), "routing": np.full(shape, -1, np.int16)})
        parts = placement.local_micro_batches(batch, self.micro_batch_size, pad_last=self.pad_micro_batches)
        if self.share_prefixes:
            for mb in parts:
                mb.update(prefix_plan.plan(mb) or {})
        if self.gather_trained:
            for mb in parts:
                w = mb["loss_weights"]
                index = placement.trained_positions(w, placement.row_groups(self.mesh, *w.shape))
                if index is not None:
                    mb["trained_index"] = index
        return parts

    def _host_rows(self, x: jax.Array) -> np.ndarray:
        return placement.host_rows(x, self.mesh)

    def compute_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """Current-policy log-probs ``[B, L]`` (the reference's ``old_log_probs`` recomputation).

        Rows and width are this process's ``batch``; with several processes every process must call
        this (it is a collective).
        """
        fn = self._logprob_fn()
        outs = []
        for mb in self._local_micro_batches(batch):
            n = len(mb["tokens"])
            outs.append(self._host_rows(fn(self.params, self._device_batch(mb), self.frozen))[:n])
        B, L = batch.tokens.shape
        return np.concatenate(outs, 0)[:B, :L] * batch.loss_weights

    def accumulate(
        self,
        batch: TrainBatch,
        kind: str = "rl",
        *,
        old_from_update: bool = False,
        role_counts: np.ndarray | None = None,
        behaviour: tuple[str, float] | None = None,
    ):
        """Gradient sums and metric (sum, count) pairs over all micro-batches of ``batch``.

        ``old_from_update``: the RL loss takes pi_old's log-probs from this pass (see ``update``).
        ``behaviour``: ``(mode, cap)`` of the off-policy correction (see ``update``).
        ``role_counts``: role-balanced unit counts of the whole optimizer batch, when ``batch`` holds only
        some of its rows (``loss.role_unit_counts``; summed over processes by the caller)."""
        if kind not in ("rl", "sft"):
            raise ValueError(f"update kind {kind!r}; choose 'rl' or 'sft'")
        if old_from_update and kind != "rl":
            raise ValueError("old_from_update applies to the RL loss only")
        if behaviour is not None:
            if kind != "rl":
                raise ValueError("behaviour weights apply to the RL loss only")
            if batch.behaviour_logprobs is None:
                raise ValueError("behaviour weights need the batch's behaviour_logprobs (the sampler's log-probs)")
            behaviour = (str(behaviour[0]), float(behaviour[1]))
        grad_fn = self._grad_fn(kind, old_from_update, behaviour)
        params, frozen = self.params, self.frozen
        grads, sums = None, None
        extra = {}
        if kind == "rl" and self.loss_cfg.role_balanced and role_counts is not None:
            extra["role_counts"] = np.asarray(role_counts, np.float32)
        elif kind == "rl" and self.loss_cfg.role_balanced:
            # Role weights must see the whole optimizer batch (all processes), not one micro-batch.
            counts = np.asarray(
                loss_lib.role_unit_counts(
                    jnp.asarray(batch.loss_weights), jnp.asarray(batch.role_ids), self.loss_cfg.agg
                )
            )
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                counts = np.asarray(multihost_utils.process_allgather(counts)).sum(0)
            extra["role_counts"] = counts.astype(np.float32)
        for host_mb in self._local_micro_batches(batch):
            mb = self._device_batch(host_mb)
            mb.update(extra)
            g, aux = grad_fn(params, mb, self.ref_params, frozen)
            grads = g if grads is None else _tree_add(grads, g)
            sums = aux if sums is None else jax.tree.map(jnp.add, sums, aux)
        return grads, sums

    def gradients(self, batch: TrainBatch, kind: str = "rl"):
        """The batch-mean gradient (what the optimizer step sees, before clipping)."""
        grads, sums = self.accumulate(batch, kind)
        count = jnp.maximum(sums["loss"][1], 1.0)
        return jax.tree.map(lambda g: g / count, grads)

    def update(
        self,
        batch: TrainBatch,
        kind: str = "rl",
        *,
        old_from_update: bool = False,
        loss_count: float | None = None,
        role_counts: np.ndarray | None = None,
        behaviour: tuple[str, float] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` (accumulating micro-batches). Returns metrics.

        ``behaviour=(mode, cap)`` (RL): decoupled PPO for rows an older policy sampled: ``batch.old_logprobs``
        (or, with ``old_from_update``, this pass's) are the proximal policy's and every token's loss is
        weighted by ``loss.behaviour_weights(pi_prox, batch.behaviour_logprobs, mode, cap)``.
        ``old_from_update`` (RL): pi_old's log-probs are this pass's own, held constant (ratio 1), which
        is what recomputing them before a single optimizer step gives, without the second pass.
        ``loss_count``: the loss count of the whole optimizer batch when ``batch`` holds only some of its
        rows (rows left out must add nothing to the gradient: ``rl.skip_zero_advantage_rows``); the
        gradient and the ``loss`` metric are divided by it (summed over processes by the caller), with
        ``role_counts`` of that whole batch for role-balanced losses. Other metrics are over ``batch``."""
        grads, sums = self.accumulate(
            batch, kind, old_from_update=old_from_update, role_counts=role_counts, behaviour=behaviour
        )
        count = sums["loss"][1] if loss_count is None else jnp.asarray(loss_count, jnp.float32)
        if loss_count is not None:
            sums = dict(sums, loss=(sums["loss"][0], count))
        before = self.nonfinite_steps
        new_params, self.opt_state, gnorm = self._apply(self.params, self.opt_state, grads, count)
        nnx.update(self.model, new_params)
        self.step += 1
        metrics = {k: float(s) / max(float(n), 1e-12) for k, (s, n) in sums.items() if float(n) > 0}
        if "is_weight_sq" in metrics:  # the spread of the importance weights, from their first two moments
            sq = metrics.pop("is_weight_sq")
            metrics["is_weight_std"] = float(np.sqrt(max(sq - metrics.get("is_weight", 0.0) ** 2, 0.0)))
        metrics["grad_norm"] = float(gnorm)
        metrics["skipped_nonfinite"] = float(self.nonfinite_steps - before)
        metrics["lr"] = float(make_schedule(self.optim_cfg)(self.step - 1))
        return metrics
