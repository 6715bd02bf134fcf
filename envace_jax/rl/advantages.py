"""Role-wise GRPO advantages built on segment ops.

Every training row (one generation of one role) carries a scalar score, the id of the prompt group it
belongs to (the reference's ``uid``, shared by the n rollouts of a prompt), its role id (ACT or
REHEARSE) and optionally its episode id. The baseline of a row is computed from the rows that share
its ``(group, role)`` key, so each prompt has one baseline per role (reference spec section 5.2).

Rows may come in any order, a group may miss some of its rollouts, and a key may hold one row only;
nothing here assumes contiguous or complete groups. Keys are densified with a sort, so group ids can
be arbitrary (non-negative or negative) integers, and everything runs under ``jax.jit``.

Baselines (``baseline=``):

* ``"row_mean"`` (the reference): mean score over the rows of the key. A key with one row gets
  baseline 0 and std 1, so a lone row's advantage is its raw score.
* ``"trajectory_mean"``: every episode counts once per role. Rows of the same (episode, role) are
  averaged first, then those episode means are averaged per key. A key with one episode gets
  baseline 0 and std 1. The std is taken over the episode means. Needs ``episode_ids``.
* ``"rloo"``: leave-one-out mean over the other rows of the key; a lone row gets baseline 0.
  The std (if asked for) is the plain std of the key's rows.
* ``"none"``: baseline 0 (the std, if asked for, is still the key's std).

With ``normalize_std=True``: ``A = (s - baseline) / (sigma + std_eps)`` where sigma uses
``std_ddof`` (1 = unbiased, the reference's ``torch.std``). Keys with a single unit, or with
``units <= std_ddof``, use sigma = 1. The reference runs with ``normalize_std=False``.

``valid`` (bool ``[B]``, default all True) leaves rows out: an invalid row adds nothing to its key's
mean, std, unit count or leave-one-out sums, and its advantage is 0. The RL step marks the rows of
episodes that lost their judge invalid (``rl.mask_judge_failures``), so an outage does not pull down
the baseline of the episodes that were judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from envace_jax.config import BASELINES  # the knob's choices are listed with the knob


def _dense_ids(*keys: jax.Array) -> jax.Array:
    """Maps rows with equal key tuples to the same id in ``[0, distinct)``; keys int ``[B]`` -> int32 ``[B]``."""
    # lexsort's last key is the primary one; any consistent order works, we only need equal tuples adjacent.
    order = jnp.lexsort(tuple(keys))
    changed = jnp.zeros(order.shape[0] - 1, bool)
    for k in keys:
        ks = k[order]
        changed = changed | (ks[1:] != ks[:-1])
    dense_sorted = jnp.cumsum(jnp.concatenate([jnp.ones(1, jnp.int32), changed.astype(jnp.int32)])) - 1
    return jnp.zeros_like(dense_sorted).at[order].set(dense_sorted)


@jax.jit
def _num_keys(group_ids: jax.Array, role_ids: jax.Array) -> jax.Array:
    """Number of distinct (group, role) keys; int ``[B]`` x2 -> int32 scalar."""
    return jnp.max(_dense_ids(group_ids, role_ids)) + 1


def _unit_stats(values, unit_valid, unit_seg, num_segments: int, ddof: int):
    """Mean, std and unit count per segment from per-unit values.

    values, unit_valid (bool), unit_seg (int): ``[U]``. Returns float32 ``[S]`` mean, ``[S]`` std, ``[S]`` count.
    Invalid units are ignored. std is NaN-free: segments with ``count <= ddof`` get std 0 here
    (callers substitute 1 for them).
    """
    w = unit_valid.astype(jnp.float32)
    seg = jnp.where(unit_valid, unit_seg, -1)  # -1 is dropped by segment_sum
    n = jax.ops.segment_sum(w, seg, num_segments=num_segments)
    total = jax.ops.segment_sum(values * w, seg, num_segments=num_segments)
    mean = total / jnp.maximum(n, 1.0)
    dev = jnp.where(unit_valid, values - mean[jnp.clip(unit_seg, 0, num_segments - 1)], 0.0)
    ss = jax.ops.segment_sum(dev * dev, seg, num_segments=num_segments)
    denom = n - ddof
    std = jnp.sqrt(jnp.where(denom > 0, ss / jnp.where(denom > 0, denom, 1.0), 0.0))
    return mean, std, n


@partial(jax.jit, static_argnames=("baseline", "normalize_std", "num_segments", "std_ddof", "std_eps"))
def _advantages_core(
    scores,
    group_ids,
    role_ids,
    episode_ids,
    valid,
    *,
    baseline: str,
    normalize_std: bool,
    num_segments: int,
    std_ddof: int,
    std_eps: float,
):
    """scores float ``[B]``, group/role/episode ids int ``[B]``, valid bool ``[B]`` -> float32 advantages ``[B]``.

    Rows whose (group, role) key does not fit in ``num_segments`` segments get NaN; invalid rows get 0.
    """
    s = scores.astype(jnp.float32)
    S = num_segments
    gr = _dense_ids(group_ids, role_ids)  # [B]
    fits = gr < S
    gr_c = jnp.clip(gr, 0, S - 1)

    if baseline == "trajectory_mean":
        # Units are (episode, role) pairs inside the key; the key is part of the unit id so an episode id
        # reused across groups cannot merge two groups.
        B = s.shape[0]
        unit = _dense_ids(group_ids, role_ids, episode_ids)  # [B], < B
        w = valid.astype(jnp.float32)
        u_n = jax.ops.segment_sum(w, unit, num_segments=B)
        u_mean = jax.ops.segment_sum(s * w, unit, num_segments=B) / jnp.maximum(u_n, 1.0)
        u_valid = u_n > 0
        # All rows of a unit share one key; segment_max picks it (empty units are masked by u_valid).
        u_seg = jax.ops.segment_max(gr, unit, num_segments=B)
        mean, std, n = _unit_stats(u_mean, u_valid & (u_seg < S), u_seg, S, std_ddof)
    else:
        mean, std, n = _unit_stats(s, valid & fits, gr_c, S, std_ddof)

    n_row = n[gr_c]
    multi = n_row > 1
    if baseline in ("row_mean", "trajectory_mean"):
        base = jnp.where(multi, mean[gr_c], 0.0)
    elif baseline == "rloo":
        total = mean[gr_c] * n_row
        base = jnp.where(multi, (total - s) / jnp.where(multi, n_row - 1.0, 1.0), 0.0)
    else:  # "none"
        base = jnp.zeros_like(s)
    adv = s - base
    if normalize_std:
        sigma = jnp.where(multi & (n_row > std_ddof), std[gr_c], 1.0)
        adv = adv / (sigma + std_eps)
    return jnp.where(fits, jnp.where(valid, adv, 0.0), jnp.nan)


def _check_ids(name: str, x, batch: int) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 1 or x.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}] like scores, got {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {x.dtype}")
    return x


def role_wise_advantages(
    scores,
    group_ids,
    role_ids,
    baseline: str = "row_mean",
    normalize_std: bool = False,
    *,
    episode_ids=None,
    valid=None,
    num_segments: int | None = None,
    std_ddof: int = 1,
    std_eps: float = 1e-6,
) -> jax.Array:
    """Role-wise GRPO advantages, one per row.

    Args:
      scores: float ``[B]`` row scores (the episode score, minus any per-row penalty).
      group_ids: int ``[B]`` prompt group of each row (shared by the n rollouts of a prompt).
      role_ids: int ``[B]`` role of each row; the baseline key is ``(group_id, role_id)``.
      baseline: one of ``"row_mean"`` (reference), ``"trajectory_mean"``, ``"rloo"``, ``"none"``.
      normalize_std: divide by the key's std plus ``std_eps`` (reference: off).
      episode_ids: int ``[B]``, required for ``"trajectory_mean"``.
      valid: bool ``[B]`` rows that take part (default all); the others are left out of every
        statistic and get advantage 0.
      num_segments: static upper bound on the number of distinct (group, role) keys; default ``B``
        (always enough). A smaller bound saves memory; if the real count exceeds it, a ValueError is
        raised on concrete inputs, and the rows that do not fit get NaN under ``jax.jit``.
      std_ddof: delta degrees of freedom for the std (1 = unbiased, as the reference).
      std_eps: added to the std before dividing.

    Returns:
      float32 ``[B]`` advantages. Works on concrete arrays and inside ``jax.jit`` (all keyword
      options are static).
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is not one of {BASELINES}")
    scores = jnp.asarray(scores)
    if scores.ndim != 1:
        raise ValueError(f"scores must have shape [B], got {tuple(scores.shape)}")
    B = scores.shape[0]
    if B == 0:
        raise ValueError("scores is empty: role_wise_advantages needs at least one row")
    group_ids = _check_ids("group_ids", group_ids, B)
    role_ids = _check_ids("role_ids", role_ids, B)
    if baseline == "trajectory_mean":
        if episode_ids is None:
            raise ValueError("baseline='trajectory_mean' needs episode_ids")
        episode_ids = _check_ids("episode_ids", episode_ids, B)
    else:
        episode_ids = jnp.zeros((B,), jnp.int32)
    if valid is None:
        valid = jnp.ones((B,), bool)
    else:
        valid = jnp.asarray(valid)
        if valid.shape != (B,) or valid.dtype != jnp.bool_:
            raise ValueError(
                f"valid must be a bool array of shape [{B}] like scores, got {valid.dtype} {tuple(valid.shape)}"
            )
    if int(std_ddof) != std_ddof or std_ddof < 0:
        raise ValueError(f"std_ddof must be a non-negative integer, got {std_ddof!r}")
    if not std_eps >= 0:
        raise ValueError(f"std_eps must be >= 0, got {std_eps!r}")
    if num_segments is None:
        num_segments = B
    if int(num_segments) != num_segments or num_segments < 1:
        raise ValueError(f"num_segments must be a positive integer, got {num_segments!r}")
    traced = any(isinstance(x, jax.core.Tracer) for x in (group_ids, role_ids))
    if not traced:
        distinct = int(_num_keys(group_ids, role_ids))
        if distinct > num_segments:
            raise ValueError(
                f"num_segments={num_segments} is smaller than the {distinct} distinct "
                f"(group_id, role_id) keys in the batch"
            )
    return _advantages_core(
        scores,
        group_ids,
        role_ids,
        episode_ids,
        valid,
        baseline=baseline,
        normalize_std=bool(normalize_std),
        num_segments=int(num_segments),
        std_ddof=int(std_ddof),
        std_eps=float(std_eps),
    )


