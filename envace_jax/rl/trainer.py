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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from envace_jax import sharding as shd
from envace_jax.rl import loss as loss_lib
from envace_jax.rl.batch import TrainBatch
from envace_jax.rl.types import ROLE_ID


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Reference values (spec 1.2): AdamW 1e-6 constant, betas (0.9, 0.999), wd 0.01, clip 1.0."""

    lr: float = 1e-6
    schedule: str = "constant"      # constant | cosine | linear
    warmup_steps: int = 0
    total_steps: int = 1000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_consecutive_nonfinite: int = 100

    def __post_init__(self):
        if self.schedule not in ("constant", "cosine", "linear"):
            raise ValueError(f"optim.schedule={self.schedule!r}; choose constant, cosine or linear")
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}")
        if self.grad_clip <= 0:
            raise ValueError(f"optim.grad_clip must be positive, got {self.grad_clip}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Reference values (spec 5.3): clip 0.2/0.2, dual clip 3.0, KL off, entropy 0."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    log_ratio_clamp: float = 20.0
    agg: str = "seq_mean_token_mean"
    kl_coef: float = 0.0
    kl_type: str = "k3"
    entropy_coef: float = 0.0
    role_balanced: bool = False


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    decay_steps = max(1, cfg.total_steps - cfg.warmup_steps)
    if cfg.schedule == "constant":
        main = optax.constant_schedule(cfg.lr)
    elif cfg.schedule == "cosine":
        main = optax.cosine_decay_schedule(cfg.lr, decay_steps)
    else:
        main = optax.linear_schedule(cfg.lr, 0.0, decay_steps)
    if cfg.warmup_steps <= 0:
        return main
    warm = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warm, main], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    # A non-finite gradient skips the step (parameters and moments unchanged) and is counted.
    return optax.apply_if_finite(tx, cfg.max_consecutive_nonfinite)


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


class Trainer:
    """Holds params + optimizer state for one policy and applies RL or SFT updates."""

    def __init__(self, model: nnx.Module, optim: OptimConfig = OptimConfig(), loss: LossConfig = LossConfig(),
                 *, micro_batch_size: int = 8, mesh: Mesh | None = None, ref_model: nnx.Module | None = None,
                 seed: int = 0):
        self.model, self.optim_cfg, self.loss_cfg = model, optim, loss
        self.micro_batch_size = int(micro_batch_size)
        if self.micro_batch_size <= 0:
            raise ValueError(f"trainer.micro_batch_size must be positive, got {micro_batch_size}")
        self.mesh = mesh
        self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
        self.tx = make_optimizer(optim)
        self.opt_state = jax.jit(self.tx.init)(params)
        self.step = 0
        self.rng = jax.random.key(seed)
        self.ref_params = None
        if loss.kl_coef > 0:
            if ref_model is None:  # a frozen copy of the starting policy
                self.ref_params = jax.tree.map(jnp.copy, params)
            else:
                self.ref_params = nnx.state(ref_model, nnx.Param)
        self._grad_fns: dict[str, Callable] = {}
        self._apply = jax.jit(self._apply_impl, donate_argnums=(0, 1))

    # ------------------------------------------------------------------ state
    @property
    def params(self):
        return nnx.state(self.model, nnx.Param)

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state, "step": self.step,
                "rng": jax.random.key_data(self.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        nnx.update(self.model, state["params"])
        self.opt_state = state["opt_state"]
        self.step = int(state["step"])
        self.rng = jax.random.wrap_key_data(jnp.asarray(state["rng"]))

    @property
    def nonfinite_steps(self) -> int:
        return int(self.opt_state.total_notfinite)

    # ------------------------------------------------------------------ losses
    def _forward_logp(self, params, mb):
        model = nnx.merge(self.graphdef, params, self.rest)
        logits = model(mb["tokens"], mb["positions"], mb["segment_ids"])
        return loss_lib.token_logprobs(logits, mb["targets"], mb["temperature"][:, None, None])

    def _rl_sums(self, params, mb, ref_params):
        c = self.loss_cfg
        logp = self._forward_logp(params, mb)
        ref_logp = None if ref_params is None else jax.lax.stop_gradient(self._forward_logp(ref_params, mb))
        out = loss_lib.policy_loss(
            logp, mb["old_logprobs"], mb["advantages"], mb["loss_weights"],
            clip_low=c.clip_low, clip_high=c.clip_high, dual_clip=c.dual_clip,
            log_ratio_clamp=c.log_ratio_clamp, ref_logp=ref_logp, kl_coef=c.kl_coef, kl_type=c.kl_type,
            agg=c.agg, role_ids=mb["role_ids"], role_balanced=c.role_balanced,
            role_counts=mb.get("role_counts"))
        w = mb["loss_weights"]
        diff = jnp.abs(jax.lax.stop_gradient(logp) - mb["old_logprobs"]) * w
        for name, rid in ROLE_ID.items():
            rw = w * (mb["role_ids"][:, None] == rid)
            out[f"logp_mismatch/{name}"] = (jnp.sum(diff * rw), jnp.sum(rw))
        return out["loss"][0], out

    def _sft_sums(self, params, mb, ref_params):
        del ref_params
        logp = self._forward_logp(params, mb)
        w = mb["loss_weights"]
        out = {"loss": (-jnp.sum(logp * w), jnp.sum(w))}
        for name, rid in ROLE_ID.items():
            rw = w * (mb["role_ids"][:, None] == rid)
            out[f"nll/{name}"] = (-jnp.sum(jax.lax.stop_gradient(logp) * rw), jnp.sum(rw))
        return out["loss"][0], out

    def _grad_fn(self, kind: str):
        if kind not in self._grad_fns:
            fn = self._rl_sums if kind == "rl" else self._sft_sums
            self._grad_fns[kind] = jax.jit(jax.grad(fn, has_aux=True))
        return self._grad_fns[kind]

    def _apply_impl(self, params, opt_state, grads, count):
        grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
        gnorm = optax.tree.norm(grads)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, gnorm

    # ------------------------------------------------------------------ update
    def _device_batch(self, arrays: dict[str, np.ndarray]):
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        out = {}
        for k, v in arrays.items():
            spec = shd.logical_to_spec(("batch",) + (None,) * (v.ndim - 1), shd.TRAIN_RULES, self.mesh, v.shape)
            out[k] = jax.device_put(v, NamedSharding(self.mesh, spec))
        return out

    def compute_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """Current-policy log-probs ``[B, L]`` (the reference's ``old_log_probs`` recomputation)."""
        fn = self._grad_fns.get("logp")
        if fn is None:
            fn = self._grad_fns["logp"] = jax.jit(self._forward_logp)
        outs = []
        for s in range(0, batch.size, self.micro_batch_size):
            mb = self._device_batch({k: v[s:s + self.micro_batch_size] for k, v in batch.arrays().items()})
            outs.append(np.asarray(fn(self.params, mb)))
        return np.concatenate(outs, 0) * batch.loss_weights

    def accumulate(self, batch: TrainBatch, kind: str = "rl"):
        """Gradient sums and metric (sum, count) pairs over all micro-batches of ``batch``."""
        if kind not in ("rl", "sft"):
            raise ValueError(f"update kind {kind!r}; choose 'rl' or 'sft'")
        grad_fn = self._grad_fn(kind)
        params = self.params
        grads, sums = None, None
        arrays = batch.arrays()
        extra = {}
        if kind == "rl" and self.loss_cfg.role_balanced:
            # Role weights must see the whole optimizer batch, not one micro-batch.
            extra["role_counts"] = loss_lib.role_unit_counts(
                jnp.asarray(batch.loss_weights), jnp.asarray(batch.role_ids), self.loss_cfg.agg)
        for s in range(0, batch.size, self.micro_batch_size):
            mb = self._device_batch({k: v[s:s + self.micro_batch_size] for k, v in arrays.items()})
            mb.update(extra)
            g, aux = grad_fn(params, mb, self.ref_params)
            grads = g if grads is None else _tree_add(grads, g)
            sums = aux if sums is None else jax.tree.map(jnp.add, sums, aux)
        return grads, sums

    def gradients(self, batch: TrainBatch, kind: str = "rl"):
        """The batch-mean gradient (what the optimizer step sees, before clipping)."""
        grads, sums = self.accumulate(batch, kind)
        count = jnp.maximum(sums["loss"][1], 1.0)
        return jax.tree.map(lambda g: g / count, grads)

    def update(self, batch: TrainBatch, kind: str = "rl") -> dict[str, float]:
        """One optimizer step over ``batch`` (accumulating micro-batches). Returns metrics."""
        grads, sums = self.accumulate(batch, kind)
        count = sums["loss"][1]
        before = self.nonfinite_steps
        new_params, self.opt_state, gnorm = self._apply(self.params, self.opt_state, grads, count)
        nnx.update(self.model, new_params)
        self.step += 1
        metrics = {k: float(s) / max(float(n), 1e-12) for k, (s, n) in sums.items() if float(n) > 0}
        metrics["grad_norm"] = float(gnorm)
        metrics["skipped_nonfinite"] = float(self.nonfinite_steps - before)
        metrics["lr"] = float(make_schedule(self.optim_cfg)(self.step - 1))
        return metrics

    def ppo_update(self, batch: TrainBatch, *, epochs: int = 1, mini_batches: int = 1,
                   shuffle: bool = True) -> list[dict[str, float]]:
        """``epochs`` passes of ``mini_batches`` optimizer steps (reference: 1 x 1)."""
        out = []
        n = batch.size
        for ep in range(epochs):
            order = np.arange(n)
            if shuffle and mini_batches > 1:
                order = np.random.default_rng(self.step * 7919 + ep).permutation(n)
            for part in np.array_split(order, mini_batches):
                if len(part):
                    out.append(self.update(batch.take(np.sort(part))))
        return out
