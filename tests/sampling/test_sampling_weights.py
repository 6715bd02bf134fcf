"""The sampler prepares its per-layer weights once per weights version: repeated calls reuse them, and a
sample after an optimizer update comes from the new weights (checked against transformers' greedy
``generate`` on the updated weights, exported with ``hf_io.save_hf``)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3ForCausalLM

from envace_jax.models import hf_io, qwen3
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.sampling import Sampler, SamplingParams
from envace_jax.rl.batch import build_batch
from envace_jax.rl.types import ACT, Generation

V = 64
CFG = qwen3.Qwen3Config(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
NEW = 16


def _prompts(seed, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, V, n).tolist() for n in lengths]


def _sft_batch():
    """Six rows whose targets repeat token 7: a few SFT steps on them move the greedy continuations."""
    rng = np.random.default_rng(0)
    gens = [Generation(ACT, rng.integers(3, V, 6).tolist(), [7] * 5, [-1.0] * 5, f"u{i}", i, 0) for i in range(6)]
    return build_batch(gens, np.ones(6), list(range(6)), max_len=16)


def _hf_greedy(model, tmp_path, prompts):
    """transformers' greedy continuation of each prompt (one row at a time: no padding), on our weights."""
    hf_io.save_hf(model, str(tmp_path))
    hf = Qwen3ForCausalLM.from_pretrained(str(tmp_path)).eval()
    hf.generation_config.eos_token_id = None
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)
            out.append(gen[0, len(p) :].tolist())
    return out


def test_weights_prepared_once_per_version_and_a_sample_after_an_update_uses_the_new_ones(tmp_path):
    trainer = Trainer(qwen3.Qwen3(CFG, rngs=nnx.Rngs(0)), OptimConfig(lr=0.05), LossConfig(), micro_batch_size=6)
    sampler = Sampler(trainer.model, prepare_weights=True)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW)
    prompts = _prompts(0, [5, 9, 7])
    before = sampler.generate(prompts, greedy).tokens
    assert before == _hf_greedy(trainer.model, tmp_path / "before", prompts)
    sampler.generate(_prompts(1, [4, 6]), greedy)
    assert sampler.stats.weight_preparations == 1  # the second call reused the first call's weights

    for _ in range(3):
        trainer.update(_sft_batch(), kind="sft")
    after = sampler.generate(prompts, greedy).tokens
    assert after == _hf_greedy(trainer.model, tmp_path / "after", prompts)
    assert sampler.stats.weight_preparations == 2
    assert after != before, "the update should change the greedy continuations"
    sampler.generate(prompts, greedy)
    assert sampler.stats.weight_preparations == 2


def test_prepared_and_per_call_weights_sample_the_same(tmp_path):
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(3))
    prompts = _prompts(2, [3, 11, 6, 8])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=NEW, seed=5)
    outs = [Sampler(model, prepare_weights=flag).generate(prompts, [greedy, sampled] * 2) for flag in (True, False)]
    assert outs[0].tokens == outs[1].tokens
    np.testing.assert_allclose(np.concatenate(outs[0].logprobs), np.concatenate(outs[1].logprobs), atol=1e-5)
    assert outs[0].tokens[0] == _hf_greedy(model, tmp_path, prompts[:1])[0]


@pytest.mark.parametrize("tied", [True, False])
def test_fused_projections_sample_as_the_separate_ones_and_as_transformers(tmp_path, tied):
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied)
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(4))
    prompts = _prompts(3, [4, 10, 7])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW)
    sampled = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=NEW, seed=2)
    fused = Sampler(model, prepare_weights=True, fuse_projections=True)
    plain = Sampler(model, prepare_weights=True, fuse_projections=False)
    # 6 rows: the fused step pads its products' rows to 16 (qwen3._SLOW_ROWS)
    a = fused.generate(prompts + prompts, [greedy] * 3 + [sampled] * 3)
    b = plain.generate(prompts + prompts, [greedy] * 3 + [sampled] * 3)
    # the two samplers really read different layouts: the fused one [out, in] matrices and a [V, D] head
    D, N, K, H, F = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    shapes = {k: v.shape for k, v in fused.prepared_weights.layers[0].items() if v.ndim == 2}
    assert shapes == {
        qwen3.FUSED_QKV: ((N + 2 * K) * H, D),
        qwen3.O_OUT_IN: (D, N * H),
        qwen3.FUSED_GATE_UP: (2 * F, D),
        qwen3.DOWN_OUT_IN: (D, F),
    }
    head = fused.prepared_weights.head
    assert head is None if tied else head.shape == (V, D)  # a tied embedding is read as it lies
    assert "q_proj" not in fused.prepared_weights.layers[0] and "q_proj" in plain.prepared_weights.layers[0]
    assert a.tokens[:3] == _hf_greedy(model, tmp_path, prompts)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(np.concatenate(a.logprobs), np.concatenate(b.logprobs), atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 4, 8, 15, 16, 17])
def test_out_in_product_with_padded_rows_is_the_plain_product(rows):
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 24), np.float32), rng.standard_normal((40, 24), np.float32)
    y = np.asarray(qwen3.dot_out_in(jnp.asarray(x), jnp.asarray(w)))
    assert y.shape == (rows, 40)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_fuse_projections_needs_prepared_weights():
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="needs prepare_weights"):
        Sampler(model, prepare_weights=False, fuse_projections=True)
    assert not Sampler(model, prepare_weights=False).fuse_projections


@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_out_in_product_in_bfloat16_accumulates_in_float32(rows):
    # bfloat16 rows below 16 are padded (qwen3._SLOW_ROWS_LOW_PRECISION); the float32 result of bfloat16
    # inputs equals the float64 product of the same rounded inputs up to float32 rounding
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 24), np.float32), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((40, 24), np.float32), jnp.bfloat16)
    y = qwen3.dot_out_in(x, w, preferred_element_type=jnp.float32)
    assert y.shape == (rows, 40) and y.dtype == jnp.float32
    ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)


# A bfloat16 model (Qwen3's released dtype) samples on CPU, and its tokens are transformers' in bfloat16 up
# to bfloat16 rounding. Teacher-forced on our tokens, transformers' bfloat16 log-probs differ from the
# sampler's by up to ~0.02 on this tiny model (two frameworks' bfloat16 roundings); we allow 0.06, and our
# greedy token must be transformers' argmax or within that of it.
BF16_LOGPROB_ATOL = 0.06


@pytest.mark.parametrize("fuse", [True, False])
def test_bfloat16_sampler_agrees_with_transformers_in_bfloat16(tmp_path, fuse):
    cfg = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(5))
    assert model.layers.q_proj[...].dtype == jnp.bfloat16
    prompts = _prompts(4, [4, 10, 7, 5, 9, 6])  # prompts longer than one token: the cached prefill path
    out = Sampler(model, prepare_weights=True, fuse_projections=fuse).generate(
        prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW)
    )
    hf_io.save_hf(model, str(tmp_path))
    hf = Qwen3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16).eval()
    agree = total = 0
    for prompt, toks, lps in zip(prompts, out.tokens, out.logprobs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + toks])).logits[0].double()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].numpy()
        mine = ref[np.arange(NEW), toks]
        np.testing.assert_allclose(lps, mine, atol=BF16_LOGPROB_ATOL)
        assert (mine >= ref.max(-1) - BF16_LOGPROB_ATOL).all(), "a greedy token far below transformers' argmax"
        agree += int((ref.argmax(-1) == np.asarray(toks)).sum())
        total += NEW
    assert agree >= 0.9 * total, f"{agree} of {total} greedy tokens are transformers' argmax"
