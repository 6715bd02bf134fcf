"""benchmarks/real_shape_step.py at its tiny preset: a random checkpoint folder with the official Qwen3
tokenizer goes through the training path (build_run, one RL step, save_hf), and the export matches
transformers. The official tokenizer files come from `make qwen3-files` (or $ENVACE_QWEN3_DIR), through
the qwen3_official fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers_paths import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "real_shape_step.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=900)


def test_missing_tokenizer_files_name_the_make_target(tmp_path):
    empty = tmp_path / "no_tokenizer"
    empty.mkdir()
    (empty / "tokenizer.json").write_text("{}")  # one of the two files only
    env = {k: v for k, v in os.environ.items() if k != "ENVACE_QWEN3_DIR"}
    r = _run("--preset", "tiny", "--out", str(tmp_path / "out"), "--tokenizer_dir", str(empty), env=env)
    assert r.returncode != 0
    assert "make qwen3-files" in r.stderr and str(empty) in r.stderr and "tokenizer_config.json" in r.stderr
    assert "'tokenizer.json'" not in r.stderr.split("are not in")[0]  # only the missing file is named
    # The environment variable is the next place looked at.
    r = _run("--preset", "tiny", "--out", str(tmp_path / "out"), env=dict(env, ENVACE_QWEN3_DIR=str(empty)))
    assert r.returncode != 0 and "make qwen3-files" in r.stderr and str(empty) in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tiny_step_exports_a_folder_transformers_reads_with_the_same_logits(tmp_path, qwen3_official):
    tok_dir = qwen3_official  # the conftest fixture: fails under `make test` when the files are absent
    out = tmp_path / "rs"
    r = _run(
        "--preset",
        "tiny",
        "--out",
        str(out),
        "--tokenizer_dir",
        tok_dir,
        "--prompts",
        "2",
        "--group",
        "2",
        "--max_new_tokens",
        "8",
        "--compare_rows",
        "2",
        "--compare_tokens",
        "48",
        "--lr",
        "1e-4",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())

    # The rollouts ran on the official tokenizer: 2 prompts x 2 rollouts, one ACT row each at least, every
    # reply cut at 8 tokens (random weights never stop), and the trainer took the rows.
    act = [row for row in s["rows"] if row["role"] == "act"]
    assert len(act) >= 4 and all(row["generated_tokens"] <= 8 for row in act)
    assert s["metrics"]["episode/count"] == 4 and s["metrics"]["update/rows"] == len(s["rows"])
    assert s["metrics"]["update/optimizer_steps"] == 1

    # transformers (the independent reference) loads the export: same logits as our updated model, the
    # official chat template, and that template renders the first prompt to the ids the sampler was given.
    p = s["parity"]
    assert p["architecture"] == "Qwen3ForCausalLM"
    assert p["max_abs_diff"] <= 1e-4 and p["logit_scale"] > 0.1
    assert p["official_template"] and p["prompt_ids_match"]
    # lr 1e-4: AdamW's weight decay rewrote the weights, so the export holds the update's output.
    assert p["changed_frac"] > 0.5 and 0 < p["max_abs_change"] < 1e-3

    export = out / "export"
    for name in TOKENIZER_FILES:
        assert (export / name).read_bytes() == open(os.path.join(tok_dir, name), "rb").read()
    cfg = json.loads((export / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["tie_word_embeddings"]) == (151936, 2, True)

    # Every phase was timed and its memory read; the markdown table is printed.
    names = [ph["name"] for ph in s["phases"]]
    for want in (
        "build run (rl.train.build_run)",
        "rollouts (rehearsal mode)",
        "old log-probs",
        "GRPO update (forward + backward + AdamW)",
        "export (hf_io.save_hf + tokenizer files)",
    ):
        assert want in names
    for ph in s["phases"]:
        assert ph["seconds"] >= 0
        assert ph["peak_gib"] is None or ph["peak_gib"] > 0.01
    # The sampled phase peaks never exceed the kernel's high-water mark of the process (small slack: the
    # two are read at different moments of the same pages).
    assert s["ru_maxrss_gib"] >= s["own_peak_gib"] >= max(ph["peak_gib"] or 0 for ph in s["phases"]) - 0.05
    assert 0.1 < s["child_peak_gib"] < s["own_peak_gib"] + 2
    assert "| phase | seconds | peak RSS GiB |" in r.stdout
