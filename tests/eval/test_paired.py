"""eval.paired against hand-computed examples: McNemar's exact p from binomial tails worked out below, bootstrap
intervals whose resampling distribution is known exactly, the sign of a difference, and the pooled estimate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envace_jax.eval import paired
from envace_jax.eval.paired import TaskOutcome


def arm(successes, scores=None, prefix="t"):
    scores = scores if scores is not None else [1.0 if s else 0.0 for s in successes]
    return [TaskOutcome(f"{prefix}{i}", bool(s), float(x)) for i, (s, x) in enumerate(zip(successes, scores))]


def test_mcnemar_exact_p_by_hand():
    # 1 win, 7 losses: 8 discordant pairs; P(X <= 1) for X ~ Bin(8, 1/2) = (C(8,0) + C(8,1)) / 2^8 = 9/256,
    # two-sided 18/256 = 0.0703125
    assert paired.mcnemar_exact_p(1, 7) == pytest.approx(18 / 256, abs=1e-15)
    assert paired.mcnemar_exact_p(7, 1) == pytest.approx(18 / 256, abs=1e-15)  # symmetric
    # 0 wins, 5 losses: 2 * 1/32 = 0.0625 (five discordant pairs can never reach p < 0.05)
    assert paired.mcnemar_exact_p(0, 5) == pytest.approx(0.0625, abs=1e-15)
    # 0 wins, 6 losses: 2/64 = 0.03125
    assert paired.mcnemar_exact_p(0, 6) == pytest.approx(0.03125, abs=1e-15)
    # 3 / 3: twice (1 + 6 + 15 + 20)/64 = 84/64 > 1 -> capped at 1; no discordant pair -> 1
    assert paired.mcnemar_exact_p(3, 3) == 1.0 and paired.mcnemar_exact_p(0, 0) == 1.0
    # thousands of pairs: the exact integer tail does not underflow (it would in float with 2^-3000 terms)
    assert 0.0 < paired.mcnemar_exact_p(1400, 1600) < 0.001
    with pytest.raises(ValueError, match="wins=-1"):
        paired.mcnemar_exact_p(-1, 2)


def test_mcnemar_matches_scipy_binomtest():
    stats = pytest.importorskip("scipy.stats")
    for wins, losses in ((1, 7), (12, 30), (40, 41), (0, 13)):
        assert paired.mcnemar_exact_p(wins, losses) == pytest.approx(
            stats.binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-9
        )


def test_a_2x2_table_gives_its_counts_and_p():
    # 10 tasks: both succeed on 4, both fail on 1, A alone on 1, B alone on 4 (the 2x2 table [[4, 1], [4, 1]])
    a = arm([1, 1, 1, 1, 0, 1, 0, 0, 0, 0])
    b = arm([1, 1, 1, 1, 0, 0, 1, 1, 1, 1])
    r = paired.compare(a, b, "A", "B", n_boot=2000)
    assert (r.wins, r.losses, r.ties, r.tasks) == (1, 4, 5, 10)
    assert r.success_a == pytest.approx(0.5) and r.success_b == pytest.approx(0.8)
    assert r.success_diff == pytest.approx(-0.3)
    # 5 discordant pairs, 1 win: 2 * (C(5,0) + C(5,1)) / 32 = 12/32
    assert r.mcnemar_p == pytest.approx(12 / 32)
    lo, hi = r.success_diff_ci
    assert lo <= -0.3 <= hi and -1.0 <= lo and hi <= 1.0


def test_bootstrap_is_paired_ties_give_exactly_zero():
    # every task has the same outcome under both arms, half succeed: a paired interval is exactly [0, 0],
    # where two per-arm intervals around 0.5 would overlap widely
    s = [i % 2 for i in range(40)]
    x = [0.3 + 0.01 * i for i in range(40)]
    r = paired.compare(arm(s, x), arm(s, x), n_boot=500)
    assert r.success_diff_ci == (0.0, 0.0) and r.score_diff_ci == (0.0, 0.0)
    assert (r.wins, r.losses, r.ties) == (0, 0, 40) and r.mcnemar_p == 1.0 and not r.significant


def test_bootstrap_degenerate_difference_is_exactly_d():
    # A beats B by exactly 0.5 in score on every task, and wins every task: d = 1 and 0.5 in every resample
    a = arm([1] * 30, [1.0] * 30)
    b = arm([0] * 30, [0.5] * 30)
    r = paired.compare(a, b, n_boot=300)
    assert r.success_diff_ci == (1.0, 1.0) and r.score_diff_ci == (0.5, 0.5)
    assert r.mcnemar_p == pytest.approx(2 / 2**30) and r.significant


def test_bootstrap_interval_of_two_tasks_by_hand():
    # d = [1, 0]: a resample of 2 tasks has mean 1 (1/4), 0.5 (1/2) or 0 (1/4), so the 2.5% and 97.5%
    # percentiles of 10,000 resamples are 0 and 1
    r = paired.compare(arm([1, 0]), arm([0, 0]), n_boot=10_000, seed=3)
    assert r.success_diff == 0.5 and r.success_diff_ci == (0.0, 1.0)


def test_sign_and_swap():
    rng = np.random.default_rng(0)
    b = rng.random(400) < 0.6
    a = b | (rng.random(400) < 0.5)  # A solves what B does and more
    ra = paired.compare(arm(a), arm(b), "A", "B", n_boot=2000, seed=1)
    assert ra.losses == 0 and ra.wins > 50 and ra.success_diff > 0
    assert ra.success_diff_ci[0] > 0 and ra.significant and ra.mcnemar_p < 1e-10
    rb = paired.compare(arm(b), arm(a), "B", "A", n_boot=2000, seed=1)
    assert (rb.wins, rb.losses) == (ra.losses, ra.wins) and rb.mcnemar_p == ra.mcnemar_p
    assert rb.success_diff == pytest.approx(-ra.success_diff)
    # same resamples (same seed and task order): the interval is mirrored
    assert rb.success_diff_ci == pytest.approx((-ra.success_diff_ci[1], -ra.success_diff_ci[0]))


def test_tasks_are_joined_by_uid_and_mismatches_are_named():
    a = arm([1, 0, 1])
    b = list(reversed(arm([1, 1, 0])))  # other order: joined by uid, not by position
    r = paired.compare(a, b, n_boot=100)
    assert (r.wins, r.losses, r.ties) == (1, 1, 1)
    other = arm([1, 0, 1])[:2] + [TaskOutcome("x9", True, 1.0)]
    with pytest.raises(ValueError, match=r"1 uid\(s\) only in 'after' \['t2'\], 1 only in 'before' \['x9'\]"):
        paired.compare(a, other, "after", "before")
    with pytest.raises(ValueError, match=r"\['t0'\] appear more than once"):
        paired.compare(a + a[:1], a)


def test_pool_over_seeds():
    # seed 1: A wins all 4 tasks (d = 1); seed 2: 8 tasks, A wins 2 of them and ties the rest (d = 0.25);
    # pooled = mean of per-seed differences (1 + 0.25) / 2 = 0.625; discordant pairs summed: 6 wins, 0 losses
    # -> p = 2 / 2^6
    s1 = (arm([1] * 4, prefix="a"), arm([0] * 4, prefix="a"))
    s2 = (arm([1, 1, 0, 0, 1, 1, 1, 1], prefix="b"), arm([0, 0, 0, 0, 1, 1, 1, 1], prefix="b"))
    r = paired.pool([s1, s2], "after", "before", n_boot=4000)
    assert r.seeds == 2 and r.tasks == 12
    assert r.success_diff == pytest.approx(0.625) and (r.wins, r.losses, r.ties) == (6, 0, 6)
    assert r.mcnemar_p == pytest.approx(2 / 64)
    # seed 1 never varies, seed 2's resampled difference ranges over k/8: the pooled one over (1 + k/8) / 2
    lo, hi = r.success_diff_ci
    assert 0.5 <= lo < 0.625 < hi <= 1.0
    # a constant per-seed difference pools to exactly its mean
    s3 = (arm([1, 1, 0, 0], prefix="c"), arm([0, 0, 0, 0], prefix="c"))  # d per task 1, 1, 0, 0 -> varies
    flat = paired.pool([s1, (arm([1] * 4, prefix="d"), arm([1] * 4, prefix="d"))], n_boot=200)
    assert flat.success_diff_ci == (0.5, 0.5)
    assert paired.pool([s3], n_boot=200).success_diff == paired.compare(*s3, n_boot=200).success_diff == 0.5


def test_outcomes_round_trip_and_bad_files(tmp_path):
    outs = paired.outcomes_of(["u1", "u2", "u3"], [1.0, 0.5, 1.0 - 1e-12])
    assert [o.success for o in outs] == [True, False, True]  # eval.results.is_success: score 1 up to rounding
    path = paired.write_outcomes(str(tmp_path), "after", outs)
    assert path == str(tmp_path / "eval_after_tasks.jsonl")
    assert json.loads(open(path).readline()) == {"uid": "u1", "success": True, "score": 1.0}
    assert paired.read_outcomes(path) == outs
    assert paired.find_arms(str(tmp_path)) == {"after": path}
    (tmp_path / "eval_bad_tasks.jsonl").write_text('{"uid": "u1", "score": 1.0}\n')
    with pytest.raises(ValueError, match=r"eval_bad_tasks.jsonl:1: expected"):
        paired.read_outcomes(str(tmp_path / "eval_bad_tasks.jsonl"))
    (tmp_path / "eval_bad_tasks.jsonl").write_text('{"uid": "u1", "success": 1, "score": 1.0}\n')
    with pytest.raises(ValueError, match="'success' must be true or false"):
        paired.read_outcomes(str(tmp_path / "eval_bad_tasks.jsonl"))
    with pytest.raises(ValueError, match="arm name"):
        paired.write_outcomes(str(tmp_path), "a/b", outs)
    r = paired.compare(outs, outs, n_boot=10)
    assert paired.PairedResult.from_dict(json.loads(json.dumps(r.as_dict()))) == r
