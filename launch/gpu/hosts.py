"""Shared pieces of the GPU scripts: a host list reached over ssh (host 0 is the JAX coordinator)."""

from __future__ import annotations

import argparse
import os
import sys

# One print-then-run helper serves the TPU and GPU scripts; it lives in launch/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from command_runner import execute, main, split_passthrough  # noqa: E402,F401  (re-exported to the scripts)

REPO_DIR = "~/envace-jax"
LOCAL = ("localhost", "127.0.0.1")


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", required=True, help="comma-separated ssh hosts; the first is the coordinator")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands instead of running them")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on failure (or ENVACE_DEBUG=1)")
    return p


def host_list(spec: str) -> list[str]:
    hosts = [h.strip() for h in spec.split(",") if h.strip()]
    if not hosts:
        raise SystemExit("--hosts is empty")
    return hosts


def on_host(host: str, remote: str) -> list[str]:
    """A shell command on ``host`` (localhost runs it here, so one machine can play several hosts)."""
    if host in LOCAL:
        return ["bash", "-c", remote]
    return ["ssh", host, remote]
