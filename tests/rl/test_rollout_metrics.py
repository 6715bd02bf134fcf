"""The episode metrics of an RL step count a success the way every evaluation does (a full checklist score)."""

from __future__ import annotations

import numpy as np
import pytest

from envace_jax.rl.step import rollout_metrics
from envace_jax.rl.types import Episode


def _episode(i: int, score: float) -> Episode:
    return Episode(i, f"u{i // 2}", record={}, messages=[], caller_ids=[], score=score, termination="done")


def test_success_is_a_full_score_and_any_credit_is_a_score_above_zero():
    # a full score, one a float rounding below it (a mean of three item scores), a partial, none, and an
    # episode whose judge was lost (left out)
    scores = [1.0, (1 / 3) * 3 - 1e-12, 0.5, 0.0, 1.0]
    eps = [_episode(i, s) for i, s in enumerate(scores)]
    m = rollout_metrics(eps, [], np.asarray(scores), unscored={4})
    assert m["episode/success_frac"] == pytest.approx(2 / 4)
    assert m["episode/any_credit_frac"] == pytest.approx(3 / 4)
    assert m["episode/score_mean"] == pytest.approx((2 + 0.5) / 4)
    assert m["episode/count"] == 5
