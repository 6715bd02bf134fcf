"""Print-then-run for the cluster scripts (launch/tpu_vm, launch/gpu): with ``dry_run`` the exact
commands are printed and nothing runs."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from typing import Callable, Sequence

DRY_RUN = "--dry-run"


def execute(commands: Sequence[list[str]], dry_run: bool) -> int:
    for cmd in commands:
        print(shlex.join(cmd), flush=True)
        if not dry_run:
            rc = subprocess.call(cmd)
            if rc:
                print(f"command failed with exit code {rc}", file=sys.stderr)
                return rc
    return 0


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(this script's args, the remote command's args)``, split at the first ``--``.

    ``--dry-run`` is always this script's, wherever it stands: the remote command (train.py) has no such
    flag, and passing it on would run the cluster commands for real while the user asked to see them
    only. So one given after ``--`` is moved to this script's side."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    own, extra = argv[:i], argv[i + 1 :]
    if DRY_RUN in extra:
        extra = [a for a in extra if a != DRY_RUN]
        own.append(DRY_RUN)
    return own, extra


def _entrypoint():
    """envace_jax/cli/entrypoint.py, loaded by its path: a cluster script runs where the package need not be
    installed (the machine that only starts the pods), and that module needs only the standard library."""
    if "envace_entrypoint" not in sys.modules:
        launch = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(os.path.dirname(launch), "envace_jax", "cli", "entrypoint.py")
        spec = importlib.util.spec_from_file_location("envace_entrypoint", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["envace_entrypoint"] = module
        spec.loader.exec_module(module)
    return sys.modules["envace_entrypoint"]


def main(commands: Callable[[], tuple[list[list[str]], bool]]) -> None:
    """A cluster script's ``__main__``: build the commands, print (and unless dry-run, run) them; a missing
    executable (no ``gcloud`` on PATH) or another expected failure is a short message (envace_jax/cli/entrypoint.py)."""
    with _entrypoint().guard():
        cmds, dry = commands()
        rc = execute(cmds, dry)
    sys.exit(rc)
