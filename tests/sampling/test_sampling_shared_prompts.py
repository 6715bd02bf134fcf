"""``Sampler(share_prompts=True)``: a call whose rows repeat prompts (a GRPO group) writes each distinct
prompt once and copies its cache rows; the tokens are transformers' greedy ones, every row keeps its own
random stream (the same draws as a sampler that writes every row), and a repeated call compiles nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3ForCausalLM

from envace_jax.models import hf_io, qwen3
from envace_jax.sampling import Sampler, SamplingParams
from tests.helpers_models import build_on_two_devices

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
NEW = 12


def _grouped_prompts(seed=0, lengths=(9, 14, 5), group=3):
    """Each distinct prompt ``group`` times, the groups interleaved (rows need not be adjacent)."""
    rng = np.random.RandomState(seed)
    distinct = [rng.randint(3, V, n).tolist() for n in lengths]
    return [distinct[i % len(distinct)] for i in range(group * len(distinct))], distinct


def test_greedy_rows_of_a_shared_prompt_are_transformers_greedy(tmp_path):
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(1))
    prompts, distinct = _grouped_prompts()
    sampler = Sampler(model, share_prompts=True)
    out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    hf_io.save_hf(model, str(tmp_path))
    hf = Qwen3ForCausalLM.from_pretrained(str(tmp_path)).eval()
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = {}
        for p in distinct:
            ids = torch.tensor([p])
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)
            expected[tuple(p)] = gen[0, len(p) :].tolist()
    assert out.tokens == [expected[tuple(p)] for p in prompts]
    # Only the distinct prompts were written.
    assert sampler.stats.prefill_tokens == sum(map(len, distinct))


@pytest.mark.parametrize("seeded", [True, False])
def test_each_row_keeps_its_own_stream(seeded):
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(2))
    prompts, _ = _grouped_prompts(seed=1)
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=100 + i if seeded else None)
        for i in range(len(prompts))
    ]
    shared, plain = Sampler(model, seed=5, share_prompts=True), Sampler(model, seed=5, share_prompts=False)
    for _ in range(2):  # unseeded rows draw from the sampler's stream: the same in both, call after call
        a, b = shared.generate(prompts, params), plain.generate(prompts, params)
        assert a.tokens == b.tokens
        np.testing.assert_allclose(np.concatenate(a.logprobs), np.concatenate(b.logprobs), rtol=1e-5, atol=1e-5)
    # The rows of one prompt are different samples, not copies of one another.
    assert len({tuple(a.tokens[i]) for i in range(0, len(prompts), 3)}) > 1
    assert shared.stats.prefill_tokens < plain.stats.prefill_tokens


def test_a_repeated_shared_call_compiles_nothing():
    sampler = Sampler(qwen3.Qwen3(CFG, rngs=nnx.Rngs(3)), share_prompts=True)
    prompts, _ = _grouped_prompts(seed=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=0)
    sampler.generate(prompts, params)
    first = sampler.num_compilations
    sampler.generate(prompts, params)
    assert first > 0 and sampler.num_compilations == first


def test_share_prompts_run_on_one_device_only():
    from envace_jax import sharding as shd

    # A mesh of one device (what the RL launcher builds on one chip) samples the plain call's tokens.
    model = qwen3.Qwen3(CFG, rngs=nnx.Rngs(4))
    prompts, _ = _grouped_prompts(seed=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=7)
    on_mesh = Sampler(model, mesh=shd.make_mesh(1, 1, 1))
    assert on_mesh.share_prompts  # the default is on where it applies
    plain = Sampler(model, share_prompts=False)
    assert on_mesh.generate(prompts, params).tokens == plain.generate(prompts, params).tokens
    # On two devices the default is off (the rule the Sampler applies; the helper's one-axis mesh builds no
    # Sampler), an explicit True is refused.
    out = build_on_two_devices(
        "from envace_jax import fast_defaults; print('DEFAULT', fast_defaults.share_repeated_prompts(None, mesh)); "
        "Sampler(model, mesh=mesh, share_prompts=True)"
    )
    assert "DEFAULT False" in out.stdout, out.stderr[-2000:]
    assert "REFUSED Sampler(share_prompts=True) runs on one device, not on a mesh of 2" in out.stdout
