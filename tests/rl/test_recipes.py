"""The objectives by name (rl/recipes.py): what each recipe sets in a run's config, the configs/ files built on
them, and the demo running DAPO (dynamic sampling and the overlong penalty in a real run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envace_jax.config import base_config, config_from_file, load_config
from envace_jax.rl.recipes import ALGORITHMS, apply_to_config, recipe
from tests.helpers_paths import ROOT, demo_env


def test_each_recipe_sets_its_papers_knobs():
    assert recipe("grpo", 64, 64).loss == {} and recipe("grpo", 64, 64).rl == {}
    g = recipe("gspo", 64, 64).loss
    assert (g["ratio_level"], g["clip_low"], g["clip_high"], g["dual_clip"]) == ("sequence", 3e-4, 4e-4, None)
    d = recipe("dapo", 100, 40)
    assert (d.loss["clip_low"], d.loss["clip_high"], d.loss["agg"]) == (0.2, 0.28, "token_mean")
    # the buffer is a fifth of the shortest budget (it must fit in each); Dr. GRPO's constant is the longest
    assert d.rl == {"dynamic_sampling": True, "overlong_buffer": 8, "overlong_penalty": 1.0}
    assert recipe("dr_grpo", 100, 40).loss == {"agg": "seq_mean_token_sum_norm", "agg_norm": 100.0}
    with pytest.raises(ValueError, match="unknown RL algorithm 'ppo'"):
        recipe("ppo", 64)
    with pytest.raises(ValueError, match="budgets must be ints >= 1"):
        recipe("dapo", 0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_recipes_make_valid_configs_and_keep_the_other_knobs(name):
    c = base_config()
    c.rollout.act.max_new_tokens, c.rollout.rehearse.max_new_tokens = 500, 300
    c.optim.lr = 3e-6
    e = load_config(apply_to_config(c, name))
    assert e.optim.lr == 3e-6 and e.rollout.act.max_new_tokens == 500
    r = recipe(name, 500, 300)
    for k, v in r.loss.items():
        assert getattr(e.loss, k) == v
    for k, v in r.rl.items():
        assert getattr(e.rl, k) == v


@pytest.mark.parametrize("name", ["gspo", "dapo", "dr_grpo"])
def test_config_files(name):
    e = load_config(config_from_file(os.path.join(ROOT, "configs", f"{name}.py")))
    base = load_config(config_from_file(os.path.join(ROOT, "configs", "envace_qwen3_8b.py")))
    assert e.name == name and e.model == base.model and e.optim == base.optim
    assert e.loss != base.loss
    if name == "dapo":
        assert e.rl.dynamic_sampling and e.rl.overlong_buffer == 1600 and e.rl.max_staleness == 0
    else:
        assert e.rl.max_staleness == base.rl.max_staleness


def test_the_demo_puts_objectives_side_by_side(tmp_path):
    """launch/demo.py --compare_algorithms: each objective's RL from the same start, one table with a row per
    objective and the paired comparisons against the start and against GRPO; DAPO's row counts its extra rollouts."""
    env = demo_env()
    run_dir = tmp_path / "alg"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "launch", "demo.py"),
        f"--config={ROOT}/configs/demo.py:reduced",
        "--compare_algorithms=grpo,dapo",
        f"--run_dir={run_dir}",
        "--no_progress",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((run_dir / "algorithms.json").read_text())
    steps, prompts = 2, 2  # the reduced preset
    assert set(out["algorithms"]) == {"grpo", "dapo"}
    assert out["algorithms"]["grpo"]["prompts_sampled"] == steps * prompts
    assert out["algorithms"]["dapo"]["prompts_sampled"] >= steps * prompts
    labels = [p["label"] for p in out["paired"]]
    assert labels == ["GRPO vs the start", "DAPO vs the start", "DAPO vs GRPO"]
    text = (run_dir / "algorithms.md").read_text()
    assert "| GRPO " in text and "| DAPO " in text and "DAPO vs GRPO" in text
    # DAPO's steps report their dynamic-sampling rounds: the first and at most 3 more
    lines = [json.loads(x) for x in (run_dir / "metrics_rl_dapo.jsonl").read_text().splitlines()]
    assert len(lines) == steps
    for m in lines:
        assert 1 <= m["dynamic/rounds"] <= 4 and m["dynamic/prompts_kept"] <= prompts
    assert not any("dynamic/rounds" in x for x in (run_dir / "metrics_rl_grpo.jsonl").read_text().splitlines())
