"""Role-wise GRPO advantages against hand-computed values and a brute-force Python reference."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace_jax.rl.advantages import BASELINES, advantage_stats, role_wise_advantages

EPS = 1e-6

# Shuffled rows, groups of uneven size, two rows from the same episode, singleton keys and a negative group id.
#            row:  0     1    2    3    4    5    6    7    8    9    10    11
GROUP = np.array([7, 3, 7, 3, 7, 3, 7, 7, 9, 3, 7, -2])
ROLE = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1])
EPISODE = np.array([10, 20, 11, 20, 10, 21, 11, 10, 30, 20, 12, 40])
SCORE = np.array([0.5, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.5, 0.8, 1.0, 0.25, 0.3], np.float32)
# Keys: (3,0) rows 1,5,9 = 1,0,1 (episodes 20,21,20); (3,1) row 3 alone; (7,0) rows 2,4,7 = 0,.5,.5
# (episodes 11,10,10); (7,1) rows 0,6,10 = .5,0,.25 (one row per episode); (9,0) row 8 alone; (-2,1) row 11 alone.

HAND = {
    "row_mean": [
        0.5 - 0.25,
        1 - 2 / 3,
        0 - 1 / 3,
        1.0,
        0.5 - 1 / 3,
        0 - 2 / 3,
        0 - 0.25,
        0.5 - 1 / 3,
        0.8,
        1 - 2 / 3,
        0.0,
        0.3,
    ],
    # (3,0): episode means 1.0 and 0.0 -> 0.5; (7,0): episode means 0.5 and 0.0 -> 0.25.
    "trajectory_mean": [0.25, 0.5, -0.25, 1.0, 0.25, -0.5, -0.25, 0.25, 0.8, 0.5, 0.0, 0.3],
    "rloo": [
        0.5 - (0 + 0.25) / 2,
        1 - (0 + 1) / 2,
        0 - (0.5 + 0.5) / 2,
        1.0,
        0.5 - (0 + 0.5) / 2,
        0 - (1 + 1) / 2,
        0 - (0.5 + 0.25) / 2,
        0.5 - (0 + 0.5) / 2,
        0.8,
        1 - (1 + 0) / 2,
        0.25 - (0.5 + 0) / 2,
        0.3,
    ],
    "none": SCORE.tolist(),
}

# Group std of each row's key (rows for row_mean / rloo / none; episode means for trajectory_mean).
_ROW_SS = {(3, 0): 2 / 3, (7, 0): 1 / 6, (7, 1): 0.125}  # sums of squared deviations, 3 rows each
_TRAJ = {(3, 0): (0.5, 2), (7, 0): (0.125, 2), (7, 1): (0.125, 3)}  # (ss, episodes)


def _sigma(i: int, ddof: int, traj: bool) -> float:
    key = (int(GROUP[i]), int(ROLE[i]))
    if traj:
        if key not in _TRAJ:
            return 1.0
        ss, n = _TRAJ[key]
    else:
        if key not in _ROW_SS:
            return 1.0
        ss, n = _ROW_SS[key], 3
    return math.sqrt(ss / (n - ddof))


def _call(baseline, normalize=False, ddof=1, **kw):
    return np.asarray(
        role_wise_advantages(
            jnp.asarray(SCORE),
            jnp.asarray(GROUP),
            jnp.asarray(ROLE),
            baseline,
            normalize,
            episode_ids=jnp.asarray(EPISODE),
            std_ddof=ddof,
            **kw,
        )
    )


@pytest.mark.parametrize("baseline", BASELINES)
def test_hand_values_every_baseline(baseline):
    out = _call(baseline)
    assert out.dtype == np.float32 and out.shape == (12,)
    np.testing.assert_allclose(out, HAND[baseline], atol=1e-6)


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("baseline", BASELINES)
def test_hand_values_std_normalized(baseline, ddof):
    traj = baseline == "trajectory_mean"
    want = [HAND[baseline][i] / (_sigma(i, ddof, traj) + EPS) for i in range(12)]
    np.testing.assert_allclose(_call(baseline, True, ddof), want, rtol=2e-6, atol=1e-6)


def test_reference_case_singletons_are_raw_scores():
    # The reference's rule: a lone row of a (uid, role) key keeps its raw score, with or without std.
    for norm in (False, True):
        out = _call("row_mean", norm)
        for i in (3, 8, 11):
            assert out[i] == pytest.approx(SCORE[i] / (1 + EPS if norm else 1), abs=1e-7)


def test_zero_std_group_gives_zero_advantage_not_nan():
    s = jnp.array([0.7, 0.7, 0.7, 0.2], jnp.float32)
    g = jnp.array([1, 1, 1, 2])
    r = jnp.zeros(4, jnp.int32)
    out = np.asarray(role_wise_advantages(s, g, r, "row_mean", True))
    np.testing.assert_allclose(out, [0, 0, 0, 0.2 / (1 + EPS)], atol=1e-6)


def test_roles_of_the_same_group_have_separate_baselines():
    # Same prompt, same scores per episode; the ACT role has 2 rows in episode 0, REHEARSE one per episode.
    s = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0], jnp.float32)
    g = jnp.zeros(5, jnp.int32)
    r = jnp.array([0, 0, 0, 1, 1])
    out = np.asarray(role_wise_advantages(s, g, r))
    np.testing.assert_allclose(out, [1 / 3, 1 / 3, -2 / 3, 0.5, -0.5], atol=1e-6)


@pytest.mark.parametrize("baseline", BASELINES)
def test_jit_equals_eager_and_shuffle_permutes(baseline):
    f = jax.jit(lambda s, g, r, e: role_wise_advantages(s, g, r, baseline, True, episode_ids=e, std_ddof=0))
    eager = _call(baseline, True, 0)
    np.testing.assert_allclose(np.asarray(f(SCORE, GROUP, ROLE, EPISODE)), eager, rtol=1e-6, atol=1e-7)
    perm = np.random.default_rng(3).permutation(12)
    shuffled = np.asarray(f(SCORE[perm], GROUP[perm], ROLE[perm], EPISODE[perm]))
    np.testing.assert_allclose(shuffled, eager[perm], rtol=1e-6, atol=1e-7)


def test_num_segments_bound():
    # 6 distinct (group, role) keys: an exact bound works, a smaller one is refused on concrete input
    # and poisons rows with NaN under jit (where it cannot be checked).
    np.testing.assert_allclose(_call("row_mean", num_segments=6), HAND["row_mean"], atol=1e-6)
    with pytest.raises(ValueError, match="num_segments=5 is smaller than the 6 distinct"):
        _call("row_mean", num_segments=5)
    f = jax.jit(lambda s, g, r: role_wise_advantages(s, g, r, num_segments=5))
    out = np.asarray(f(SCORE, GROUP, ROLE))
    assert np.isnan(out).any() and not np.isnan(out).all()


def _brute(scores, groups, roles, episodes, baseline, normalize, ddof):
    """Straight Python loops over dictionaries: an independent implementation of the documented rules."""
    out = []
    for i in range(len(scores)):
        key = [j for j in range(len(scores)) if groups[j] == groups[i] and roles[j] == roles[i]]
        if baseline == "trajectory_mean":
            eps_ = sorted({episodes[j] for j in key})
            units = [float(np.mean([scores[j] for j in key if episodes[j] == e])) for e in eps_]
        else:
            units = [float(scores[j]) for j in key]
        n = len(units)
        mu = sum(units) / n
        if baseline in ("row_mean", "trajectory_mean"):
            base = mu if n > 1 else 0.0
        elif baseline == "rloo":
            base = (sum(units) - scores[i]) / (n - 1) if n > 1 else 0.0
        else:
            base = 0.0
        a = scores[i] - base
        if normalize:
            sd = math.sqrt(sum((u - mu) ** 2 for u in units) / (n - ddof)) if n > 1 and n > ddof else 1.0
            a = a / (sd + EPS)
        out.append(a)
    return out


# One batch size and fixed options keep compilation to one per baseline; the content varies freely.
# (normalize off and ddof 0 are covered by the hand cases above.)
@pytest.mark.parametrize("baseline", BASELINES)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_batches_match_brute_force(baseline, data):
    normalize, ddof = True, 1
    b = 9
    groups = data.draw(st.lists(st.integers(-3, 3), min_size=b, max_size=b))
    roles = data.draw(st.lists(st.integers(0, 1), min_size=b, max_size=b))
    episodes = data.draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    scores = data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -0.1]), min_size=b, max_size=b))
    got = role_wise_advantages(
        jnp.asarray(scores, jnp.float32),
        jnp.asarray(groups),
        jnp.asarray(roles),
        baseline,
        normalize,
        episode_ids=jnp.asarray(episodes),
        std_ddof=ddof,
    )
    want = _brute(np.float32(scores).astype(float), groups, roles, episodes, baseline, normalize, ddof)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_bad_input_names_the_problem():
    s, g, r = jnp.ones(3), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32)
    with pytest.raises(ValueError, match="baseline='mean'"):
        role_wise_advantages(s, g, r, "mean")
    with pytest.raises(ValueError, match="trajectory_mean' needs episode_ids"):
        role_wise_advantages(s, g, r, "trajectory_mean")
    with pytest.raises(ValueError, match=r"role_ids must have shape \[3\]"):
        role_wise_advantages(s, g, jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match="group_ids must be an integer array"):
        role_wise_advantages(s, jnp.zeros(3), r)
    with pytest.raises(ValueError, match="std_ddof"):
        role_wise_advantages(s, g, r, std_ddof=-1)
    with pytest.raises(ValueError, match="scores is empty"):
        role_wise_advantages(jnp.zeros(0), jnp.zeros(0, jnp.int32), jnp.zeros(0, jnp.int32))


def test_advantage_stats_hand_case():
    adv = _call("row_mean")
    m = advantage_stats(adv, SCORE, GROUP, ROLE, role_names={0: "act", 1: "rehearse"})
    # ACT rows 1,2,4,5,7,8,9: all advantages nonzero; keys (3,0),(7,0),(9,0), one singleton, none zero-std.
    assert m["adv/act/rows"] == 7 and m["adv/act/groups"] == 3
    assert m["adv/act/nonzero_frac"] == 1.0
    assert m["adv/act/singleton_group_frac"] == pytest.approx(1 / 3)
    assert m["adv/act/zero_std_group_frac"] == 0.0
    # REHEARSE rows 0,3,6,10,11: row 10 has advantage 0 exactly (0.25 is its group's mean).
    assert m["adv/rehearse/nonzero_frac"] == pytest.approx(4 / 5)
    assert m["adv/rehearse/singleton_group_frac"] == pytest.approx(2 / 3)
    assert m["adv/rehearse/max"] == pytest.approx(1.0)
    flat = advantage_stats(np.zeros(3), [0.5, 0.5, 0.1], [1, 1, 2], [0, 0, 0])
    assert flat["adv/role0/zero_std_group_frac"] == 0.5 and flat["adv/role0/nonzero_frac"] == 0.0
