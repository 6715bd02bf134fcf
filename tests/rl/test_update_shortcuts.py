"""The RL step's exact shortcuts give the same optimizer steps as the reference's two-pass update.

``rl.old_logprobs_from_update`` takes pi_old's log-probs from the update's own forward pass instead of a
separate recompute pass; ``rl.skip_zero_advantage_rows`` leaves rows whose advantage is 0 out of the
forward/backward passes and divides by the whole batch's loss count. The truth is the faithful step (old
log-probs recomputed by a second pass, every row through the model) on a copy of the same tiny Qwen3, fed
the same episodes: after each of three steps the weights must agree to float32 round-off, including a
step in which every group has equal scores (no row left: Adam's moments still move the weights).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from envace_jax.config import LossConfig, OptimConfig, RLSection
from envace_jax.models import qwen3
from envace_jax.rl import loss as loss_lib
from envace_jax.rl.rollout import RoleSampling, RolloutConfig
from envace_jax.rl.step import RLStep
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.types import ACT, REHEARSE, Episode, Generation

VOCAB = 64


class _Engine:  # what RLStep reads of an engine; the episodes are replayed by ``rollout`` below
    cfg = RolloutConfig(mode="rehearsal", act=RoleSampling(temperature=1.0), rehearse=RoleSampling(temperature=1.0))
    policy = simulator = None


def _episodes(rng: np.random.Generator, scores: list[list[float]]) -> list[Episode]:
    """Episodes of len(scores) prompts x len(scores[0]) rollouts; each has 1-2 ACT rows and a REHEARSE
    row of random tokens (sampler log-probs are random too: only the trainer's matter here)."""
    eps = []
    for p, group in enumerate(scores):
        for score in group:
            k = len(eps)
            gens = []
            for role in [ACT] * int(rng.integers(1, 3)) + [REHEARSE]:
                n_prompt, n_gen = int(rng.integers(4, 20)), int(rng.integers(1, 9))
                gens.append(
                    Generation(
                        role,
                        rng.integers(1, VOCAB, n_prompt).tolist(),
                        rng.integers(1, VOCAB, n_gen).tolist(),
                        (-rng.random(n_gen)).tolist(),
                        f"p{p}",
                        k,
                        0,
                        text="x",
                        score=score,
                        temperature=0.7 if role == ACT else 1.3,
                    )
                )
            eps.append(Episode(k, f"p{p}", {}, [], [], generations=gens, score=score, termination="completed"))
    return eps


def _signal_rows(eps: list[Episode]) -> int:
    """Rows whose row-mean advantage is not 0, by hand in float64 (key: prompt, role)."""
    keys: dict[tuple[str, str], list[float]] = {}
    for e in eps:
        for g in e.generations:
            keys.setdefault((g.uid, g.role), []).append(g.score)
    return sum(abs(s - np.mean(v)) > 1e-9 for v in keys.values() for s in v)


def _step(model, rl: RLSection, loss: LossConfig, eps) -> tuple[RLStep, Trainer]:
    trainer = Trainer(
        model,
        OptimConfig(lr=1e-2, schedule="constant", weight_decay=0.0, grad_clip=1.0),
        loss,
        micro_batch_size=4,
        pad_micro_batches=True,
    )
    step = RLStep(rl, _Engine(), {ACT: trainer, REHEARSE: trainer})
    step.rollout = lambda records, iteration: eps[iteration]
    return step, trainer


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(),
        LossConfig(agg="token_mean", role_balanced=True),
        LossConfig(agg="seq_mean_token_sum", dual_clip=None),
    ],
    ids=["reference", "token_mean_role_balanced", "seq_sum"],
)
def test_shortcuts_take_the_faithful_optimizer_steps(loss):
    cfg = qwen3.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16
    )
    rng = np.random.default_rng(0)
    eps = [
        _episodes(rng, [[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]),  # one group with signal
        _episodes(rng, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.2, 0.2, 0.2]]),  # none: every row skipped
        _episodes(rng, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.5], [0.3, 0.3, 0.3]]),
    ]
    common = dict(n_rollouts=3, micro_batch_size=4, max_row_length=64, length_multiple=16)
    faithful, t_ref = _step(qwen3.init_model(cfg, seed=3), RLSection(**common), loss, eps)
    fast, t_fast = _step(
        qwen3.init_model(cfg, seed=3),
        RLSection(**common, old_logprobs_from_update=True, skip_zero_advantage_rows=True),
        loss,
        eps,
    )
    seen = []
    real_update = t_fast.update

    def spy(batch, kind="rl", **kw):
        seen.append((int((batch.loss_weights.sum(1) > 0).sum()), kw))
        return real_update(batch, kind, **kw)

    t_fast.update = spy
    for it in range(3):
        a, b = faithful([{}] * 3, it), fast([{}] * 3, it)
        rows = sum(len(e.generations) for e in eps[it])
        assert a.metrics["update/rows"] == rows
        assert b.metrics["update/rows"] + b.metrics["update/zero_advantage_rows_skipped"] == rows
        assert "act/logp_mismatch_sampler" in a.metrics and "act/logp_mismatch_sampler" not in b.metrics
        assert b.metrics["update/ratio"] == 1.0 if b.metrics["update/rows"] else True
        assert b.metrics["update/loss"] == pytest.approx(a.metrics["update/loss"], abs=1e-6)
        assert b.metrics["update/grad_norm"] == pytest.approx(a.metrics["update/grad_norm"], rel=1e-4, abs=1e-7)
        for x, y in zip(
            jax.tree.leaves(nnx.state(t_ref.model, nnx.Param)), jax.tree.leaves(nnx.state(t_fast.model, nnx.Param))
        ):
            np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-6)
    # what the fast trainer ran: the signal rows only (none in step 2), over the whole batch's count
    assert [n for n, _ in seen] == [_signal_rows(e) for e in eps] and seen[1][0] == 0
    assert all(kw["old_from_update"] and kw["loss_count"] > 0 for _, kw in seen)
    assert ("role_counts" in seen[0][1]) == loss.role_balanced
    # and the weights did move in the step without signal (Adam's moments), as in the faithful run
    assert t_fast.step == t_ref.step == 3


