"""Shared pieces of the GPU scripts: a host list reached over ssh (host 0 is the JAX coordinator)."""

from __future__ import annotations

import argparse
import importlib.util
import os


def _load_command_runner():
    """launch/command_runner.py, loaded by its path: this script runs as ``python launch/gpu/<name>.py``, so
    only launch/gpu/ is on sys.path, and the helper is shared with launch/tpu_vm/."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "command_runner.py")
    spec = importlib.util.spec_from_file_location("command_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One print-then-run helper serves the TPU and GPU scripts; the scripts import these three from here.
_runner = _load_command_runner()
execute, main, split_passthrough = _runner.execute, _runner.main, _runner.split_passthrough

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
