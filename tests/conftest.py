"""Shared fixtures for every folder of tests/. Area-specific helpers live in tests/helpers_<area>.py and import
as ``tests.helpers_<area>``."""

from __future__ import annotations

import os

import pytest

from tests.helpers_models import make_tiny_hf_qwen3

# Keep tests on the CPU and quiet, whatever machine runs them.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def tiny_hf_qwen3(tmp_path):
    """Factory: tiny_hf_qwen3(**kw) -> (dir, torch_model)."""
    counter = {"n": 0}

    def make(**kw):
        counter["n"] += 1
        d = tmp_path / f"hf_qwen3_{counter['n']}"
        return str(d), make_tiny_hf_qwen3(d, **kw)

    return make


@pytest.fixture(scope="session")
def qwen3_official():
    """Directory holding Qwen3's official tokenizer.json and tokenizer_config.json (tests/qwen3_official.py).

    Absent or altered files skip the test, or fail it when ENVACE_REQUIRE_OFFICIAL=1 (``make test`` sets
    it, so CI cannot pass without having compared against the official files)."""
    from tests.qwen3_official import MAKE_TARGET, official_dir, problems

    left = problems()
    if left:
        msg = f"Qwen3's official tokenizer files are not available ({'; '.join(left)}); run `{MAKE_TARGET}`"
        if os.environ.get("ENVACE_REQUIRE_OFFICIAL") == "1":
            pytest.fail(msg + " (ENVACE_REQUIRE_OFFICIAL=1)", pytrace=False)
        pytest.skip(msg)
    return official_dir()