def test_loss_count_matches_policy_loss():
    """``loss_count`` is the count ``policy_loss`` returns, for every aggregation (hand-made weights)."""
    w = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]], np.float32)
    roles = np.array([0, 1, 1], np.int32)
    z = np.zeros_like(w)
    assert loss_lib.loss_count(w, "token_mean")[0] == 5.0
    assert loss_lib.loss_count(w, "seq_mean_token_mean")[0] == 2.0
    assert loss_lib.loss_count(w, "seq_mean_token_sum", roles, role_balanced=True)[0] == 2.0
    assert loss_lib.loss_count(w[:1], "seq_mean_token_sum", roles[:1], role_balanced=True)[0] == 1.0
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        np.testing.assert_allclose(loss_lib.loss_count(w, agg, roles)[1], loss_lib.role_unit_counts(w, roles, agg))
        for rb in (False, True):
            want = loss_lib.policy_loss(z, z, np.zeros(3, np.float32), w, agg=agg, role_ids=roles, role_balanced=rb)[
                "loss"
            ][1]
            assert loss_lib.loss_count(w, agg, roles, role_balanced=rb)[0] == pytest.approx(float(want))


def test_shortcut_settings_are_checked():
    with pytest.raises(ValueError, match="old_logprobs_from_update"):
        RLSection(old_logprobs_from_update=True, ppo_epochs=2)
    with pytest.raises(ValueError, match="skip_zero_advantage_rows"):
        RLSection(skip_zero_advantage_rows=True, mini_batches=2)
    cfg = qwen3.Qwen3Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8
    )
    eps = [_episodes(np.random.default_rng(1), [[1.0, 0.0]])]
    with pytest.raises(ValueError, match="kl_coef"):
        _step(
            qwen3.init_model(cfg, seed=0),
            RLSection(n_rollouts=2, skip_zero_advantage_rows=True, max_row_length=64),
            LossConfig(kl_coef=0.01),
            eps,
        )


def test_trainer_refuses_an_entropy_bonus_it_would_not_apply():
    """LossConfig.entropy_coef was accepted and silently ignored by the Trainer (its fused head computes
    no entropy); it is now refused by name."""
    cfg = qwen3.Qwen3Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8
    )
    with pytest.raises(ValueError, match="entropy_coef"):
        Trainer(qwen3.init_model(cfg, seed=0), OptimConfig(), LossConfig(entropy_coef=0.01))
