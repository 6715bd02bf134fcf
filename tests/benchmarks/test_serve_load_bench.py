"""benchmarks/serve_load.py runs end to end at a toy size and counts every answer (not a result: a check that the
script keeps working)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_serve_load_script_answers_every_request(tmp_path):
    out = tmp_path / "load.json"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "serve_load.py"),
        "--clients",
        "1,3",
        "--requests",
        "5",
        "--max-tokens",
        "4",
        "--max-rows",
        "4",
        "--out",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["clients"] for r in rows] == [1, 3]
    assert all(r["good_200"] == 5 and r["bad_4xx"] == r["bad_sent"] for r in rows)
    assert "| clients | requests/s |" in p.stdout
