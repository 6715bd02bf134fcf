"""pyproject.toml's console scripts: each names a ``cli()`` in envace_jax/cli/, every main there has one, and
run the way the installed script runs it (its name as argv[0], ``__main__`` a module without the main's
docstring or flags), ``--help`` prints that main's docstring and flags. The scripts themselves exist only after
an install (``make venv``); what they call is checked here without one."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib

import pytest

from tests import helpers_loop as h

CLI = os.path.join(h.ROOT, "envace_jax", "cli")


def _scripts() -> dict[str, str]:
    with open(os.path.join(h.ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_every_main_has_a_console_script():
    mains = {n[:-3] for n in os.listdir(CLI) if n.endswith(".py")} - {"__init__", "entrypoint"}
    targets = {name: target.partition(":") for name, target in _scripts().items()}
    assert {module for module, _, _ in targets.values()} == {f"envace_jax.cli.{m}" for m in mains}
    for name, (module, _, func) in targets.items():
        assert func == "cli" and name == "envace-" + module.rpartition(".")[2].replace("_", "-"), name


# What pip's generated script does: import the target, call it with the script's path as argv[0].
CONSOLE = "import sys; from {module} import {func}; sys.argv[0] = {name!r}; sys.exit({func}())"


@pytest.mark.parametrize("name", sorted(_scripts()))
def test_the_script_target_runs_and_its_help_is_the_main_s(name):
    module, _, func = _scripts()[name].partition(":")
    with open(os.path.join(CLI, module.rpartition(".")[2] + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    doc = ast.get_docstring(tree).splitlines()[0]
    flags = [  # the flags the main defines: absl's DEFINE_*("name", ...) or argparse's add_argument("--name", ...)
        call.args[0].value.lstrip("-")
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and (call.func.attr.startswith("DEFINE_") or call.func.attr == "add_argument")
        and call.args
        and isinstance(call.args[0], ast.Constant)
    ]
    assert flags, module
    env = dict(h.env())
    env.pop("ENVACE_DEBUG", None)
    r = subprocess.run(
        [sys.executable, "-c", CONSOLE.format(module=module, func=func, name=name), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=h.ROOT,
        timeout=300,
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 1), r.stderr[-3000:]  # argparse's --help exits 0, absl's 1
    assert doc in r.stdout, r.stdout[:3000]
    missing = [f for f in flags if f"--{f}" not in r.stdout]
    assert not missing, f"{name} --help does not list {missing}:\n{r.stdout[:3000]}"
