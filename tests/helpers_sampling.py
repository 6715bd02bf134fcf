"""Helpers for the sampler tests: exact reference distributions and a chi-square bound."""

from __future__ import annotations

import math

import numpy as np


def reference_distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The intended sampling distribution, computed by a full sort (float64): temperature, then
    top-k, then top-p on the renormalised top-k distribution."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(p.shape, bool)
    k = len(p) if top_k <= 0 else min(top_k, len(p))
    top = order[:k]
    mass = p[top].sum()
    before = np.concatenate([[0.0], np.cumsum(p[top])[:-1]])
    kept = top[(before < top_p * mass) | (top_p >= 1.0)]
    keep[kept] = True
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def chi_square_z(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Wilson-Hilferty z-score of Pearson's chi-square statistic (bins with small expectation merged).

    z > 4 means the counts are very unlikely (p < 4e-5) under ``probs``.
    """
    n = counts.sum()
    exp = probs * n
    big = exp >= min_expected
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_b, exp_b = np.asarray(obs_b, float), np.asarray(exp_b, float)
    stat = float(((obs_b - exp_b) ** 2 / exp_b).sum())
    dof = max(len(obs_b) - 1, 1)
    return ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