def advantage_stats(
    advantages, scores, group_ids, role_ids, *, role_names: Mapping[int, str] | None = None, zero_tol: float = 0.0
) -> dict[str, float]:
    """Host-side per-role metrics of a batch's advantages.

    For every role present: ``adv/{role}/mean``, ``std``, ``min``, ``max``, ``nonzero_frac`` (rows with
    ``|A| > zero_tol``: the rows that carry a learning signal), ``rows``, ``groups`` (distinct
    (group, role) keys), ``singleton_group_frac`` (keys with one row) and ``zero_std_group_frac``
    (keys with two or more rows whose scores are all equal, so GRPO gives them no signal).
    Role names default to ``role{id}``.
    """
    adv = np.asarray(advantages, np.float64)
    sc = np.asarray(scores, np.float64)
    g = np.asarray(group_ids)
    r = np.asarray(role_ids)
    if not (adv.shape == sc.shape == g.shape == r.shape) or adv.ndim != 1:
        raise ValueError(
            f"advantage_stats needs equal [B] shapes, got advantages {adv.shape}, scores {sc.shape}, "
            f"group_ids {g.shape}, role_ids {r.shape}"
        )
    out: dict[str, float] = {}
    for role in np.unique(r):
        name = (role_names or {}).get(int(role), f"role{int(role)}")
        m = r == role
        a = adv[m]
        keys: dict[int, list[float]] = {}
        for gid, s in zip(g[m].tolist(), sc[m].tolist()):
            keys.setdefault(gid, []).append(s)
        sizes = np.array([len(v) for v in keys.values()])
        zero_std = sum(1 for v in keys.values() if len(v) > 1 and max(v) == min(v))
        p = f"adv/{name}/"
        out[p + "mean"] = float(a.mean())
        out[p + "std"] = float(a.std())
        out[p + "min"] = float(a.min())
        out[p + "max"] = float(a.max())
        out[p + "nonzero_frac"] = float(np.mean(np.abs(a) > zero_tol))
        out[p + "rows"] = float(a.size)
        out[p + "groups"] = float(len(keys))
        out[p + "singleton_group_frac"] = float(np.mean(sizes == 1))
        out[p + "zero_std_group_frac"] = float(zero_std / len(keys))
    return out
