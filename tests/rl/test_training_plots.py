"""rl/plots.py: a panel per logged quantity, named by the metrics present (a real run's metrics are
plotted in tests/test_readme_commands.py; these cover what that run does not log)."""

from __future__ import annotations

import json

from envace_jax.rl.plots import PANELS, panel_series, plot_training


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_run_without_updates_gets_only_the_rollout_panels(tmp_path):
    jsonl = _write(
        tmp_path / "m.jsonl", [{"step": s, "act/reward_mean": 0.1 * s, "episode/success_frac": 0.5} for s in (1, 2, 3)]
    )
    assert plot_training(jsonl, str(tmp_path / "t.png")) == ["reward", "success rate"]
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_separate_trainers_get_a_curve_per_role_and_the_reference_kl(tmp_path):
    recs = [
        {
            "step": 1,
            "update_act/loss": 0.5,
            "update_rehearse/loss": 0.25,
            "update_act/ppo_kl": 0.01,
            "update_act/kl": 0.02,
            "update_act/logp_mismatch/act": 1.0,
        },
        {"step": 2, "update_act/loss": None, "update_rehearse/loss": 0.5},
    ]  # None: a NaN the writer kept
    by_title = {p.title: p for p in PANELS}
    loss = panel_series(recs, by_title["loss"])
    assert [(label, xs, ys) for label, xs, ys in loss] == [
        ("total (act)", [1], [0.5]),
        ("total (rehearse)", [1, 2], [0.25, 0.5]),
    ]
    assert [s[0] for s in panel_series(recs, by_title["KL"])] == ["to sampler (ppo_kl) (act)", "to reference (act)"]
    assert plot_training(_write(tmp_path / "m.jsonl", recs), str(tmp_path / "t.png")) == ["loss", "KL"]


def test_nothing_plottable_writes_no_file(tmp_path):
    jsonl = _write(tmp_path / "m.jsonl", [{"step": 1, "time/step_s": 3.0}])
    assert plot_training(jsonl, str(tmp_path / "t.png")) == []
    assert not (tmp_path / "t.png").exists()
