"""The off-policy correction (decoupled PPO): truncated importance weights of the proximal policy against the
behaviour policy, checked against hand-computed numbers, and the loss and gradient they give."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.config import RLSection
from envace_jax.rl.loss import behaviour_weights, policy_loss

jit_loss = jax.jit(policy_loss, static_argnames=("agg", "behaviour_mode", "behaviour_cap", "dual_clip"))


def test_token_weights_by_hand():
    prox = np.log(np.asarray([[0.5, 0.2, 0.9, 0.3]], np.float32))
    mu = np.log(np.asarray([[0.25, 0.4, 0.3, 0.3]], np.float32))
    w = np.asarray([[1, 1, 1, 0]], np.float32)  # the last position is a prompt token
    weights, truncated = behaviour_weights(jnp.asarray(prox), jnp.asarray(mu), jnp.asarray(w), "token", 2.0)
    # ratios 2.0, 0.5, 3.0 (capped at 2), and 1 where nothing is trained
    np.testing.assert_allclose(np.asarray(weights), [[2.0, 0.5, 2.0, 1.0]], rtol=1e-6)
    assert np.asarray(truncated).tolist() == [[False, False, True, False]]


def test_sequence_weights_by_hand():
    prox = np.log(np.asarray([[0.5, 0.2, 0.9], [0.5, 0.5, 0.5]], np.float32))
    mu = np.log(np.asarray([[0.25, 0.4, 0.9], [0.5, 0.25, 0.9]], np.float32))
    w = np.asarray([[1, 1, 1], [1, 1, 0]], np.float32)
    weights, truncated = behaviour_weights(jnp.asarray(prox), jnp.asarray(mu), jnp.asarray(w), "sequence", 2.0)
    # row 0: 2.0 * 0.5 * 1.0 = 1.0 on every trained token; row 1: 1.0 * 2.0 (the untrained third token is out)
    np.testing.assert_allclose(np.asarray(weights), [[1.0, 1.0, 1.0], [2.0, 2.0, 1.0]], rtol=1e-6)
    assert not np.asarray(truncated).any()
    capped, truncated = behaviour_weights(jnp.asarray(prox), jnp.asarray(mu), jnp.asarray(w), "sequence", 1.5)
    np.testing.assert_allclose(np.asarray(capped)[1], [1.5, 1.5, 1.0], rtol=1e-6)
    assert np.asarray(truncated).tolist() == [[False, False, False], [True, True, False]]


def test_bad_mode_and_cap_are_refused():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="not one of"):
        behaviour_weights(x, x, x + 1, "row", 2.0)
    with pytest.raises(ValueError, match=">= 1"):
        behaviour_weights(x, x, x + 1, "token", 0.5)


def test_decoupled_loss_by_hand():
    """One row, three trained tokens, advantage +1: loss = -mean_t w_t * min(r_t, clip(r_t)), r = pi/pi_prox."""
    pi = np.log(np.asarray([[0.6, 0.2, 0.5]], np.float32))
    prox = np.log(np.asarray([[0.5, 0.25, 0.5]], np.float32))
    mu = np.log(np.asarray([[0.2, 0.5, 0.4]], np.float32))
    w = np.ones((1, 3), np.float32)
    adv = np.asarray([1.0], np.float32)
    r = np.exp(pi - prox)  # 1.2, 0.8, 1.0
    clipped = np.minimum(r, np.clip(r, 0.8, 1.2))
    is_w = np.minimum(np.exp(prox - mu), 2.0)  # 2.5 -> 2.0, 0.5, 1.25
    want = -float(np.mean(is_w * clipped))
    out = jit_loss(
        jnp.asarray(pi),
        jnp.asarray(prox),
        jnp.asarray(adv),
        jnp.asarray(w),
        behaviour_logp=jnp.asarray(mu),
        behaviour_mode="token",
        behaviour_cap=2.0,
        agg="seq_mean_token_mean",
    )
    s, n = out["loss"]
    assert math.isclose(float(s / n), want, rel_tol=1e-6)
    s, n = out["is_truncated"]
    assert math.isclose(float(s / n), 1 / 3, rel_tol=1e-6)
    s, n = out["is_weight"]
    assert math.isclose(float(s / n), float(is_w.mean()), rel_tol=1e-6)
    s, n = out["is_log_ratio_abs"]
    assert math.isclose(float(s / n), float(np.abs(prox - mu).mean()), rel_tol=1e-6)


def test_gradient_is_the_weighted_policy_gradient():
    """Inside the clip the loss is -mean_t w_t A exp(logp - prox): its gradient in logp_t is -w_t A r_t / T."""
    rng = np.random.default_rng(0)
    logp = np.log(rng.uniform(0.2, 0.8, (2, 4))).astype(np.float32)
    prox = logp + rng.uniform(-0.05, 0.05, logp.shape).astype(np.float32)  # ratios inside the clip
    mu = prox + rng.uniform(-1.0, 1.0, logp.shape).astype(np.float32)
    w = np.ones((2, 4), np.float32)
    adv = np.asarray([0.7, -1.3], np.float32)

    def loss(lp):
        out = policy_loss(
            lp, jnp.asarray(prox), jnp.asarray(adv), jnp.asarray(w), behaviour_logp=jnp.asarray(mu), dual_clip=None
        )
        return out["loss"][0] / out["loss"][1]

    g = np.asarray(jax.grad(loss)(jnp.asarray(logp)))
    is_w = np.minimum(np.exp(prox - mu), 2.0)
    want = -is_w * adv[:, None] * np.exp(logp - prox) / (4 * 2)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


def test_no_behaviour_policy_is_the_plain_loss_and_equal_policies_weigh_one():
    rng = np.random.default_rng(1)
    logp = jnp.asarray(np.log(rng.uniform(0.1, 0.9, (3, 5))).astype(np.float32))
    old = logp + 0.1
    adv = jnp.asarray([1.0, -0.5, 2.0])
    w = jnp.ones((3, 5))
    plain = jit_loss(logp, old, adv, w)
    same = jit_loss(logp, old, adv, w, behaviour_logp=old)
    assert float(plain["loss"][0]) == float(same["loss"][0])
    assert "is_weight" not in plain and float(same["is_weight"][0]) == float(same["is_weight"][1])


def test_auto_correction_follows_the_lag():
    assert RLSection().behaviour_correction() == "none"
    assert RLSection(max_staleness=1).behaviour_correction() == "token"
    assert RLSection(max_staleness=2, behaviour_is="sequence").behaviour_correction() == "sequence"
    assert RLSection(max_staleness=1, recompute_old_logprobs=False).behaviour_correction() == "none"
    with pytest.raises(ValueError, match="recompute_old_logprobs"):
        RLSection(max_staleness=1, behaviour_is="token", recompute_old_logprobs=False)
