"""Shared pieces of the TPU VM scripts: flags, command building, and run-or-print."""

from __future__ import annotations

import argparse
import os
import sys

# One print-then-run helper serves the TPU and GPU scripts; it lives in launch/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from command_runner import execute, main, split_passthrough  # noqa: E402,F401  (re-exported to the scripts)

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
