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
from envace_jax.rl.head_logprobs import fused_token_logprobs
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
        self.opt_state = self._on_mesh(jax.jit(self.tx.init)(params))
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
                # host numpy: a single-device array cannot be saved by a multi-process checkpoint
                "rng": np.asarray(jax.random.key_data(self.rng))}

    def _on_mesh(self, tree):
        """Optimizer leaves that do not depend on the params (step counters, non-finite counts) come
        out of ``tx.init`` or a restore on one local device; with a mesh, replicate them over it so
        the jitted update never sees mixed device sets (across processes too)."""
        if self.mesh is None:
            return tree
        devices = set(self.mesh.devices.flat)
        rep = NamedSharding(self.mesh, PartitionSpec())

        def one(x):
            if not isinstance(x, jax.Array) or set(x.sharding.device_set) == devices:
                return x
            host = np.asarray(x)
            if jax.process_count() > 1:
                return jax.make_array_from_process_local_data(rep, host, host.shape)
            return jax.device_put(host, rep)

        return jax.tree.map(one, tree)

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
        self.rng = jax.random.wrap_key_data(jnp.asarray(state["rng"]))

    @property
    def nonfinite_steps(self) -> int:
        return int(self.opt_state.total_notfinite)

    # ------------------------------------------------------------------ losses
    def _forward_logp(self, params, mb):
        model = nnx.merge(self.graphdef, params, self.rest)
        # The vocabulary projection is fused with the log-softmax (no [B, T, V] logits kept twice).
        hidden = model.final_hidden(mb["tokens"], mb["positions"], mb["segment_ids"])
        head, layout = model.head_weight()
        return fused_token_logprobs(hidden, head, mb["targets"], mb["temperature"][:, None], head_layout=layout,
                                    compute_dtype=model.config.dtype)

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
        """Host rows -> device arrays sharded over the batch axes of the mesh.

        With several processes each one passes ITS OWN rows (same shapes on every process, see
        ``_local_micro_batches``) and the global array is their concatenation in process order, so
        every sum the jitted code takes is over all processes' rows.
        """
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in arrays.items()}
        multi = jax.process_count() > 1
        out = {}
        for k, v in arrays.items():
            gshape = (v.shape[0] * jax.process_count(),) + v.shape[1:] if multi else v.shape
            spec = shd.logical_to_spec(("batch",) + (None,) * (v.ndim - 1), shd.TRAIN_RULES, self.mesh, gshape)
            sharding = NamedSharding(self.mesh, spec)
            if multi:
                out[k] = jax.make_array_from_process_local_data(sharding, v, gshape)
            else:
                out[k] = jax.device_put(v, sharding)
        return out

    def _local_micro_batches(self, batch: TrainBatch) -> list[dict[str, np.ndarray]]:
        """This process's rows cut into micro-batches of ``micro_batch_size`` rows.

        Single process: plain slices. Several processes: every process must feed the same number of
        micro-batches of the same shape, so lengths are padded to the longest row width of any
        process and every micro-batch is filled up to ``micro_batch_size`` (rounded up to this
        process's device count) with zero-weight padding rows (segment id 0, weight 0: they add
        nothing to any loss sum or count).
        """
        arrays = batch.arrays()
        mbs = self.micro_batch_size
        if jax.process_count() == 1:
            return [{k: v[s:s + mbs] for k, v in arrays.items()} for s in range(0, batch.size, mbs)]
        from jax.experimental import multihost_utils

        shapes = np.asarray(multihost_utils.process_allgather(np.asarray(batch.tokens.shape, np.int64)))
        rows, width = int(shapes[:, 0].max()), int(shapes[:, 1].max())
        mbs = -(-mbs // jax.local_device_count()) * jax.local_device_count()
        n_mb = max(1, -(-rows // mbs))
        out = []
        for m in range(n_mb):
            mb = {}
            for k, v in arrays.items():
                part = v[m * mbs:(m + 1) * mbs]
                pad = [(0, mbs - part.shape[0])] + [(0, width - d) for d in part.shape[1:]]
                fill = 1.0 if k == "temperature" else (-1 if k == "group_ids" else 0)
                mb[k] = np.pad(part, pad, constant_values=np.asarray(fill, v.dtype))
            out.append(mb)
        return out

    def _host_rows(self, x: jax.Array) -> np.ndarray:
        """This process's rows of a batch-sharded device array (all rows with one process)."""
        if jax.process_count() == 1:
            return np.asarray(x)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.global_array_to_host_local_array(x, self.mesh, x.sharding.spec))

    def compute_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """Current-policy log-probs ``[B, L]`` (the reference's ``old_log_probs`` recomputation).

        Rows and width are this process's ``batch``; with several processes every process must call
        this (it is a collective).
        """
        fn = self._grad_fns.get("logp")
        if fn is None:
            fn = self._grad_fns["logp"] = jax.jit(self._forward_logp)
        outs = []
        for mb in self._local_micro_batches(batch):
            n = len(mb["tokens"])
            outs.append(self._host_rows(fn(self.params, self._device_batch(mb)))[:n])
        B, L = batch.tokens.shape
        return np.concatenate(outs, 0)[:B, :L] * batch.loss_weights

    def accumulate(self, batch: TrainBatch, kind: str = "rl"):
        """Gradient sums and metric (sum, count) pairs over all micro-batches of ``batch``."""
        if kind not in ("rl", "sft"):
            raise ValueError(f"update kind {kind!r}; choose 'rl' or 'sft'")
        grad_fn = self._grad_fn(kind)
        params = self.params
        grads, sums = None, None
        extra = {}
        if kind == "rl" and self.loss_cfg.role_balanced:
            # Role weights must see the whole optimizer batch (all processes), not one micro-batch.
            counts = np.asarray(loss_lib.role_unit_counts(
                jnp.asarray(batch.loss_weights), jnp.asarray(batch.role_ids), self.loss_cfg.agg))
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                counts = np.asarray(multihost_utils.process_allgather(counts)).sum(0)
            extra["role_counts"] = counts.astype(np.float32)
        for host_mb in self._local_micro_batches(batch):
            mb = self._device_batch(host_mb)
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
                # Every process must take the same number of steps (each is a collective); a process
                # with no rows in this part contributes zero-weight padding rows.
                if len(part) or jax.process_count() > 1:
                    out.append(self.update(batch.take(np.sort(part))))
        return out
