"""benchmarks/lora_memory.py: the trained-parameter count is LoRA's formula, Adam's state is two float32 copies of
what trains, and the update's compiled memory shrinks with LoRA (at a tiny shape)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers_paths import ROOT


def test_lora_memory_figures_by_hand():
    from benchmarks.lora_memory import measure, rows
    from envace_jax.models import qwen3

    cfg = qwen3.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
    )
    tb = rows(cfg.vocab_size, 4, 64)
    full, low = measure(cfg, tb, 0, 0.0, 4), measure(cfg, tb, 2, 4.0, 4)
    D, F, L, r = 32, 48, 2, 2
    q, kv, o = 4 * 8, 2 * 8, 4 * 8
    # per layer: r x (in + out) for q, k, v, o, gate, up, down
    want = L * r * ((D + q) + 2 * (D + kv) + (o + D) + 2 * (D + F) + (F + D))
    assert low["trained"] == want
    assert full["frozen"] == 0 and low["frozen"] == full["trained"]
    assert low["opt_bytes"] - 4 * 2 * want < 64 and full["opt_bytes"] - 4 * 2 * full["trained"] < 64  # + counters
    assert low["peak"] < full["peak"]


def test_the_script_prints_its_table():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "lora_memory.py"),
            "--ranks",
            "4",
            "--rows",
            "2",
            "--length",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0] for x in lines[1:]] == ["| full", "| LoRA r=4"]
