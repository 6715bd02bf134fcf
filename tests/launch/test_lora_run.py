"""A LoRA training run end to end: the loop trains adapters on a transformers Qwen3 base, checkpoints hold the
adapters (not the base), a run resumes, and the export's PEFT adapter applied by ``peft`` to the base gives the
export's merged model's logits; a run can start from that adapter."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import helpers_loop as h
from tests.helpers_models import make_tiny_hf_qwen3, torch_forward

peft = pytest.importorskip("peft")


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_lora_run_checkpoints_resumes_exports_and_restarts(tmp_path):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from envace_jax.cli.export_hf import export
    from envace_jax.rl.train import train

    h.use_compile_cache()
    vocab = len(AutoTokenizer.from_pretrained(h.tokenizer_dir()))
    base_dir = tmp_path / "base"
    make_tiny_hf_qwen3(base_dir, seed=5, vocab_size=vocab + 16, num_layers=2)
    run_dir = str(tmp_path / "run")
    lora_kw = {"model.hf_path": str(base_dir), "model.lora_rank": 4, "model.lora_alpha": 8.0, "optim.lr": 0.02}

    out = train(h.tiny_config(run_dir, 2, **lora_kw))
    assert out["iteration"] == 2
    # the checkpoint holds the adapters and their moments: far less than the base's weights
    ck = os.path.join(run_dir, "checkpoints")
    newest = max((d for d in os.listdir(ck) if d.isdigit()), key=int)
    assert _dir_bytes(os.path.join(ck, newest)) < 0.5 * _dir_bytes(str(base_dir))
    out = train(h.tiny_config(run_dir, 3, **lora_kw))
    assert out["resumed_from"] == 2 and out["iteration"] == 3

    cfg = h.tiny_config(run_dir, 3, **lora_kw)
    export(cfg, str(tmp_path / "export"))
    ids = np.array([[3, 14, 15, 92, 65, 35, 89, 79]], np.int64)
    merged = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "export")).eval()
    want, _ = torch_forward(merged, ids)
    base = Qwen3ForCausalLM.from_pretrained(str(base_dir)).eval()
    base_logits, _ = torch_forward(base, ids)
    assert np.abs(want - base_logits).max() > 1e-4  # training moved the adapters off zero
    with_adapter = peft.PeftModel.from_pretrained(base, str(tmp_path / "export" / "adapter"))
    np.testing.assert_allclose(torch_forward(with_adapter, ids)[0], want, rtol=1e-4, atol=1e-4)

    # a new run starting from the exported adapter holds the same policy at its start
    from envace_jax.rl.train import build_policies

    start = h.tiny_config(
        str(tmp_path / "run2"),
        1,
        **{**lora_kw, "model.lora_rank": 0, "model.lora_adapter": str(tmp_path / "export" / "adapter")},
    )
    _, _, trainers, policy, _ = build_policies(start, None)
    import jax.numpy as jnp

    np.testing.assert_allclose(
        np.asarray(policy(jnp.asarray(ids, jnp.int32)))[:, :, : want.shape[-1]], want, rtol=2e-4, atol=2e-4
    )
    assert trainers["act"].lora
    with pytest.raises(Exception, match="lora_rank=2 but the adapter"):
        build_policies(
            h.tiny_config(
                str(tmp_path / "run3"),
                1,
                **{**lora_kw, "model.lora_rank": 2, "model.lora_adapter": str(tmp_path / "export" / "adapter")},
            ),
            None,
        )
