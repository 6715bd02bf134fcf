"""benchmarks/train_step.py --preset qwen3_0_6b: the model shape and the step's FLOP accounting, against
numbers worked out by hand (no step is run, nothing is timed)."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.common import CONFIG, QWEN3_0_6B, forward_flops, train_step_flops
from envace_jax.models import qwen3
from tests.helpers_paths import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "train_step.py")

# Qwen3-0.6B, 4 rows x 512 tokens, the head on 1,024 (completion) positions, by hand:
#   matmul weights per layer: q 1024*2048 + k 1024*1024 + v 1024*1024 + o 2048*1024 + mlp 3*1024*3072
#                             = 2,097,152 + 1,048,576 + 1,048,576 + 2,097,152 + 9,437,184 = 15,728,640
#   28 layers: 440,401,920 weights; dense forward 2 * 2048 tokens * 440,401,920 = 1,803,886,264,320
#   head forward: 2 * 1024 positions * 1024 * 151,936 = 318,632,886,272
#   attention forward: 28 layers * (QK^T + PV) 2 * 2 * 4 rows * 512 * 512 * (16 heads * 128) = 240,518,168,576
#   forward 2,363,037,319,168; step (forward + backward of twice its work) 3 x = 7,089,111,957,504
STEP_FLOPS_4X512 = 7_089_111_957_504
# Parameters: embedding 151,936 * 1024 = 155,582,464, per layer 15,728,640 weights + 2 norms of 1024 +
# q/k norms of 128 each = 15,730,944, times 28, plus the final norm of 1024: 596,049,920 (the model card's
# "0.6B", 0.44B of it outside the embedding).
PARAMS = 596_049_920


def test_preset_is_qwen3_0_6b():
    ours = qwen3.Qwen3Config.qwen3_0_6b()
    fields = {
        "vocab_size": ours.vocab_size,
        "hidden_size": ours.hidden_size,
        "intermediate_size": ours.intermediate_size,
        "num_hidden_layers": ours.num_layers,
        "num_attention_heads": ours.num_heads,
        "num_key_value_heads": ours.num_kv_heads,
        "head_dim": ours.head_dim,
        "tie_word_embeddings": ours.tie_word_embeddings,
    }
    assert {k: QWEN3_0_6B[k] for k in fields} == fields
    assert ours.num_params() == PARAMS


def test_step_flops_of_the_preset_match_the_hand_count():
    assert train_step_flops(QWEN3_0_6B, 4, 512, head_positions=1024) == STEP_FLOPS_4X512
    # Equivalently 6 x matmul weights x tokens, plus 6 x head weights x trained positions, plus attention.
    matmul_weights = PARAMS - 151936 * 1024 - 28 * (2 * 1024 + 2 * 128) - 1024
    assert matmul_weights == 440_401_920
    attention = 3 * 240_518_168_576
    assert STEP_FLOPS_4X512 == 6 * matmul_weights * 2048 + 6 * 1024 * 151936 * 1024 + attention


def test_head_positions_default_to_every_position():
    # The head on all 8 x 512 positions of the 41.6M model (vocab 32000, hidden 512) vs on none.
    all_positions = forward_flops(CONFIG, 8, 512)
    assert all_positions == forward_flops(CONFIG, 8, 512, head_positions=8 * 512)
    assert all_positions - forward_flops(CONFIG, 8, 512, head_positions=0) == 2 * 8 * 512 * 512 * 32000


def test_script_trains_the_completions_and_counts_the_same_flops():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run(
        [sys.executable, SCRIPT, "--preset", "qwen3_0_6b", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # 4 rows of a 256-token prompt and a 256-token completion: the 256 positions that predict each
    # completion's tokens are trained.
    assert "rows 4 x 512 tokens, trained 1024, layers 28" in lines
    assert f"step FLOPs {STEP_FLOPS_4X512}" in lines


def test_compile_only_reports_both_programs_memory_without_running_them():
    # One layer of Qwen3-0.6B: embedding 151,936 x 1024 + one layer's 15,730,944 + the final norm's 1024
    # float32 weights = 171,314,432 x 4 bytes. Nothing is allocated or run, so this takes seconds.
    weights = (151936 * 1024 + 15_730_944 + 1024) * 4
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run(
        [sys.executable, SCRIPT, "--preset", "qwen3_0_6b", "--layers", "1", "--compile-only"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert f"float32 weights {weights / 1e9:.3f} GB" in r.stdout
    rows = {line.split(":")[0]: line for line in r.stdout.splitlines() if "temporaries" in line}
    assert set(rows) == {"gradient (one micro-batch)", "optimizer step"}
    # The optimizer step takes weights, two moments and the gradient, and gives back the first three in
    # place; its one parameter-sized temporary is the averaged gradient (no second copy for the skip).
    step = rows["optimizer step"]
    assert f"arguments {4 * weights / 1e9:.3f} GB" in step and f"aliased {3 * weights / 1e9:.3f} GB" in step
    temporaries = float(step.split("temporaries ")[1].split(" GB")[0]) * 1e9
    assert temporaries < 1.05 * weights
