"""GSPO's sequence ratio and GSPO-token (loss.ratio_level) against a float64 NumPy transcription of the paper's
equations (Zheng et al. 2025, arXiv 2507.18071), loss and gradient, with rows on both sides of the clip; the
token level is the PPO ratio as before; the knob reaches the Trainer's update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envace_jax.config import LossConfig, OptimConfig, load_config
from envace_jax.models import qwen3
from envace_jax.rl.loss import policy_loss
from envace_jax.rl.trainer import Trainer
from tests.rl.test_trainer_update import CFG, _batch

EPS_LOW, EPS_HIGH = 3e-4, 4e-4  # the paper's clip range for the sequence ratio

# 4 rows x 7 positions; 0 weight on the prompt (first two) and on padding. Each row's old log-probs differ from
# the current ones by token deltas whose mean puts the row's ratio inside or outside the clip:
# row 0: A > 0, s - 1 = +1e-4 (inside); row 1: A < 0, s - 1 = -1e-3 (below 1 - eps: clipped);
# row 2: A > 0, s - 1 = +2e-3 (above 1 + eps: clipped); row 3: A < 0, s - 1 = +5e-4 (above, but for A < 0 the
# unclipped term is the larger: not clipped).
W = np.array(
    [
        [0, 0, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 0, 0, 0],
    ],
    np.float64,
)
ADV = np.array([1.0, -0.5, 0.8, -1.2])
MEAN_DELTA = np.array([1e-4, -1e-3, 2e-3, 5e-4])
CLIPPED_ROWS = np.array([False, True, True, False])


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-2.0, 0.5, W.shape)
    # token deltas that vary along the row (so token and sequence ratios differ) with the row mean above
    wiggle = rng.normal(0, 3e-3, W.shape) * W
    wiggle -= (wiggle.sum(1, keepdims=True) / W.sum(1, keepdims=True)) * W
    delta = (MEAN_DELTA[:, None] + wiggle) * W
    old = logp - delta
    # values float32 holds exactly, so the float64 reference and the float32 loss start from the same numbers
    return logp.astype(np.float32).astype(np.float64), old.astype(np.float32).astype(np.float64)


def gspo_reference(logp, old, w, adv, eps_low, eps_high):
    """float64: mean over rows of -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), s_i the geometric mean of
    the row's token ratios over its trained tokens; and its gradient in logp, by hand: where the unclipped term
    is the one taken, d/d logp_t = -A_i s_i / |y_i| on the row's trained tokens, else 0."""
    on = w > 0
    n = on.sum(1)
    s = np.exp(((logp - old) * on).sum(1) / n)
    unclipped = -adv * s
    clipped = -adv * np.clip(s, 1 - eps_low, 1 + eps_high)
    loss_rows = np.maximum(unclipped, clipped)
    takes_unclipped = unclipped >= clipped
    grad = np.where(on, (np.where(takes_unclipped, -adv * s / n, 0.0))[:, None], 0.0) / len(adv)
    return loss_rows.mean(), grad, ~takes_unclipped


def _jax_loss(logp, old, level, adv=ADV, agg="seq_mean_token_mean"):
    def f(lp):
        out = policy_loss(
            lp,
            jnp.asarray(old, jnp.float32),
            jnp.asarray(adv, jnp.float32),
            jnp.asarray(W, jnp.float32),
            clip_low=EPS_LOW,
            clip_high=EPS_HIGH,
            dual_clip=None,
            agg=agg,
            ratio_level=level,
        )
        return out["loss"][0] / out["loss"][1], out

    (value, out), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    return float(value), np.asarray(grad, np.float64), out


