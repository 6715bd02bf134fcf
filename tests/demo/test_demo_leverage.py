"""pass@k and the leverage table, against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest

from envace_jax.demo.leverage import leverage_table, measure_leverage, pass_at_k


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """Every k-subset of n samples (the first c correct): the fraction that holds a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(4, 1, 2), (16, 0, 4), (16, 16, 1), (16, 3, 4), (8, 5, 8), (10, 2, 1)])
def test_pass_at_k_equals_subset_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_pass_at_k_hand_values_and_errors():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(16, 1, 1) == pytest.approx(1 / 16)
    assert pass_at_k(16, 2, 4) == pytest.approx(1 - math.comb(14, 4) / math.comb(16, 4))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_leverage_table_groups_by_branch_and_type():
    tasks = [
        {"branch": "happy", "task_type": "bank/balance"},
        {"branch": "happy", "task_type": "bank/balance"},
        {"branch": "push_back", "task_type": "bank/overdraw"},
    ]
    greedy = [True, False, False]
    sampled = [[True, True, False, False], [False, False, False, False], [True, False, False, False]]
    t = leverage_table(tasks, greedy, sampled, ks=(1, 4), temperature=0.6)
    assert t.rows["all"]["greedy"] == pytest.approx(1 / 3)
    assert t.rows["all"]["pass@1"] == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert t.rows["all"]["pass@4"] == pytest.approx(2 / 3)
    assert t.rows["branch happy"]["pass@1"] == pytest.approx(0.25)
    assert t.rows["bank/overdraw"] == {"tasks": 1.0, "greedy": 0.0, "pass@1": 0.25, "pass@4": 1.0}
    md = t.to_markdown()
    assert "pass@4 (T=0.6)" in md and "| bank/overdraw | 1 | 0.000 | 0.250 | 1.000 |" in md
    with pytest.raises(ValueError, match="every k"):
        leverage_table(tasks, greedy, sampled, ks=(8,), temperature=0.6)


def test_measure_leverage_samples_each_repeat_with_its_own_seed():
    calls = []

    def run_real(tasks, temperature, seed):
        calls.append((temperature, seed))
        return [seed % 2 == 1 for _ in tasks]  # odd seeds succeed: 2 of 4 sampled repeats

    t = measure_leverage(run_real, [{"branch": "happy", "task_type": "a/b"}], ks=(1, 4), temperature=0.7)
    assert calls == [(0.0, 0), (0.7, 1), (0.7, 2), (0.7, 3), (0.7, 4)]
    assert t.rows["all"]["greedy"] == 0.0 and t.rows["all"]["pass@1"] == pytest.approx(0.5)
    assert t.rows["all"]["pass@4"] == 1.0
