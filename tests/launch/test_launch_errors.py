"""The launch/ commands end an expected failure with a short message and a non-zero exit, not a traceback
(envace_jax/cli/entrypoint.py); ENVACE_DEBUG=1 brings the traceback back. Each case runs the real script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests import helpers_loop as h

ROOT = h.ROOT
LAUNCH = os.path.join(ROOT, "launch")


def _entrypoint():
    from envace_jax.cli import entrypoint

    return entrypoint


def _run(script: str, *args: str, debug: bool = False, cwd: str = ROOT, **env) -> subprocess.CompletedProcess:
    e = dict(h.env(), **env)
    e.pop("ENVACE_DEBUG", None)
    if debug:
        e["ENVACE_DEBUG"] = "1"
    return subprocess.run(
        [sys.executable, os.path.join(LAUNCH, script), *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=cwd,
        timeout=600,
    )


def _short(r: subprocess.CompletedProcess, prog: str) -> list[str]:
    """The message lines (anything a library logged before them is not ours), asserting their form."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    start = [i for i, ln in enumerate(lines) if ln.startswith(f"{prog}: ")]
    assert start, r.stderr[-3000:]
    ours = lines[start[-1] :]
    assert len(ours) == 2 and "ENVACE_DEBUG=1" in ours[1], r.stderr[-3000:]
    return ours


# ----------------------------------------------------------------------------- unknown fields (no JAX)


@pytest.mark.parametrize(
    "script,args,want",
    [
        (
            "train.py",
            ["--config=configs/demo_cpu.py", "--config.optim.lrr=1e-4"],
            "--config.optim.lrr: config.optim has no field 'lrr'; did you mean --config.optim.lr?",
        ),
        (
            "export_hf.py",
            ["--config=configs/demo_cpu.py", "--config.modle.hidden_size=8", "--out_dir=/nonexistent/x"],
            "--config.modle.hidden_size: config has no field 'modle'; did you mean --config.model?",
        ),
        (
            "eval.py",
            ["--config=configs/eval_bfcl.py", "--config.bfcl.categoriez=simple_python"],
            "did you mean --config.bfcl.categories?",
        ),
        (
            "aot_compile.py",
            ["--config=configs/demo_cpu.py", "--topology=v5e:2x2", "--config.mesh.fsdpp=2"],
            "did you mean --config.mesh.fsdp?",
        ),
        ("demo.py", ["--config.rl_stepz=3", "--run_dir=/nonexistent/x"], "did you mean --config.rl_steps?"),
        ("pretrain.py", ["--set", "stepz=3", "--out=/nonexistent/x"], "did you mean --set steps=...?"),
    ],
)
def test_unknown_field_is_one_line_with_the_nearest_name(script, args, want):
    r = _run(script, *args)
    assert r.returncode == 2, r.stderr[-3000:]
    what, _ = _short(r, script)
    assert want in what
    # the same failure under ENVACE_DEBUG=1 shows where it was raised
    d = _run(script, *args, debug=True)
    assert d.returncode != 0 and "Traceback (most recent call last)" in d.stderr and want in d.stderr


def test_missing_config_file_and_a_field_the_context_ignores():
    r = _run("train.py", "--config=configs/no_such.py")
    assert r.returncode == 2
    assert "--config=configs/no_such.py: no such file 'configs/no_such.py'" in _short(r, "train.py")[0]
    # data.path without a source that reads it: the demo tasks would be trained on without a word
    r = _run("train.py", "--config=configs/demo_cpu.py", "--config.data.path=/data/cm2.jsonl")
    assert r.returncode == 2
    assert "config.data.path='/data/cm2.jsonl' is never read with config.data.source='demo'" in _short(r, "train.py")[0]


# ----------------------------------------------------------------------------- failures while running


