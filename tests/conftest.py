"""Shared fixtures. Area-specific helpers live in tests/helpers_<area>.py."""

from __future__ import annotations

import os

import pytest

from envace_jax.model_sizes import HF_TEST

# Keep tests on the CPU and quiet, whatever machine runs them.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def make_tiny_hf_qwen3(out_dir, *, seed: int = 0, vocab_size: int = 256, hidden_size: int = HF_TEST.hidden_size,
                       intermediate_size: int = HF_TEST.intermediate_size, num_layers: int = HF_TEST.num_layers,
                       num_heads: int = HF_TEST.num_heads, num_kv_heads: int = HF_TEST.num_kv_heads,
                       head_dim: int = HF_TEST.head_dim, tie: bool = False,
                       rope_theta: float = 10000.0, dtype: str = "float32", **extra):
    """Builds a random transformers Qwen3ForCausalLM (sized ``model_sizes.HF_TEST`` unless told), saves it to
    out_dir, returns the torch model."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      num_key_value_heads=num_kv_heads, head_dim=head_dim, tie_word_embeddings=tie,
                      rope_theta=rope_theta, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, **extra)
    model = Qwen3ForCausalLM(cfg).eval()
    # Random norms too, so a q/k-norm or RMSNorm weight mix-up cannot hide behind ones.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out_dir))
    return model


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
    from qwen3_official import MAKE_TARGET, official_dir, problems

    left = problems()
    if left:
        msg = f"Qwen3's official tokenizer files are not available ({'; '.join(left)}); run `{MAKE_TARGET}`"
        if os.environ.get("ENVACE_REQUIRE_OFFICIAL") == "1":
            pytest.fail(msg + " (ENVACE_REQUIRE_OFFICIAL=1)", pytrace=False)
        pytest.skip(msg)
    return official_dir()
