"""Token log-probs, entropy and the clipped policy-gradient loss.

Log-probs are taken at the sampling temperature (``log_softmax(logits / T)``), in float32.

The loss follows the reference (spec section 5.3), per token::

    r   = exp(clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp))
    pg1 = -A * r,  pg2 = -A * clip(r, 1 - clip_low, 1 + clip_high),  L = max(pg1, pg2)
    if dual_clip is not None and A < 0:  L = min(L, -A * dual_clip)

plus ``kl_coef * KL`` and ``- entropy_coef * entropy``, then aggregated over tokens.

Off-policy correction (decoupled PPO; ``behaviour_weights``): when the rows were sampled by an older policy mu
(an asynchronous run, ``rl.max_staleness >= 1``), ``old_logp`` is the proximal policy's (the weights at the
update) and ``L`` above is multiplied by ``w = sg(min(pi_prox / mu, cap))`` per token (``"token"``) or per row
(``"sequence"``: the ratio of the row's probabilities). The clip keeps each update near pi_prox; ``w`` turns
the expectation under mu into one under pi_prox, truncated so a token mu found unlikely cannot dominate.

Aggregation modes (``agg``), with ``w`` the per-token loss weights (0 on prompt, environment and padding):

* ``"token_mean"``: ``sum_{i,t} w x / sum_{i,t} w``; every token weighs the same.
* ``"seq_mean_token_mean"``: mean over rows of the row's weighted token mean; every row weighs the same.
  This is what the reference effectively optimises: it sets ``loss_agg_mode=token-mean`` but with a
  micro-batch of one row, and averaging the per-micro-batch losses makes it a per-row mean.
* ``"seq_mean_token_sum"``: mean over rows of the row's weighted token sum.
* ``"seq_mean_token_sum_norm"`` (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783): mean over rows of the row's
  weighted token sum divided by a constant ``agg_norm`` (``loss.agg_norm``, e.g. the longest generation in
  tokens), i.e. ``sum_{i,t} w x / (rows x agg_norm)``: a token weighs the same in a short row as in a long one,
  and the normaliser does not depend on the lengths the policy chose.

Rows whose weights are all zero are left out of the row count.

Every quantity is returned as a ``(sum, count)`` pair. Summing sums and counts over micro-batches and
dividing once gives exactly the value of the whole batch; likewise the gradient of the big-batch loss
is ``(sum of grad(sum_k)) / (sum of count_k)`` because counts do not depend on the parameters.

``role_balanced=True`` gives each role the same total weight: a unit (a row, or a token for
``token_mean``) of role r weighs ``1 / n_r`` where ``n_r`` is the number of units of role r in the
whole optimizer batch, and the count is the sum of those weights (= the number of roles present).
With both roles present that is weight ``1 / (2 n_r)`` per unit. Pass ``role_counts`` (from
``role_unit_counts`` on the whole batch) when micro-batching so that all micro-batches use the same
``n_r``; without it the counts of the current call are used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from envace_jax.config import AGG_MODES, KL_TYPES  # the knobs' choices are listed with the knobs
from envace_jax.models.qwen3 import as_dtype, rms_norm
from envace_jax.rl.ratio_levels import importance_ratio  # checks ratio_level

Pair = tuple[jax.Array, jax.Array]


def check_temperature(temperature) -> None:
    """Log-probs divide the logits by the temperature: refuse 0 (or less) wherever the value is known
    on the host (a Python number or a host array; inside jit it is traced and the batch was checked
    when it was built)."""
    if isinstance(temperature, (int, float)):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
    elif isinstance(temperature, np.ndarray) and not np.all(temperature > 0):
        raise ValueError(f"temperature must be > 0 in every row, got {np.asarray(temperature).ravel()[:8]!r}")


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """``log_softmax(logits / T)`` at the target ids.

    logits ``[B, T, V]`` (any float dtype), targets int ``[B, T]`` -> float32 ``[B, T]``. Position t of
    logits scores targets[:, t]; shift ids before calling for next-token prediction.
    """
    check_temperature(temperature)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on [B, T]")
    z = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse


def token_entropy(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """Entropy of ``softmax(logits / T)``: logits ``[B, T, V]`` -> float32 ``[B, T]``."""
    check_temperature(temperature)
    z = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def chunked_token_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    *,
    chunk_size: int = 512,
    head_layout: str = "dv",
    compute_dtype=None,
    with_entropy: bool = False,
):
    """Token log-probs from final hidden states without materialising ``[B, T, V]`` logits.

    The vocabulary projection runs over sequence chunks of ``chunk_size`` under ``jax.checkpoint``, so
    forward and backward each hold one ``[B, chunk, V]`` block at a time.

    Args:
      hidden: ``[B, T, D]`` final hidden states, after the final norm.
      head: ``[D, V]`` (``head_layout="dv"``, an untied lm_head) or ``[V, D]`` (``"vd"``, tied embeddings).
      targets: int ``[B, T]``.
      compute_dtype: dtype of the matmul inputs (default: ``hidden.dtype``); accumulation is float32.

    Returns:
      float32 ``[B, T]`` log-probs, or ``(logp, entropy)`` both ``[B, T]`` with ``with_entropy``.
    """
    check_temperature(temperature)
    if head_layout not in ("dv", "vd"):
        raise ValueError(f"head_layout must be 'dv' or 'vd', got {head_layout!r}")
    B, T, D = hidden.shape
    if targets.shape != (B, T):
        raise ValueError(f"targets {tuple(targets.shape)} must be [B, T] = {(B, T)} like hidden")
    if head.ndim != 2 or head.shape[0 if head_layout == "dv" else 1] != D:
        raise ValueError(f"head {tuple(head.shape)} does not match hidden size {D} with layout {head_layout!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    dt = hidden.dtype if compute_dtype is None else as_dtype(compute_dtype)
    c = min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, D).swapaxes(0, 1)
    y = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad))).reshape(B, n, c).swapaxes(0, 1)
    spec = "bcd,dv->bcv" if head_layout == "dv" else "bcd,vd->bcv"

    @jax.checkpoint
    def one(w, hy):
        hc, yc = hy
        z = jnp.einsum(spec, hc.astype(dt), w.astype(dt), preferred_element_type=jnp.float32) / temperature
        lse = jax.nn.logsumexp(z, axis=-1)
        lp = jnp.take_along_axis(z, yc[..., None], axis=-1)[..., 0] - lse
        if not with_entropy:
            return lp, jnp.zeros_like(lp)
        p = jnp.exp(z - lse[..., None])
        return lp, lse - jnp.sum(p * z, axis=-1)

    lp, ent = jax.lax.map(lambda hy: one(head, hy), (h, y))
    lp = lp.swapaxes(0, 1).reshape(B, n * c)[:, :T]
    if not with_entropy:
        return lp
    return lp, ent.swapaxes(0, 1).reshape(B, n * c)[:, :T]


def model_token_logprobs(
    model,
    input_ids: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    *,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    chunk_size: int | None = None,
    with_entropy: bool = False,
):
    """Log-probs of ``targets`` under a ``Qwen3`` model at the sampling temperature.

    input_ids, targets int ``[B, T]`` (targets[:, t] is the token after input_ids[:, t]) -> float32
    ``[B, T]`` (and entropy ``[B, T]`` with ``with_entropy``). With ``chunk_size`` the vocabulary
    projection is chunked (see ``chunked_token_logprobs``); otherwise full logits are formed.
    """
    if chunk_size is None:
        logits = model(input_ids, positions, segment_ids)
        lp = token_logprobs(logits, targets, temperature)
        return (lp, token_entropy(logits, temperature)) if with_entropy else lp
    cfg = model.config
    # logits_at=0 keeps the model from projecting every position; we only want its hidden states.
    _, hidden = model(
        input_ids,
        positions,
        segment_ids,
        logits_at=jnp.zeros((input_ids.shape[0],), jnp.int32),
        return_hidden_states=True,
    )
    h = rms_norm(hidden[-1].astype(as_dtype(cfg.dtype)), model.norm.scale[...], cfg.rms_norm_eps)
    if cfg.tie_word_embeddings:
        head, layout = model.embed.embedding[...], "vd"
    else:
        head, layout = model.lm_head[...], "dv"
    return chunked_token_logprobs(
        h,
        head,
        targets,
        temperature,
        chunk_size=chunk_size,
        head_layout=layout,
        compute_dtype=cfg.dtype,
        with_entropy=with_entropy,
    )


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kl_type: str = "k3") -> jax.Array:
    """Per-token KL estimate of the policy from the reference, float32 ``[B, T]``.

    ``k1 = logp - ref`` (unbiased, can be negative); ``k2 = 0.5 (logp - ref)^2``;
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` (the reference's ``low_var_kl``), with the log-ratio
    clamped to [-20, 20] before the exp and the result clamped to [-10, 10] as the reference does.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type={kl_type!r} is not one of {KL_TYPES}")
    d = ref_logp.astype(jnp.float32) - logp.astype(jnp.float32)
    if kl_type == "k1":
        return -d
    if kl_type == "k2":
        return 0.5 * d * d
    d = jnp.clip(d, -20.0, 20.0)
    return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)


def role_unit_counts(loss_weights: jax.Array, role_ids: jax.Array, agg: str, num_roles: int = 2) -> jax.Array:
    """Units per role for role-balanced weighting: rows with any weight (or total token weight for
    ``token_mean``). loss_weights ``[B, T]``, role_ids int ``[B]`` -> float32 ``[num_roles]``."""
    if agg not in AGG_MODES:
        raise ValueError(f"agg={agg!r} is not one of {AGG_MODES}")
    w = loss_weights.astype(jnp.float32)
    per_row = w.sum(-1) if agg == "token_mean" else (w.sum(-1) > 0).astype(jnp.float32)
    return jax.ops.segment_sum(per_row, role_ids.astype(jnp.int32), num_segments=num_roles)


def _aggregate(x: jax.Array, w: jax.Array, agg: str, unit_scale: jax.Array, agg_norm: float = 0.0) -> Pair:
    """x, w ``[B, T]``; unit_scale ``[B]`` (role-balancing factor per row, 1 otherwise) -> (sum, count).
    ``agg_norm``: the constant of ``seq_mean_token_sum_norm``."""
    if agg == "token_mean":
        tw = w * unit_scale[:, None]
        return jnp.sum(jnp.where(tw > 0, x * tw, 0.0)), jnp.sum(tw)
    row_w = w.sum(-1)
    has = row_w > 0
    row_sum = jnp.sum(jnp.where(w > 0, x * w, 0.0), axis=-1)
    if agg == "seq_mean_token_mean":
        row_val = row_sum / jnp.where(has, row_w, 1.0)
    elif agg == "seq_mean_token_sum_norm":
        row_val = row_sum / agg_norm
    else:
        row_val = row_sum
    rs = jnp.where(has, unit_scale, 0.0)
    return jnp.sum(jnp.where(has, row_val * rs, 0.0)), jnp.sum(rs)


def _unit_scale(w: jax.Array, agg: str, role_ids, role_balanced: bool, role_counts, num_roles: int) -> jax.Array:
    """Per-row factor of the role-balanced weighting (1 / units of the row's role), or ones."""
    if not role_balanced:
        return jnp.ones((w.shape[0],), jnp.float32)
    rid = role_ids.astype(jnp.int32)
    counts = role_unit_counts(w, rid, agg, num_roles) if role_counts is None else role_counts
    n_r = jnp.asarray(counts, jnp.float32)[rid]
    return jnp.where(n_r > 0, 1.0 / jnp.where(n_r > 0, n_r, 1.0), 0.0)


def loss_count(
    loss_weights, agg: str = "seq_mean_token_mean", role_ids=None, role_balanced: bool = False, num_roles: int = 2
) -> tuple[float, np.ndarray]:
    """On the host (numpy, no device program per shape): the count ``policy_loss`` divides these rows'
    loss by (token weight for ``token_mean``, rows with any weight otherwise; the number of roles
    present when role-balanced) and the units per role (``role_unit_counts``). What a batch's gradient
    is normalised by when only some of its rows go through the model (``rl.skip_zero_advantage_rows``)."""
    if agg not in AGG_MODES:
        raise ValueError(f"agg={agg!r} is not one of {AGG_MODES}")
    if role_balanced and role_ids is None:
        raise ValueError("role_balanced=True needs role_ids")
    w = np.asarray(loss_weights, np.float64)
    per_row = w.sum(-1) if agg == "token_mean" else (w.sum(-1) > 0).astype(np.float64)
    rid = np.zeros((w.shape[0],), np.int64) if role_ids is None else np.asarray(role_ids, np.int64)
    per_role = np.bincount(rid, weights=per_row, minlength=num_roles)[:num_roles]
    count = float((per_role > 0).sum()) if role_balanced else float(per_row.sum())
    return count, per_role.astype(np.float32)


def _token_mean(x: jax.Array, w: jax.Array) -> Pair:
    return jnp.sum(jnp.where(w > 0, x * w, 0.0)), jnp.sum(w)


BEHAVIOUR_MODES = ("token", "sequence")


def behaviour_weights(
    prox_logp: jax.Array,
    behaviour_logp: jax.Array,
    loss_weights: jax.Array,
    mode: str = "token",
    cap: float = 2.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, jax.Array]:
    """Truncated importance weights of the proximal policy against the behaviour policy (decoupled PPO).

    prox_logp, behaviour_logp, loss_weights float ``[B, T]`` -> (weights ``[B, T]``, truncated ``[B, T]`` bool).
    ``"token"``: ``w_t = min(exp(prox_t - mu_t), cap)``; ``"sequence"``: every trained token of a row gets
    ``min(exp(sum_t (prox_t - mu_t)), cap)`` over the row's trained tokens. Log-ratios are clamped to
    ``log_ratio_clamp`` before the exp (as the PPO ratio is). Constants: no gradient flows through them.
    Positions with zero loss weight get weight 1 and are never truncated.
    """
    if mode not in BEHAVIOUR_MODES:
        raise ValueError(f"behaviour weight mode {mode!r} is not one of {BEHAVIOUR_MODES}")
    if not cap >= 1:
        raise ValueError(f"behaviour weight cap must be >= 1, got {cap}")
    on = loss_weights > 0
    d = jnp.where(on, prox_logp.astype(jnp.float32) - behaviour_logp.astype(jnp.float32), 0.0)
    if mode == "sequence":
        d = jnp.broadcast_to(jnp.sum(d, axis=-1, keepdims=True), d.shape)
    raw = jnp.exp(jnp.clip(d, -log_ratio_clamp, log_ratio_clamp))
    truncated = on & (raw > cap)
    w = jnp.where(on, jnp.minimum(raw, cap), 1.0)
    return jax.lax.stop_gradient(w), truncated


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    loss_weights: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    log_ratio_clamp: float = 20.0,
    ref_logp: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
    agg: str = "seq_mean_token_mean",
    role_ids: jax.Array | None = None,
    role_balanced: bool = False,
    role_counts: jax.Array | None = None,
    num_roles: int = 2,
    behaviour_logp: jax.Array | None = None,
    behaviour_mode: str = "token",
    behaviour_cap: float = 2.0,
    ratio_level: str = "token",
    agg_norm: float = 0.0,
) -> dict[str, Pair]:
    """Clipped policy-gradient loss and metrics as ``(sum, count)`` pairs.

    Args:
      logp: float ``[B, T]`` log-probs of the current policy (differentiated).
      old_logp: float ``[B, T]`` behaviour-policy log-probs (treated as constants).
      advantages: float ``[B]`` (broadcast over tokens) or ``[B, T]``.
      loss_weights: float ``[B, T]``; 0 on prompt, environment and padding tokens.
      ref_logp: float ``[B, T]`` reference-policy log-probs; with it the KL metric is reported and
        ``kl_coef * KL`` is added to the loss.
      entropy: float ``[B, T]`` per-token entropy; with it the entropy metric is reported and
        ``- entropy_coef * entropy`` is added to the loss.
      role_ids: int ``[B]``; needed for ``role_balanced``.
      role_counts: float ``[num_roles]`` units per role in the whole optimizer batch (``role_unit_counts``).
      behaviour_logp: float ``[B, T]`` log-probs of the policy that sampled the rows (mu); with it
        ``old_logp`` is the proximal policy's and each token's policy-gradient term is weighted by
        ``behaviour_weights(old_logp, behaviour_logp, ..., behaviour_mode, behaviour_cap)``; the metrics gain
        ``"is_weight"``, ``"is_weight_sq"`` (for the spread), ``"is_truncated"`` (share of tokens whose weight
        was capped) and ``"is_log_ratio_abs"`` (mean ``|log pi_prox - log mu|``), weighted token means.
      ratio_level: ``"token"`` (PPO's ratio per token), ``"sequence"`` (GSPO: the row's geometric-mean ratio,
        clipped as one) or ``"sequence_token"`` (GSPO-token); ``rl.ratio_levels``.
      agg_norm: the constant divisor of ``agg="seq_mean_token_sum_norm"`` (Dr. GRPO), > 0; unused otherwise.

    Returns:
      ``{"loss", "pg_loss", "kl", "entropy"}`` aggregated with ``agg`` (and role weights), so
      ``loss = pg_loss + kl_coef * kl - entropy_coef * entropy`` with one shared count (kl and entropy
      only when given); ``"pg_clipfrac"`` (tokens where the clip binds), ``"pg_clipfrac_lower"``
      (tokens where the dual clip binds), ``"ratio"`` and ``"ppo_kl"`` (mean ``old_logp - logp``) as
      weighted token means. The loss to differentiate is ``out["loss"][0]``; divide by the total count.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"agg={agg!r} is not one of {AGG_MODES}")
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type={kl_type!r} is not one of {KL_TYPES}")
    if agg == "seq_mean_token_sum_norm" and not (isinstance(agg_norm, (int, float)) and agg_norm > 0):
        raise ValueError(f"agg='seq_mean_token_sum_norm' needs agg_norm > 0 (a length in tokens), got {agg_norm!r}")
    if logp.ndim != 2:
        raise ValueError(f"logp must be [B, T], got {tuple(logp.shape)}")
    for name, a in (
        ("old_logp", old_logp),
        ("loss_weights", loss_weights),
        ("ref_logp", ref_logp),
        ("entropy", entropy),
        ("behaviour_logp", behaviour_logp),
    ):
        if a is not None and a.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {tuple(logp.shape)} like logp")
    if advantages.shape not in ((logp.shape[0],), logp.shape):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}, expected [B]={logp.shape[0]} or {logp.shape}"
        )
    if isinstance(clip_low, (int, float)) and not 0 <= clip_low < 1:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if isinstance(clip_high, (int, float)) and not clip_high >= 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and isinstance(dual_clip, (int, float)) and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if role_balanced and role_ids is None:
        raise ValueError("role_balanced=True needs role_ids")
    if role_ids is not None and role_ids.shape != (logp.shape[0],):
        raise ValueError(f"role_ids has shape {tuple(role_ids.shape)}, expected [{logp.shape[0]}]")

    logp = logp.astype(jnp.float32)
    w = loss_weights.astype(jnp.float32)
    on = w > 0
    # Masked positions may hold junk (e.g. -inf sampler log-probs on padding); replacing the constants
    # there keeps every term finite so their gradient is exactly 0 rather than 0 * inf = NaN.
    old = jnp.where(on, jax.lax.stop_gradient(old_logp).astype(jnp.float32), jax.lax.stop_gradient(logp))
    adv = jax.lax.stop_gradient(advantages).astype(jnp.float32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    adv = jnp.where(on, jnp.broadcast_to(adv, logp.shape), 0.0)

    ratio = importance_ratio(logp, old, on, ratio_level, log_ratio_clamp)
    pg1 = -adv * ratio
    pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = jnp.maximum(pg1, pg2)
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        pg = jnp.where(adv < 0, jnp.minimum(clipped, pg3), clipped)
        lower = (adv < 0) & (clipped > pg3)
    else:
        pg = clipped
        lower = jnp.zeros_like(on)

    is_metrics: dict[str, Pair] = {}
    if behaviour_logp is not None:
        mu = jnp.where(on, jax.lax.stop_gradient(behaviour_logp).astype(jnp.float32), old)
        is_w, truncated = behaviour_weights(old, mu, w, behaviour_mode, behaviour_cap, log_ratio_clamp)
        pg = pg * is_w
        is_metrics = {
            "is_weight": _token_mean(is_w, w),
            "is_weight_sq": _token_mean(is_w * is_w, w),
            "is_truncated": _token_mean(truncated.astype(jnp.float32), w),
            "is_log_ratio_abs": _token_mean(jnp.abs(old - mu), w),
        }

    unit_scale = _unit_scale(w, agg, role_ids, role_balanced, role_counts, num_roles)
    total = pg
    agg_of = lambda x: _aggregate(x, w, agg, unit_scale, agg_norm)
    out: dict[str, Pair] = {"pg_loss": agg_of(pg)}
    if ref_logp is not None:
        ref = jnp.where(on, jax.lax.stop_gradient(ref_logp).astype(jnp.float32), jax.lax.stop_gradient(logp))
        kl = kl_penalty(logp, ref, kl_type)
        out["kl"] = agg_of(kl)
        total = total + kl_coef * kl
    elif kl_coef:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp")
    if entropy is not None:
        ent = jnp.where(on, entropy.astype(jnp.float32), 0.0)
        out["entropy"] = agg_of(ent)
        total = total - entropy_coef * ent
    elif entropy_coef:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy")
    out["loss"] = agg_of(total)
    sg = jax.lax.stop_gradient
    out["pg_clipfrac"] = _token_mean(sg((pg2 > pg1).astype(jnp.float32)), w)
    out["pg_clipfrac_lower"] = _token_mean(sg(lower.astype(jnp.float32)), w)
    out["ratio"] = _token_mean(sg(ratio), w)
    out["ppo_kl"] = _token_mean(sg(old - logp), w)
    out.update(is_metrics)
    return out


def add_pairs(a: Mapping[str, Pair], b: Mapping[str, Pair]) -> dict[str, Pair]:
    """Sums two ``(sum, count)`` dicts key by key (micro-batch accumulation); keys must match."""
    if set(a) != set(b):
        raise ValueError(f"cannot add metric dicts with different keys: {sorted(a)} vs {sorted(b)}")
    return {k: (a[k][0] + b[k][0], a[k][1] + b[k][1]) for k in a}


def reduce_pairs(pairs: Mapping[str, Pair] | Iterable[Mapping[str, Pair]]) -> dict[str, jax.Array]:
    """``sum / count`` per key (0 where the count is 0); accepts one dict or an iterable of dicts to add first."""
    if not isinstance(pairs, Mapping):
        items = list(pairs)
        if not items:
            raise ValueError("reduce_pairs got no metric dicts")
        acc = items[0]
        for p in items[1:]:
            acc = add_pairs(acc, p)
        pairs = acc
    return {k: jnp.where(c > 0, s / jnp.where(c > 0, c, 1.0), 0.0) for k, (s, c) in pairs.items()}
