"""Demo suite (oracle through the rule judge; a tiny random model with rehearsal) and launch/eval.py
end to end in a subprocess with --config overrides."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envace_jax.eval import demo_eval
from envace_jax.eval.config import DemoSuiteConfig
from envace_jax.eval.results import load_results
from envace_jax.eval.runner import run_eval
from tests.helpers_paths import ROOT


def test_demo_oracle_passes_every_checklist():
    tasks = demo_eval.load_tasks(DemoSuiteConfig(num_tasks=20))
    r = demo_eval.evaluate_oracle(tasks)
    assert r.count == 20 and r.valid == 20 and r.extra["score_mean"] == pytest.approx(1.0)


def test_demo_tiny_model_with_rehearsal_and_sweep(tmp_path):
    base = {
        "suite": "demo",
        "policy": "model",
        "output_dir": str(tmp_path / "one"),
        "model": {"random_tiny": True, "tiny": {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 8}},
        "sampling": {"temperature": 1.0, "max_new_tokens": 12},
        "max_model_len": 2048,
        "demo": {"num_tasks": 2, "max_steps": 6},
        "rehearsal": {"n": 1, "mode": "sequential", "max_tokens_per_rehearsal": 24},
    }
    res = run_eval(base)
    (row,) = res["categories"].values()
    assert row["count"] == 2 and row["extra_generated_tokens_mean"] > 0  # rehearsal really generated
    sweep = dict(
        base,
        suite="rehearsal_sweep",
        output_dir=str(tmp_path / "sweep"),
        rehearsal={"sweep_ns": "0,1", "sweep_modes": "parallel,sequential", "max_tokens_per_rehearsal": 24},
        model=dict(base["model"], tokenizer_path=str(tmp_path / "one" / "demo_tokenizer")),
    )
    res = run_eval(sweep)
    assert list(res["categories"]) == ["parallel_n0", "parallel_n1", "sequential_n0", "sequential_n1"]
    assert res["categories"]["parallel_n0"]["extra_generated_tokens_mean"] == 0
    assert res["categories"]["parallel_n1"]["extra_generated_tokens_mean"] > 0
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert md.count("\n| ") == 4 and "| sequential | 1 | always: 100% | 2 |" in md


def _launch(*args):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "eval.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )


def test_launch_eval_end_to_end_with_overrides(tmp_path):
    pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")
    out = tmp_path / "bfcl"
    p = _launch(
        "--config=configs/eval_bfcl.py",
        f"--config.output_dir={out}",
        "--config.bfcl.categories=multi_turn_base,simple_python",
        "--config.bfcl.limit=3",
    )
    assert p.returncode == 0, p.stderr[-2000:]
    res = load_results(str(out))
    assert set(res["categories"]) == {"multi_turn_base", "simple_python"}
    assert all(r["count"] == 3 and r["valid"] == 3 and r["accuracy"] == 1.0 for r in res["categories"].values())
    assert res["config"]["bfcl"]["limit"] == 3
    assert "| multi_turn_base | 3 | 3 | 1.000 |" in (out / "results.md").read_text()
    assert len((out / "simple_python.jsonl").read_text().splitlines()) == 3
    bad = _launch(
        "--config=configs/eval_bfcl.py",
        f"--config.output_dir={tmp_path / 'x'}",
        "--config.bfcl.categories=multi_turn_nope",
    )
    assert bad.returncode == 2 and "config.bfcl.categories" in bad.stderr and "multi_turn_nope" in bad.stderr