def test_reference_gradient_matches_its_own_finite_differences():
    # the hand gradient of the float64 reference is checked against central differences first
    logp, old = _inputs()
    _, grad, _ = gspo_reference(logp, old, W, ADV, EPS_LOW, EPS_HIGH)
    h = 1e-7
    for i, t in [(0, 2), (0, 5), (1, 3), (2, 6), (3, 2), (3, 3), (0, 0)]:
        up, dn = logp.copy(), logp.copy()
        up[i, t] += h
        dn[i, t] -= h
        fd = (
            gspo_reference(up, old, W, ADV, EPS_LOW, EPS_HIGH)[0]
            - gspo_reference(dn, old, W, ADV, EPS_LOW, EPS_HIGH)[0]
        ) / (2 * h)
        assert fd == pytest.approx(grad[i, t], abs=1e-7)


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_gspo_loss_and_gradient_match_the_papers_equations(level):
    logp, old = _inputs()
    want_loss, want_grad, want_clipped = gspo_reference(logp, old, W, ADV, EPS_LOW, EPS_HIGH)
    assert list(want_clipped) == list(CLIPPED_ROWS)  # the fixture covers both sides of the clip
    got_loss, got_grad, out = _jax_loss(logp, old, level)
    assert got_loss == pytest.approx(want_loss, abs=1e-6)  # float32 exp near 1
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    # the clip acts on whole rows: the clipped share is the clipped rows' share of trained tokens
    clipfrac = out["pg_clipfrac"][0] / out["pg_clipfrac"][1]
    assert float(clipfrac) == pytest.approx(W[CLIPPED_ROWS].sum() / W.sum(), rel=1e-6)


def test_token_level_is_the_ppo_ratio_and_differs_from_the_sequence_level():
    logp, old = _inputs()
    on = W > 0
    r = np.exp(logp - old)
    unclipped, clipped = -ADV[:, None] * r, -ADV[:, None] * np.clip(r, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token = np.where(on, np.maximum(unclipped, clipped), 0.0)
    want = (per_token.sum(1) / on.sum(1)).mean()
    got, _, _ = _jax_loss(logp, old, "token")
    assert got == pytest.approx(want, abs=1e-6)
    assert abs(got - _jax_loss(logp, old, "sequence")[0]) > 1e-5


def test_gspo_token_with_advantages_along_the_row():
    # GSPO-token: s_it = sg(s_i) * pi_t / sg(pi_t); each token's term uses its own advantage, and its gradient
    # is -A_it * s_i / |y_i| where that token's unclipped term is the one taken (else 0)
    logp, old = _inputs(1)
    rng = np.random.default_rng(5)
    adv = rng.normal(0, 1, W.shape) * W
    on = W > 0
    n = on.sum(1)
    s = np.exp(((logp - old) * on).sum(1) / n)[:, None]
    unclipped, clipped = -adv * s, -adv * np.clip(s, 1 - EPS_LOW, 1 + EPS_HIGH)
    want_loss = (np.where(on, np.maximum(unclipped, clipped), 0).sum(1) / n).mean()
    want_grad = np.where(on & (unclipped >= clipped), -adv * s / n[:, None], 0.0) / len(n)
    got_loss, got_grad, _ = _jax_loss(logp, old, "sequence_token", adv=adv)
    assert got_loss == pytest.approx(want_loss, abs=1e-6)  # float32 exp near 1
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    # and the plain sequence level differs there (its gradient spreads the row's advantages over every token)
    _, seq_grad, _ = _jax_loss(logp, old, "sequence", adv=adv)
    assert not np.allclose(seq_grad, got_grad, rtol=1e-3)


def test_knob_is_checked_and_reaches_the_trainer():
    with pytest.raises(ValueError, match="ratio_level"):
        LossConfig(ratio_level="row")
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), jnp.ones((1, 2)), ratio_level="row")
    assert load_config({"loss": {"ratio_level": "sequence"}}).loss.ratio_level == "sequence"
    batch = _batch()
    # old log-probs away from the current policy's, so the two levels give different updates
    grads = {}
    for level in ("token", "sequence"):
        tr = Trainer(
            qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)),
            OptimConfig(lr=1e-2),
            LossConfig(ratio_level=level, clip_low=EPS_LOW, clip_high=EPS_HIGH, dual_clip=None),
        )
        grads[level] = jax.tree.leaves(jax.tree.map(np.asarray, tr.gradients(batch)))
    assert any(not np.allclose(a, b) for a, b in zip(grads["token"], grads["sequence"]))


def test_on_policy_one_step_gspo_is_grpos_update():
    """With one optimizer step per batch (old = the update's own log-probs, the demo's setting) every ratio is 1:
    nothing is clipped, and the sequence ratio's gradient, -A_i / |y_i| on each trained token, is the token ratio's
    under the per-row mean. GSPO differs from GRPO only off-policy (several steps per batch, or async lag)."""
    logp, _ = _inputs(2)
    grads = {level: _jax_loss(logp, logp, level)[1] for level in ("token", "sequence", "sequence_token")}
    want = np.where(W > 0, (-ADV / W.sum(1))[:, None], 0.0) / len(ADV)
    for level, g in grads.items():
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-9, err_msg=level)