def _tiny_hf(path: str) -> str:
    """A tiny transformers Qwen3 saved as one model.safetensors (vocabulary >= the demo tokenizer's)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def test_truncated_weights_file(tmp_path):
    hf = _tiny_hf(str(tmp_path / "hf"))
    weights = os.path.join(hf, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    args = [
        "--config=configs/demo_cpu.py",
        f"--config.run_dir={tmp_path / 'run'}",
        f"--config.model.hf_path={hf}",
        f"--config.tokenizer.path={h.tokenizer_dir()}",
    ]
    r = _run("train.py", *args)
    assert r.returncode == 1, r.stderr[-3000:]
    what, todo = _short(r, "train.py")
    assert what.startswith("train.py: bad weights file: ") and "safetensors" in what
    assert "copy or export the weights again" in todo
    d = _run("train.py", *args, debug=True)
    assert d.returncode == 1 and "Traceback (most recent call last)" in d.stderr


def test_disk_full(tmp_path):
    # The run's first write, config.json, goes to /dev/full: every write there fails with ENOSPC.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").symlink_to("/dev/full")
    args = [f"--config={ROOT}/configs/demo_cpu.py", *h.tiny_overrides(str(run_dir), 1)]
    r = _run("train.py", *args)
    assert r.returncode == 1, r.stderr[-3000:]
    what, todo = _short(r, "train.py")
    assert what.startswith("train.py: disk full") and "No space left on device" in what
    assert "free space on that disk or write elsewhere" in todo
    d = _run("train.py", *args, debug=True)
    assert d.returncode == 1 and "Traceback (most recent call last)" in d.stderr
    assert "OSError: [Errno 28] No space left on device" in d.stderr


def test_checkpoint_of_another_shape(tmp_path):
    from envace_jax.checkpoint import Checkpointer
    from envace_jax.config import config_from_file, load_config
    from envace_jax.rl import train as rl_train
    from envace_jax.rl.types import ACT

    run_dir = str(tmp_path / "run")
    c = config_from_file(os.path.join(ROOT, "configs", "demo_cpu.py"))
    c.run_dir, c.tokenizer.path = run_dir, h.tokenizer_dir()
    _, _, trainers, _, _ = rl_train.build_policies(load_config(c), None)
    with Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False) as ck:
        ck.save(1, {"iteration": 1, "trainers": {ACT: trainers[ACT].state_dict()}}, {"note": "test"})
    # the run was written with hidden_size 64 (demo_cpu); export it with 32
    r = _run(
        "export_hf.py",
        f"--config={ROOT}/configs/demo_cpu.py",
        f"--config.run_dir={run_dir}",
        f"--config.tokenizer.path={h.tokenizer_dir()}",
        "--config.model.hidden_size=32",
        f"--out_dir={tmp_path / 'hf'}",
    )
    assert r.returncode == 2, r.stderr[-3000:]
    what, todo = _short(r, "export_hf.py")
    assert f"the checkpoint in {run_dir}/checkpoints holds an array of shape" in what
    assert "where this config builds" in what and "32" in what and "64" in what
    assert "--config.model.* must match" in todo


def test_missing_executable_in_a_cluster_script(tmp_path):
    # Not a dry run, and no gcloud on PATH: one line naming the missing program.
    r = subprocess.run(
        [sys.executable, os.path.join(LAUNCH, "tpu_vm", "create.py"), "--name=x", "--zone=z", "--accelerator=v5p-8"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PATH=str(tmp_path)),
    )
    assert r.returncode == 1
    assert _short(r, "create.py")[0] == "create.py: not found: gcloud (No such file or directory)"
    # --verbose: the exception itself, with its traceback
    v = subprocess.run(
        [
            sys.executable,
            os.path.join(LAUNCH, "tpu_vm", "create.py"),
            "--name=x",
            "--zone=z",
            "--accelerator=v5p-8",
            "--verbose",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PATH=str(tmp_path)),
    )
    assert v.returncode == 1 and "Traceback (most recent call last)" in v.stderr
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'gcloud'" in v.stderr


# ----------------------------------------------------------------------------- accelerator-plugin noise

LIBTPU_NOISE = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "InitGoogle")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed (make aot-deps)")
def test_cpu_host_prints_no_libtpu_noise(tmp_path):
    e = {k: v for k, v in h.env().items() if k != "JAX_PLATFORMS" and not k.startswith("TPU_")}
    e["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # another test's libtpu may hold the machine-wide lock
    if _entrypoint().visible_accelerator() is not None:
        pytest.skip("this host has an accelerator: JAX is meant to try it")
    # What a plain JAX start prints on this host with libtpu installed (so the check below can fail) ...
    plain = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True, env=e, timeout=300
    )
    assert any(n in plain.stderr for n in LIBTPU_NOISE), plain.stderr
    # ... and a launch command that initialises JAX (it builds the policy, then finds no checkpoint).
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(LAUNCH, "export_hf.py"),
            f"--config={ROOT}/configs/demo_cpu.py",
            f"--config.run_dir={tmp_path}/empty",
            f"--config.tokenizer.path={h.tokenizer_dir()}",
            f"--out_dir={tmp_path}/hf",
        ],
        capture_output=True,
        text=True,
        env=e,
        timeout=600,
    )
    assert r.returncode == 1 and "no checkpoint in" in r.stderr, r.stderr[-3000:]
    assert not any(n in r.stderr for n in LIBTPU_NOISE), r.stderr[-3000:]


def _fake_root(tmp_path, pci: dict[str, tuple[str, str]] = (), dev: tuple[str, ...] = ()) -> str:
    for slot, (vendor, klass) in dict(pci).items():
        d = tmp_path / "sys" / "bus" / "pci" / "devices" / slot
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    for name in dev:
        p = tmp_path / "dev" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    return str(tmp_path)


def test_platform_left_to_jax_where_an_accelerator_is_visible_or_chosen(tmp_path):
    ep = _entrypoint()
    gvnic = {"0000:00:04.0": ("0x1ae0", "0x020000")}  # Google's virtual NIC: not a TPU
    tpu_chip = {"0000:00:05.0": ("0x1ae0", "0x120000")}  # a TPU chip: Google vendor, accelerator class
    cases = [
        (_fake_root(tmp_path / "cpu", gvnic), None),
        (_fake_root(tmp_path / "tpu", {**gvnic, **tpu_chip}), "tpu"),
        (_fake_root(tmp_path / "accel", dev=("accel0",)), "tpu"),
        (_fake_root(tmp_path / "vfio", dev=("vfio/0",)), "tpu"),
        (_fake_root(tmp_path / "gpu", dev=("nvidia0", "nvidiactl")), "gpu"),
    ]
    for root, want in cases:
        assert ep.visible_accelerator(root) == want, root
        env = {}
        assert ep.quiet_cpu_host(env, root) == (want is None)
        assert env == ({"JAX_PLATFORMS": "cpu"} if want is None else {})
    cpu = cases[0][0]
    for chosen in ({"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": "tpu"}, {"TPU_NAME": "pod"}):
        env = dict(chosen)
        assert not ep.quiet_cpu_host(env, cpu) and env == chosen
