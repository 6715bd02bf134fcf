"""benchmarks/moe_model.py runs end to end at a toy width (--small): both sides in their own processes, the table,
the JSON, and the same greedy tokens from ours and transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers_paths import ROOT


def test_moe_model_benchmark_runs_both_sides(tmp_path):
    out = tmp_path / "moe.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "moe_model.py"), "--small", "--rounds", "1"]
    cmd += ["--reps", "1", "--layers", "2", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| update |" in r.stdout and "not a result" in r.stdout
    res = json.loads(out.read_text())
    assert res["greedy_equal"] is True
    for side in ("ours", "hf"):
        assert all(res["medians"][side][w] > 0 for w in ("forward", "update", "sampler"))
