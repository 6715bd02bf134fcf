"""TPU VM and GPU launch scripts in --dry-run: the exact commands they would run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from tests.helpers_paths import ROOT


def _dry(script: str, *args: str) -> list[list[str]]:
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PATH="/nonexistent"),
    )  # nothing can run for real
    assert r.returncode == 0, r.stderr
    return [shlex.split(line) for line in r.stdout.splitlines() if line.strip()]


def test_tpu_create():
    cmds = _dry(
        "tpu_vm/create.py",
        "--name=pod",
        "--zone=us-east5-a",
        "--project=p1",
        "--accelerator=v5p-32",
        "--spot",
        "--dry-run",
    )
    assert cmds == [
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            "pod",
            "--accelerator-type=v5p-32",
            "--version=tpu-ubuntu2204-base",
            "--zone=us-east5-a",
            "--project=p1",
            "--spot",
        ]
    ]


def test_tpu_setup_installs_on_every_worker():
    cmds = _dry("tpu_vm/setup.py", "--name=pod", "--zone=z1", "--source=/src/repo", "--dry-run")
    assert cmds[0] == [
        "tar",
        "--exclude=.venv",
        "--exclude=runs",
        "--exclude=.git",
        "-czf",
        "/tmp/envace-jax.tar.gz",
        "-C",
        "/src/repo",
        ".",
    ]
    assert cmds[1] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "scp",
        "/tmp/envace-jax.tar.gz",
        "pod:/tmp/envace-jax.tar.gz",
        "--worker=all",
        "--zone=z1",
    ]
    assert cmds[2][:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--worker=all"]
    remote = cmds[2][7]
    assert remote.startswith("--command=mkdir -p ~/envace-jax && tar -xzf /tmp/envace-jax.tar.gz -C ~/envace-jax")
    assert "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'" in remote


def test_tpu_run_starts_same_command_on_all_workers():
    cmds = _dry(
        "tpu_vm/run.py",
        "--name=pod",
        "--zone=z1",
        "--config=configs/envace_qwen3_8b.py",
        "--dry-run",
        "--",
        "--config.model.hf_path=/mnt/Qwen3 8B",
        "--config.seed=3",
    )
    assert len(cmds) == 1
    cmd = cmds[0]
    assert cmd[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod", "--worker=all"]
    assert cmd[-1] == "--zone=z1"
    remote = cmd[7].removeprefix("--command=")
    assert remote.startswith("cd ~/envace-jax && ENVACE_AUTO_DISTRIBUTED=1 nohup ")
    train = shlex.split(remote.split("nohup ", 1)[1].split(" > ", 1)[0])
    assert train == [
        ".venv/bin/python",
        "launch/train.py",
        "--config=configs/envace_qwen3_8b.py",
        "--config.model.hf_path=/mnt/Qwen3 8B",
        "--config.seed=3",
    ]
    assert remote.endswith("> train.log 2>&1 &")


def test_gpu_create_setup_run():
    cmds = _dry("gpu/create.py", "--name=g", "--zone=us-central1-a", "--count=2", "--dry-run")
    assert [c[4] for c in cmds] == ["g-0", "g-1"]
    assert all("--accelerator=type=nvidia-h100-80gb,count=8" in c for c in cmds)

    cmds = _dry("gpu/setup.py", "--hosts=h0,h1", "--source=/src/repo", "--dry-run")
    assert cmds == [
        [
            "rsync",
            "-az",
            "--delete",
            "--exclude=.venv",
            "--exclude=runs",
            "--exclude=.git",
            "/src/repo/",
            "h0:~/envace-jax/",
        ],
        ["ssh", "h0", "cd ~/envace-jax && python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[gpu]'"],
        [
            "rsync",
            "-az",
            "--delete",
            "--exclude=.venv",
            "--exclude=runs",
            "--exclude=.git",
            "/src/repo/",
            "h1:~/envace-jax/",
        ],
        ["ssh", "h1", "cd ~/envace-jax && python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[gpu]'"],
    ]

    cmds = _dry(
        "gpu/run.py", "--hosts=h0,h1", "--config=configs/c.py", "--port=9000", "--dry-run", "--", "--config.seed=1"
    )
    assert [c[:2] for c in cmds] == [["ssh", "h0"], ["ssh", "h1"]]
    for i, c in enumerate(cmds):
        train = shlex.split(c[2].split("nohup ", 1)[1].split(" > ", 1)[0])
        assert train == [
            ".venv/bin/python",
            "launch/train.py",
            "--config=configs/c.py",
            "--coordinator=h0:9000",
            "--num_processes=2",
            f"--process_id={i}",
            "--config.seed=1",
        ]
        assert c[2].startswith("cd ~/envace-jax && nohup ") and c[2].endswith(f"> train_{i}.log 2>&1 &")


def test_gpu_run_on_one_machine_uses_local_shells():
    cmds = _dry("gpu/run.py", "--hosts=localhost,localhost", "--config=configs/demo_cpu.py", "--dry-run")
    assert [c[:2] for c in cmds] == [["bash", "-c"]] * 2
    assert all("--coordinator=127.0.0.1:8476" in c[2] and f"--process_id={i}" in c[2] for i, c in enumerate(cmds))
    assert all(c[2].startswith(f"cd {ROOT} && ") for c in cmds)


def test_missing_required_flag_fails():
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "tpu_vm", "create.py"), "--name=x", "--zone=z", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "--accelerator" in r.stderr


# ----------------------------------------------------------------------------- the docstrings' examples

CLUSTER_SCRIPTS = sorted(
    os.path.join(d, f)
    for d in ("tpu_vm", "gpu")
    for f in os.listdir(os.path.join(ROOT, "launch", d))
    if f.endswith(".py")
)


def _examples(script: str) -> list[list[str]]:
    """The ``python launch/...`` command lines of a script's docstring, continuation lines joined and the
    optional ``[...]`` parts included."""
    import ast

    with open(os.path.join(ROOT, "launch", script)) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    out, cur = [], None
    for line in doc.splitlines():
        s = line.strip()
        if cur is None and s.startswith("python launch/"):
            cur = ""
        if cur is not None:
            cur += " " + s.rstrip("\\")
            if not s.endswith("\\"):
                out.append(shlex.split(cur.replace("[", " ").replace("]", " ")))
                cur = None
    return out


def _fake_tools(tmp_path) -> tuple[dict, str]:
    """A PATH holding only stand-ins for the programs the scripts start; each records that it ran."""
    bin_dir, log = tmp_path / "bin", tmp_path / "ran.log"
    bin_dir.mkdir()
    for tool in ("gcloud", "ssh", "scp", "rsync", "tar", "bash", "sh"):
        p = bin_dir / tool
        p.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        p.chmod(0o755)
    return dict(os.environ, PATH=str(bin_dir)), str(log)


def _variants(argv: list[str]) -> list[list[str]]:
    """The example in dry-run mode as written (``--dry-run`` appended when it shows none), and with
    ``--dry-run`` after ``--`` (where the docstrings of run.py used to show it)."""
    own = [a for a in argv if a != "--dry-run"]
    out = [argv if "--dry-run" in argv else own + ["--dry-run"]]
    if "--" in own:
        out.append(own + ["--dry-run"])
    return out


def test_every_docstring_example_runs_nothing_in_dry_run(tmp_path):
    env, log = _fake_tools(tmp_path)
    seen = 0
    for script in CLUSTER_SCRIPTS:
        for example in _examples(script):
            assert example[:2] == ["python", f"launch/{script}"], example
            for argv in _variants(example[2:]):
                r = subprocess.run(
                    [sys.executable, os.path.join(ROOT, "launch", script), *argv],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=env,
                    cwd=ROOT,
                )
                assert r.returncode == 0, (script, argv, r.stderr)
                assert not os.path.exists(log), (script, argv, open(log).read())
                printed = [shlex.split(ln) for ln in r.stdout.splitlines() if ln.strip()]
                assert printed and all(c[0] in ("gcloud", "ssh", "rsync", "tar", "bash") for c in printed)
                assert not any("--dry-run" in " ".join(c) for c in printed), (script, argv, printed)
                seen += 1
    # create/setup/run of both families; run.py's examples also with --dry-run after --
    assert seen >= 8, seen
    # The stand-ins do record a real run (so the check above can fail).
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "tpu_vm", "run.py"),
            "--name=pod",
            "--zone=z1",
            "--config=configs/demo_cpu.py",
            "--",
            "--config.seed=1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert open(log).read().startswith("gcloud compute tpus tpu-vm ssh pod --worker=all --command=")
