"""Print-then-run for the cluster scripts (launch/tpu_vm, launch/gpu): with ``dry_run`` the exact
commands are printed and nothing runs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Sequence


def execute(commands: Sequence[list[str]], dry_run: bool) -> int:
    for cmd in commands:
        print(shlex.join(cmd), flush=True)
        if not dry_run:
            rc = subprocess.call(cmd)
            if rc:
                print(f"command failed with exit code {rc}", file=sys.stderr)
                return rc
    return 0
