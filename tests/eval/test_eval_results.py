"""Results records: Wilson intervals against hand-computed values, the JSON/markdown files, bad input."""

from __future__ import annotations

import json
import math

import pytest

from envace_jax.eval import results as R


def test_wilson_interval_matches_hand_computation():
    # 8/10 at z=1.96: centre (0.8 + 0.19208) / 1.38416, half-width 1.96*sqrt(0.016 + 0.0009604)/1.38416
    lo, hi = R.wilson_ci(8, 10)
    centre = (0.8 + 1.96**2 / 20) / (1 + 1.96**2 / 10)
    half = 1.96 * math.sqrt(0.8 * 0.2 / 10 + 1.96**2 / 400) / (1 + 1.96**2 / 10)
    assert lo == pytest.approx(centre - half, abs=1e-12) and hi == pytest.approx(centre + half, abs=1e-12)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert R.wilson_ci(0, 5)[0] == 0.0 and R.wilson_ci(5, 5)[1] == 1.0
    assert all(math.isnan(x) for x in R.wilson_ci(0, 0))


def test_results_files_round_trip_and_markdown(tmp_path):
    cats = [
        R.CategoryResult(
            "a",
            [
                R.EntryResult("a_0", True),
                R.EntryResult("a_1", False, "x:bad"),
                R.EntryResult("a_2", False, "x:bad"),
                R.EntryResult("a_3", False, "y"),
            ],
            {"score_mean": 0.5},
        ),
        R.CategoryResult("empty", []),
    ]
    res = R.results_dict("suite", "oracle", cats, {"k": 1})
    R.write_results(str(tmp_path), res, {c.name: c.entries for c in cats})
    back = R.load_results(str(tmp_path))
    a = back["categories"]["a"]
    assert (a["count"], a["valid"], a["accuracy"]) == (4, 1, 0.25)
    assert a["errors"] == {"x:bad": 2, "y": 1} and a["score_mean"] == 0.5
    assert back["categories"]["empty"]["accuracy"] is None  # JSON has no NaN
    md = (tmp_path / "results.md").read_text()
    assert "| a | 4 | 1 | 0.250 |" in md and "x:bad (2)" in md and "| empty | 0 | 0 | n/a |" in md
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a_0", "a_1", "a_2", "a_3"]


def test_bad_results_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="duplicate category"):
        R.results_dict("s", "p", [R.CategoryResult("a", []), R.CategoryResult("a", [])])
    (tmp_path / "results.json").write_text(json.dumps({"categories": {"c": {"count": 1, "valid": 1}}}))
    with pytest.raises(ValueError, match="category 'c' lacks 'accuracy'"):
        R.load_results(str(tmp_path))


def test_success_is_a_score_of_one_up_to_rounding():
    # Ten checklist items worth 0.1 each add up to 0.9999999999999999 in floats: still a success.
    assert sum([0.1] * 10) != 1.0 and R.is_success(sum([0.1] * 10))
    assert R.is_success(1.0) and R.is_success(1.5)
    # One item of a hundred missed is a failure, however close to 1.
    assert not R.is_success(0.99) and not R.is_success(1.0 - 1e-6)
