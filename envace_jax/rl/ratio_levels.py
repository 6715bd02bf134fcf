"""The importance ratio the clipped loss takes, per token (PPO, GRPO) or per sequence (GSPO).

``loss.ratio_level``:

* ``"token"``: ``r_t = exp(logp_t - old_t)``, each token clipped on its own (the reference's, PPO's).
* ``"sequence"`` (GSPO, Zheng et al. 2025, arXiv 2507.18071): one ratio per row, the geometric mean of its
  trained tokens' ratios, ``s_i = exp(mean_t (logp_t - old_t))``, broadcast to the row's tokens so the clip acts
  on the whole row at once; its gradient reaches every trained token through the mean.
* ``"sequence_token"`` (GSPO-token, same paper): ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))``: the value of
  ``s_i`` at every token, the gradient of each token's own log-prob. With one advantage per row it gives the
  same loss and gradient as ``"sequence"``; it differs when advantages vary along the row.

The paper clips the sequence ratio far tighter than a token ratio: ``loss.clip_low = 3e-4``, ``loss.clip_high =
4e-4`` (Tunix's Qwen3 example uses 3e-3 / 5e-3), with ``loss.agg = "seq_mean_token_mean"`` (its ``1/G sum_i``
over rows; the row's tokens all carry the same term) and no dual clip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envace_jax.config import RATIO_LEVELS  # the knob's choices are listed with the knob


def importance_ratio(logp: jax.Array, old: jax.Array, on: jax.Array, level: str, clamp: float) -> jax.Array:
    """The ratio ``[B, T]`` at ``level`` (see the module docstring).

    ``logp`` float32 ``[B, T]`` (differentiated), ``old`` float32 ``[B, T]`` (constants, finite everywhere),
    ``on`` bool ``[B, T]`` (the trained tokens: the sequence levels average over them). Log-ratios are clamped
    to ``+-clamp`` before the exp (per token, or the row's mean)."""
    if level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level={level!r} is not one of {RATIO_LEVELS}")
    if level == "token":
        return jnp.exp(jnp.clip(logp - old, -clamp, clamp))
    d = jnp.where(on, logp - old, 0.0)
    n = jnp.maximum(jnp.sum(on, axis=-1, keepdims=True).astype(jnp.float32), 1.0)
    seq_log_ratio = jnp.clip(jnp.sum(d, axis=-1, keepdims=True) / n, -clamp, clamp)  # [B, 1]
    if level == "sequence":
        return jnp.broadcast_to(jnp.exp(seq_log_ratio), logp.shape)
    sg = jax.lax.stop_gradient
    return sg(jnp.exp(seq_log_ratio)) * jnp.exp(logp - sg(logp))
