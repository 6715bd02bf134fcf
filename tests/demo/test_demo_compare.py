"""`make demo-compare` (demo.pipeline.run_compare) at the reduced preset: every RL mode from one start (real
tools, frozen simulator, no sharing, world rehearsal), more SFT for the rehearsal run's wall time, one table with
the share of the real-tools gain each recovers, and the paired table of each arm against the start."""

import json

import pytest

from envace_jax.demo import arms
from envace_jax.demo.config import reduced
from envace_jax.demo.pipeline import run_compare
from envace_jax.eval import paired


def test_compare_runs_every_mode_from_one_start_and_states_each_share_of_the_real_gain(tmp_path):
    out = run_compare(reduced(), str(tmp_path), progress=False)
    assert set(out["modes"]) == {"real", "simulator", "noshare", "rehearsal"}
    before = out["before"]["eval"]
    evals = {arms.MODE_LABELS[m]: v["eval"] for m, v in out["modes"].items()} | {"more SFT": out["more_sft"]["eval"]}
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
    # the header and the start, four RL modes and more SFT; then the paired table's header and its rows
    assert len(table) == 1 + 6 + 1 + len(arms.COMPARE_PAIRS)
    assert "push-back, " in table[0] and any(line.startswith("| RL, no sharing (two models)") for line in table)
    # every arm kept its per-task outcomes, on the same tasks; the paired rows are computed from them
    found = paired.find_arms(str(tmp_path))
    assert set(found) == {"before", "more_sft"} | {arms.compare_arm(m) for m in arms.COMPARE_MODES}
    outcomes = {a: paired.read_outcomes(p) for a, p in found.items()}
    assert len({frozenset(o.uid for o in v) for v in outcomes.values()}) == 1
    assert [(r["a"], r["b"]) for r in out["paired"]] == [(a, b) for _, a, b in arms.COMPARE_PAIRS]
    for r in out["paired"]:
        want = paired.compare(outcomes[r["a"]], outcomes[r["b"]], r["a"], r["b"])
        assert paired.PairedResult.from_dict(r) == want
        line = next(x for x in table if x.startswith(f"| {r['label']} "))
        assert [c.strip() for c in line.strip().strip("|").split("|")] == paired.paired_row(r["label"], want)
        assert want.success_a == pytest.approx(sum(o.success for o in outcomes[r["a"]]) / before["episodes"])
    # no sharing: REHEARSE rows went to a second trainer (the simulator copy's), ACT rows to the policy's
    noshare = [json.loads(x) for x in (tmp_path / "metrics_rl_noshare.jsonl").read_text().splitlines()]
    assert all(
        any(k.startswith("update_rehearse/") for k in m) and any(k.startswith("update_act/") for k in m)
        for m in noshare
    )
    on_disk = json.loads((tmp_path / "compare.json").read_text())
    assert on_disk["modes"]["real"]["eval"]["success"] == out["modes"]["real"]["eval"]["success"]


def test_noshare_trains_a_second_model_for_rehearse_and_its_fidelity_is_measured(tmp_path, monkeypatch):
    """Under ``noshare`` REHEARSE is a second model, copied from the start and trained apart from the policy
    (here by the replay batch of REHEARSE rows); the evaluation after that run measures REHEARSE fidelity on
    that model, and the policy's real-tool episodes on the policy."""
    import jax
    import numpy as np

    from envace_jax.demo import stages
    from envace_jax.demo.pipeline import Demo

    cfg = reduced().replace(rl_steps=1, test_tasks=4, fidelity_tasks=2, rl_replay_roles="rehearse")
    d = Demo(cfg, str(tmp_path), progress=False)
    d.prepare()
    d.sft()
    start = jax.tree.leaves(d.sft_params)
    d.rl("noshare", tag="rl_noshare")
    sim = d.rehearse_model
    assert sim is not None and sim is not d.model
    leaves = lambda m: [np.asarray(x) for x in jax.tree.leaves(stages.snapshot(m))]
    # the replay batch (REHEARSE rows only) moved the REHEARSE model away from the start, and not the policy
    # onto the same weights
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(sim), start))
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(sim), leaves(d.model)))
    seen = {}

    def recording(name, fn):
        def wrapped(c, model, *args, **kw):
            seen[name] = model
            return fn(c, model, *args, **kw)

        return wrapped

    monkeypatch.setattr(stages, "evaluate_real", recording("real", stages.evaluate_real))
    monkeypatch.setattr(stages, "evaluate_fidelity", recording("fidelity", stages.evaluate_fidelity))
    d.evaluate("after_noshare")
    assert seen == {"real": d.model, "fidelity": sim}
    d.more_sft(0.0)
    assert d.rehearse_model is None
