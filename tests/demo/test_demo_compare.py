"""`make demo-compare` (demo.pipeline.run_compare) at the reduced preset: every RL mode from one start, more
SFT for the rehearsal run's wall time, and one table with the share of the real-tools gain each recovers."""

import json

import pytest

from envace_jax.demo.config import reduced
from envace_jax.demo.pipeline import run_compare


def test_compare_runs_every_mode_from_one_start_and_states_each_share_of_the_real_gain(tmp_path):
    out = run_compare(reduced(), str(tmp_path), progress=False)
    assert set(out["modes"]) == {"real", "simulator", "rehearsal"}
    before = out["before"]["eval"]
    evals = {f"RL {m}": v["eval"] for m, v in out["modes"].items()} | {"more SFT": out["more_sft"]["eval"]}
    for name, ev in evals.items():
        assert ev["episodes"] == before["episodes"] == reduced().test_tasks
        # push-back success is the episode-weighted mean of its announced and silent kinds
        n_k, pb = ev["episodes_by_push_back_kind"], ev["success_by_branch"]["push_back"]
        assert sum(n_k.values()) == ev["episodes_by_branch"]["push_back"]
        assert pb == pytest.approx(
            sum(ev["success_by_push_back_kind"][k] * n for k, n in n_k.items()) / sum(n_k.values())
        )
    # the more-SFT baseline trains for the rehearsal run's wall time
    assert out["more_sft"]["wall_s"] == pytest.approx(out["modes"]["rehearsal"]["rl_wall_s"])
    real_gain = out["modes"]["real"]["eval"]["success"] - before["success"]
    if real_gain > 0:
        assert set(out["real_gain_recovered"]) == set(evals)
        for name, share in out["real_gain_recovered"].items():
            assert share == pytest.approx((evals[name]["success"] - before["success"]) / real_gain)
    else:  # no real-tools gain to share out
        assert out["real_gain_recovered"] == {}
    table = [line for line in (tmp_path / "compare.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 5  # the header; the start, three RL modes and more SFT
    assert "push-back, " in table[0] and any(line.startswith("| RL rehearsal") for line in table)
    on_disk = json.loads((tmp_path / "compare.json").read_text())
    assert on_disk["modes"]["real"]["eval"]["success"] == out["modes"]["real"]["eval"]["success"]
