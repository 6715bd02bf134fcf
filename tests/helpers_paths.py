"""Where the repository is, for tests at any depth under tests/ (configs, launch scripts, subprocess
PYTHONPATH), and the environment of a demo subprocess."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo_env() -> dict:
    """The environment of a ``launch/demo.py`` subprocess: CPU, this checkout importable, and the demo tests' shared
    compilation cache (``ENVACE_JAX_CACHE``)."""
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        TOKENIZERS_PARALLELISM="false",
        ENVACE_JAX_CACHE=os.path.join(ROOT, "runs", ".jax_cache_test"),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
