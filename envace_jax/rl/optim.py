"""The optimizer of a policy: AdamW with global-norm clipping, a learning-rate schedule, and a skip of
any step whose gradient is not finite (``OptimConfig`` in ``envace_jax.config`` holds the knobs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from envace_jax.config import OptimConfig


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
    if cfg.schedule != "constant" and cfg.total_steps <= cfg.warmup_steps:
        raise ValueError(
            f"optim.schedule={cfg.schedule!r} decays over optim.total_steps - optim.warmup_steps "
            f"optimizer steps, but total_steps={cfg.total_steps} and warmup_steps={cfg.warmup_steps} "
            f"(in a run config, total_steps 0 is filled in by ExperimentConfig.run_optim)"
        )
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


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformationExtraArgs:
    """Global-norm clipping, then AdamW; a step whose gradient holds a NaN or an inf is skipped.

    The same optimizer as ``optax.apply_if_finite(optax.chain(optax.clip_by_global_norm(clip),
    optax.adamw(...)), max_consecutive_nonfinite)``: the same updates, the same counters and the same
    state (``optax.ApplyIfFiniteState`` around the chain's state), so checkpoints of either restore
    into the other. A skipped step returns zero updates and leaves the moments and both step counts
    (Adam's bias correction, the learning-rate schedule) as they were; after more than
    ``max_consecutive_nonfinite`` skips in a row the step is taken anyway, as ``apply_if_finite`` does.

    Why not ``apply_if_finite`` itself: its ``lax.cond`` gives back either the stepped or the old
    state, and XLA keeps the cond's result in buffers of its own, so the update holds a second copy of
    the parameter-sized updates (the Trainer's update held 4.77 GB of temporaries at Qwen3-0.6B in
    float32, 2.38 GB without the skip). Here every step runs Adam's moment update, each state leaf is
    chosen with ``jnp.where`` (fused into the moment update, written into the donated state buffers),
    and the updates are then computed from the *chosen* moments: 2.38 GB, as without the skip.
    Computing them from the stepped moments and selecting afterwards (a generic ``where`` around any
    inner transformation) is not lean: then both the kept state and the updates read the old moments,
    and XLA copies every moment buffer before overwriting it in place (6.53 GB).
    """
    clip = optax.clip_by_global_norm(cfg.grad_clip)
    adam = optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    decay = optax.add_decayed_weights(cfg.weight_decay)
    rate = optax.scale_by_learning_rate(make_schedule(cfg))
    # optax.adamw is exactly chain(scale_by_adam, add_decayed_weights, scale_by_learning_rate): this
    # chain's init gives the state layout a checkpoint of apply_if_finite(chain(clip, adamw)) has.
    layout = optax.chain(clip, optax.chain(adam, decay, rate))
    max_skips = cfg.max_consecutive_nonfinite

    def init(params):
        return optax.ApplyIfFiniteState(
            notfinite_count=jnp.zeros([], jnp.int32),
            last_finite=jnp.array(True, jnp.bool_),
            total_notfinite=jnp.zeros([], jnp.int32),
            inner_state=layout.init(params),
        )

    def update(grads, state, params=None, *, grad_scale=None, **extra_args):
        """``grad_scale`` (a positive scalar, optional): the step is taken on ``grads * grad_scale``. The
        finiteness check and the clipping norm read the unscaled leaves and scale the scalars, so the scaled
        gradient is never held in memory: only elementwise consumers (the moments) read it, each fusing the
        product. (``grads / count`` handed in instead is a parameter-sized temporary on CPU, where XLA's
        reductions do not fuse their producers: 5 GB at one Qwen3-30B-A3B layer in float32.)"""
        del extra_args
        isfinite = all_finite(grads)
        notfinite_count = jnp.where(isfinite, jnp.zeros([], jnp.int32), optax.safe_increment(state.notfinite_count))
        take = jnp.logical_or(isfinite, notfinite_count > max_skips)

        def keep(stepped, old):
            return jax.tree.map(lambda n, o: jnp.where(take, n, o), stepped, old)

        clip_state, (adam_state, decay_state, rate_state) = state.inner_state
        if grad_scale is None:
            updates, clip_state = clip.update(grads, clip_state)
        else:
            updates = _clip_scaled(grads, grad_scale, cfg.grad_clip)
        # Adam's own updates are left unused (and never computed): they are recomputed from the kept state.
        _, stepped = adam.update(updates, adam_state)
        adam_state = keep(stepped, adam_state)
        updates = _adam_direction(adam_state, cfg.b1, cfg.b2, cfg.eps)
        updates, decay_state = decay.update(updates, decay_state, params)
        updates, stepped = rate.update(updates, rate_state)
        rate_state = keep(stepped, rate_state)
        # A skipped step's updates are zeros shaped like the gradient, as apply_if_finite's.
        updates = jax.tree.map(lambda u, g: jnp.where(take, u, jnp.zeros_like(g)), updates, grads)
        return updates, optax.ApplyIfFiniteState(
            notfinite_count=notfinite_count,
            last_finite=isfinite,
            total_notfinite=jnp.where(isfinite, state.total_notfinite, optax.safe_increment(state.total_notfinite)),
            inner_state=(clip_state, (adam_state, decay_state, rate_state)),
        )

    update.takes_grad_scale = True  # the Trainer hands this optimizer a scale, not a divided gradient
    return optax.GradientTransformationExtraArgs(init=init, update=update)


def scaled_norm(grads, grad_scale) -> jax.Array:
    """The global norm of ``grads * grad_scale``, reduced over the unscaled leaves."""
    return optax.tree.norm(grads) * grad_scale


def _clip_scaled(grads, grad_scale, max_norm: float):
    """``optax.clip_by_global_norm(max_norm)`` applied to ``grads * grad_scale``: ``t`` below the threshold,
    ``t / norm * max_norm`` above it, folded into one scalar factor per step. One product per element is
    what XLA recomputes inside each consumer (both moments) rather than holding a clipped copy, which
    optax's per-element divide after the product would be (rounding differs from optax's by an ulp)."""
    g_norm = scaled_norm(grads, grad_scale)
    factor = jnp.where(g_norm < max_norm, grad_scale, grad_scale / g_norm * max_norm)
    return jax.tree.map(lambda g: g * factor.astype(g.dtype), grads)


def _adam_direction(state: optax.ScaleByAdamState, b1: float, b2: float, eps: float):
    """Adam's update from moments and step count already advanced: ``optax.scale_by_adam``'s own
    expression (bias-corrected moments, ``m / (sqrt(v + eps_root) + eps)`` with its default eps_root 0),
    so a taken step is the same to the bit. On a skipped step the kept count may be 0 and the result
    NaN; the caller replaces it with zeros."""
    mu_hat = optax.tree.bias_correction(state.mu, b1, state.count)
    nu_hat = optax.tree.bias_correction(state.nu, b2, state.count)
    return jax.tree.map(lambda m, v: m / (jnp.sqrt(v + 0.0) + eps), mu_hat, nu_hat)


def all_finite(tree) -> jax.Array:
    """Whether every element of every leaf is finite (a scalar bool), as ``apply_if_finite`` checks it.

    Read as the largest magnitude being finite: an inf is the largest, and XLA's max propagates NaN.
    ``all(isfinite(g))`` says the same, but XLA keeps its boolean mask in memory, one byte per
    parameter (0.6 GB at Qwen3-0.6B); the max reduces as it reads."""
    peaks = [jnp.max(jnp.abs(g)) for g in jax.tree.leaves(tree) if g.size]
    return jnp.isfinite(jnp.max(jnp.stack(peaks))) if peaks else jnp.array(True)
