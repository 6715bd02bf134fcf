"""Every launch/ program runs as a module from the repository root (``python -m launch.train``) as well as a file
(``python launch/train.py``), with the same flags and the same messages (launch/__init__.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests import helpers_loop as h

MAINS = ["train", "eval", "export_hf", "pretrain", "demo", "aot_compile", "paired_stats", "serve"]
ABSL = {
    "train",
    "eval",
    "export_hf",
    "demo",
    "aot_compile",
    "paired_stats",
}  # the absl mains; pretrain, serve and the cluster scripts: argparse
CLUSTER = [f"{where}.{name}" for where in ("gpu", "tpu_vm") for name in ("create", "setup", "run")]


def _python(*args: str) -> subprocess.CompletedProcess:
    env = dict(h.env())
    env.pop("ENVACE_DEBUG", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=h.ROOT, timeout=300)


def test_every_program_is_listed():
    files = {n[:-3] for n in os.listdir(os.path.join(h.ROOT, "launch")) if n.endswith(".py")}
    assert files - {"__init__", "command_runner"} == set(MAINS)
    for where in ("gpu", "tpu_vm"):
        names = {n[:-3] for n in os.listdir(os.path.join(h.ROOT, "launch", where)) if n.endswith(".py")}
        assert names - {"__init__", "hosts", "_common"} == {"create", "setup", "run"}


@pytest.mark.parametrize("module", MAINS + CLUSTER)
def test_help_as_a_module(module):
    path = os.path.join(h.ROOT, "launch", *module.split(".")) + ".py"
    main = os.path.join(h.ROOT, "envace_jax", "cli", f"{module}.py")  # a launch/ wrapper runs the main there
    path = main if os.path.exists(main) else path
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    r = _python("-m", f"launch.{module}", "--help")
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == (1 if module in ABSL else 0), r.stderr[-3000:]  # absl's --help exits 1, argparse's 0
    assert doc.splitlines()[0] in r.stdout, r.stdout[:2000]  # the program's own docstring heads its help


@pytest.mark.parametrize(
    "module,args",
    [
        ("train", ["--config=configs/demo_cpu.py", "--config.optim.lrr=1e-4"]),
        ("pretrain", ["--set", "stepz=3"]),
    ],
)
def test_a_mistake_reads_the_same_as_a_module_and_as_a_file(module, args):
    as_file = _python(os.path.join("launch", f"{module}.py"), *args)
    as_module = _python("-m", f"launch.{module}", *args)
    assert as_file.returncode == 2, as_file.stderr[-3000:]
    assert (as_module.returncode, as_module.stderr) == (as_file.returncode, as_file.stderr)
    assert as_file.stderr.startswith(f"{module}.py: ") and "did you mean" in as_file.stderr, as_file.stderr


def test_a_cluster_dry_run_prints_the_same_commands_as_a_module():
    args = ["--hosts=h0,h1", "--config=configs/demo_cpu.py", "--dry-run", "--", "--config.seed=1"]
    as_file = _python(os.path.join("launch", "gpu", "run.py"), *args)
    as_module = _python("-m", "launch.gpu.run", *args)
    assert as_file.returncode == 0, as_file.stderr[-3000:]
    assert as_module.returncode == 0 and as_module.stdout == as_file.stdout, as_module.stderr[-3000:]
    assert as_file.stdout.count("launch/train.py --config=configs/demo_cpu.py") == 2, as_file.stdout
