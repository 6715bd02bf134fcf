"""The optimizer of a policy: AdamW with global-norm clipping, a learning-rate schedule, and a skip of
any step whose gradient is not finite (``OptimConfig`` in ``envace_jax.config`` holds the knobs)."""

from __future__ import annotations

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


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    # A non-finite gradient skips the step (parameters and moments unchanged) and is counted.
    return optax.apply_if_finite(tx, cfg.max_consecutive_nonfinite)
