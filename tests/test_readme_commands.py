"""README.md's "Using it" block, run as written: the commands are read out of README.md itself, so the
README and this test cannot drift apart.

The CPU commands run in order (train -> export -> load in transformers -> demo eval -> rehearsal sweep),
each reading what the one before wrote, with a few overrides appended that only make them smaller.
Every other command of the block must be listed in ``NOT_RUN`` with the reason, so a new command is
either run here or excused in writing. The commands run in an empty directory that holds only links
to ``launch/`` and ``configs/``, so a file written relative to the working directory (a stray ``runs/``)
shows up.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers_loop as h

README = os.path.join(h.ROOT, "README.md")

# (script, config) of the commands run in order; "-c" is `python -c ...`.
CHAIN = [
    ("launch/train.py", "configs/demo_cpu.py"),
    ("launch/export_hf.py", "configs/demo_cpu.py"),
    ("-c", None),
    ("launch/eval.py", "configs/eval_demo.py"),
    ("launch/eval.py", "configs/eval_rehearsal_sweep.py"),
]
# What the test appends: fewer steps, tasks and tokens; nothing that changes where things are read or written.
SMALLER = {
    ("launch/train.py", "configs/demo_cpu.py"): ["--config.total_steps=2"],
    ("launch/eval.py", "configs/eval_demo.py"): [
        "--config.demo.num_tasks=2",
        "--config.demo.max_steps=4",
        "--config.sampling.max_new_tokens=16",
        "--config.max_model_len=2048",
    ],
    ("launch/eval.py", "configs/eval_rehearsal_sweep.py"): [
        "--config.demo.num_tasks=2",
        "--config.demo.max_steps=4",
        "--config.sampling.max_new_tokens=16",
        "--config.max_model_len=2048",
        "--config.rehearsal.sweep_ns=0,1",
        "--config.rehearsal.sweep_modes=parallel",
        "--config.rehearsal.max_tokens_per_rehearsal=24",
    ],
}
NOT_RUN = {
    ("launch/train.py", "configs/envace_qwen3_8b.py"): "needs a Qwen3-8B checkpoint and a data file",
    ("launch/eval.py", "configs/eval_bfcl.py"): "needs `make eval-deps` (BFCL's data; test_eval_demo_launch runs "
    "the oracle when it is installed) or a Qwen3 checkpoint",
    ("launch/eval.py", "configs/eval_fidelity.py"): "needs the BFCL and tau2 logs of `make eval-deps`",
    ("launch/aot_compile.py", "configs/envace_qwen3_8b.py"): "compiles an 8B model (23 min); test_aot_compile "
    "compiles a tiny config",
    ("make", "aot"): "the same compile for Qwen3-32B",
    ("launch/tpu_vm/create.py", None): "has `...` placeholders; test_launch_scripts runs the pod scripts",
}


def usage_commands() -> list[list[str]]:
    """The commands of the first ```bash block under "## Using it", as argument lists (continuation
    lines joined, comments dropped)."""
    text = open(README, encoding="utf-8").read()
    section = text[text.index("\n## Using it\n") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block under ## Using it"
    return [
        shlex.split(line, comments=True)
        for line in block.group(1).replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def key(argv: list[str]) -> tuple[str, str | None]:
    if argv[0] == "make":
        return "make", argv[1]
    script = argv[1]
    config = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    return script, config


def run(argv: list[str], cwd, tmp) -> subprocess.CompletedProcess:
    argv = [sys.executable if a == "python" else a.replace("/tmp/", f"{tmp}/") for a in argv]
    return subprocess.run(
        argv + SMALLER.get(key(argv), []), cwd=cwd, env=h.env(), capture_output=True, text=True, timeout=900
    )


def sandbox(path):
    path.mkdir()
    for d in ("launch", "configs"):
        os.symlink(os.path.join(h.ROOT, d), path / d)
    return path


def test_every_usage_command_is_run_or_excused():
    keys = [key(c) for c in usage_commands()]
    assert keys[: len(CHAIN)] == CHAIN, "the CPU commands must come first, in this order"
    unknown = [k for k in keys[len(CHAIN) :] if k not in NOT_RUN]
    assert not unknown, f"README commands neither run by this test nor excused in NOT_RUN: {unknown}"


@pytest.mark.slow
def test_cpu_commands_chain_in_order(tmp_path):
    cmds = usage_commands()[: len(CHAIN)]
    cwd = sandbox(tmp_path / "cwd")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    train, export, load, evaluate, sweep = cmds

    p = run(train, cwd, tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = tmp / "run"
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["2"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir / "tb"))
    for name in ("training.png", "rewards.png", "config.json", "tokenizer/tokenizer.json"):
        assert (run_dir / name).is_file(), name

    # The figure's panels are the ones whose metrics this run logged.
    from envace_jax.rl.plots import plot_training

    keys = set().union(*records)
    want = [
        title
        for title, names in (
            ("reward", {"act/reward_mean"}),
            ("success rate", {"episode/success_frac"}),
            ("loss", {"update/loss"}),
            ("KL", {"update/ppo_kl"}),
        )
        if names <= keys
    ]
    assert want == ["reward", "success rate", "loss", "KL"]  # the loop logs all four
    assert plot_training(str(run_dir / "metrics.jsonl"), str(tmp / "again.png")) == want

    p = run(export, cwd, tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exported step 2" in p.stderr

    # Our model from the run's checkpoint (restored as a resumed run restores it) against the export.
    from envace_jax.checkpoint import Checkpointer
    from envace_jax.config import config_from_file, load_config
    from envace_jax.rl import train as rl_train
    from envace_jax.rl.types import ACT

    c = config_from_file(os.path.join(h.ROOT, "configs/demo_cpu.py"))
    c.run_dir = str(run_dir)
    cfg = load_config(c)
    _, _, trainers, policy, _ = rl_train.build_policies(cfg, None)
    with Checkpointer(str(run_dir / "checkpoints"), async_save=False) as ck:
        restored = ck.restore_latest_good({"iteration": 0, "trainers": {ACT: trainers[ACT].state_dict()}})
    assert restored.step == 2
    trainers[ACT].load_state_dict(restored.state["trainers"][ACT])
    import jax

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainers[ACT].params))

    p = run(load, cwd, tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout.split()[-1]) == n_params

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(tmp / "hf"), torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(tmp / "hf"))
    ids = np.asarray([tok("<|im_start|>user\nbook a slot on monday<|im_end|>")["input_ids"]], np.int64)
    with torch.no_grad():
        want_logits = hf(torch.from_numpy(ids)).logits.numpy()
    got = np.asarray(policy(jax.numpy.asarray(ids, jax.numpy.int32)))
    np.testing.assert_allclose(got, want_logits, rtol=2e-4, atol=2e-5)

    p = run(evaluate, cwd, tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp / "eval" / "results.json").read_text())
    assert res["categories"]["demo"]["count"] == 2
    # Progress: stage lines with seconds and the episode bar, on stderr.
    assert "eval: demo suite, policy model ..." in p.stderr
    assert re.search(r"eval: loading \S+/hf: done in \d+\.\d s", p.stderr)
    assert re.search(r"demo: 100%.*\b2/2\b", p.stderr)

    p = run(sweep, cwd, tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp / "sweep" / "results.json").read_text())
    assert list(res["categories"]) == ["parallel_n0", "parallel_n1"]
    assert (tmp / "sweep" / "sweep.md").is_file()

    assert sorted(os.listdir(cwd)) == ["configs", "launch"]  # nothing written relative to the working directory


def test_export_without_the_run_dir_fails_clearly_and_writes_nothing(tmp_path):
    """The README's export command once lacked --config.run_dir: it fell back to the config's
    runs/demo_cpu, failed there, and left that folder behind (a demo tokenizer in it)."""
    cwd = sandbox(tmp_path / "cwd")
    p = subprocess.run(
        [sys.executable, "launch/export_hf.py", "--config=configs/demo_cpu.py", f"--out_dir={tmp_path}/hf"],
        cwd=cwd,
        env=h.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode != 0
    assert "no checkpoint in runs/demo_cpu/checkpoints" in p.stderr and "--config.run_dir" in p.stderr
    assert sorted(os.listdir(cwd)) == ["configs", "launch"]
    assert not (tmp_path / "hf").exists()


def test_smoke_config_says_so():
    """configs/demo_cpu.py is the README's first command and learns nothing (reward 0 at every step of
    its random model): its docstring says so and names the learning demo."""
    doc = open(os.path.join(h.ROOT, "configs/demo_cpu.py"), encoding="utf-8").read().split('"""')[1]
    assert "smoke" in doc.lower() and "make demo" in doc
