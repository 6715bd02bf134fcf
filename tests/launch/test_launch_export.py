"""launch/export_hf.py: an Orbax training checkpoint -> HF directory that transformers loads with the
same logits as our model, trained parameters included."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np

from tests import helpers_loop as h


def _cfg(run_dir):
    from envace_jax.config import load_config

    return load_config(
        {
            "run_dir": run_dir,
            "tokenizer": {"path": h.tokenizer_dir()},
            "model": {"hidden_size": 32, "intermediate_size": 48, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8},
            "optim": {"lr": 0.05},
            "rl": {"micro_batch_size": 4},
        }
    )


def test_export_hf_matches_transformers_logits(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace_jax.rl import train as rl_train
    from envace_jax.checkpoint import Checkpointer
    from envace_jax.rl.batch import build_batch
    from envace_jax.rl.types import ACT, Generation

    run_dir = str(tmp_path / "run")
    cfg = _cfg(run_dir)
    _, _, trainers, policy, _ = rl_train.build_policies(cfg, None)
    trainer = trainers[ACT]
    init = jax.tree.map(np.asarray, trainer.params)
    rng = np.random.default_rng(0)
    gens = [
        Generation(
            ACT, rng.integers(3, 400, 7).tolist(), rng.integers(3, 400, 5).tolist(), [-2.0] * 5, f"u{i // 2}", i, 0
        )
        for i in range(4)
    ]
    trainer.update(build_batch(gens, [1.0, -1.0, 0.5, -0.5], [0, 0, 1, 1], max_len=32))
    with Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False) as ck:
        ck.save(1, {"iteration": 1, "trainers": {ACT: trainer.state_dict()}}, {"note": "test"})

    out = str(tmp_path / "hf")
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(h.ROOT, "launch", "export_hf.py"),
            f"--config={h.ROOT}/configs/demo_cpu.py",
            f"--config.run_dir={run_dir}",
            f"--config.tokenizer.path={h.tokenizer_dir()}",
            "--config.model.hidden_size=32",
            "--config.model.intermediate_size=48",
            "--config.model.head_dim=8",
            f"--out_dir={out}",
        ],
        env=h.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exported step 1" in r.stderr

    hf = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) <= hf.config.vocab_size
    # generate stops where our sampler does: at <|im_end|> or <|endoftext|>, and pads with the tokenizer's pad.
    stops = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert hf.generation_config.eos_token_id == stops and hf.generation_config.pad_token_id == tok.pad_token_id
    assert tok.pad_token_id in stops
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert os.stat(os.path.join(out, name)).st_mode & 0o777 == 0o644, name
    ids = np.asarray(tok("<|im_start|>user\nhello there<|im_end|>")["input_ids"] + [5, 17, 101], np.int32)[None]
    with torch.no_grad():
        want = hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    got = np.asarray(policy(jax.numpy.asarray(ids)))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    # The export holds the trained weights, not the initial ones.
    emb = hf.model.embed_tokens.weight.detach().numpy()
    init_emb = [v for p, v in jax.tree_util.tree_flatten_with_path(init)[0] if "embed" in jax.tree_util.keystr(p)][0]
    assert not np.allclose(emb, init_emb)


def test_export_hf_without_checkpoint_fails_clearly(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(h.ROOT, "launch", "export_hf.py"),
            f"--config={h.ROOT}/configs/demo_cpu.py",
            f"--config.run_dir={tmp_path}/empty",
            f"--config.tokenizer.path={h.tokenizer_dir()}",
            f"--out_dir={tmp_path}/hf",
        ],
        env=h.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0
    assert "no checkpoint in" in r.stderr
