"""Shared pieces of the TPU VM scripts: flags, command building, and run-or-print."""

from __future__ import annotations

import argparse
import importlib.util
import os


def _load_command_runner():
    """launch/command_runner.py, loaded by its path: this script runs as ``python launch/tpu_vm/<name>.py``, so
    only launch/tpu_vm/ is on sys.path, and the helper is shared with launch/gpu/."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "command_runner.py")
    spec = importlib.util.spec_from_file_location("command_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One print-then-run helper serves the TPU and GPU scripts; the scripts import these three from here.
_runner = _load_command_runner()
execute, main, split_passthrough = _runner.execute, _runner.main, _runner.split_passthrough

REPO_DIR = "~/envace-jax"


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="TPU VM (pod slice) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default=None)
    p.add_argument("--dry-run", action="store_true", help="print the exact commands instead of running them")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on failure (or ENVACE_DEBUG=1)")
    return p


def gcloud(args: argparse.Namespace, *words: str) -> list[str]:
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", *words, f"--zone={args.zone}"]
    if args.project:
        cmd.append(f"--project={args.project}")
    return cmd


def ssh_all(args: argparse.Namespace, remote: str) -> list[str]:
    """The same shell command on every worker of the slice."""
    return gcloud(args, "ssh", args.name, "--worker=all", f"--command={remote}")
