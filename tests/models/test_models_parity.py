"""Qwen3 forward parity with transformers' Qwen3ForCausalLM (the independent truth)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.models import hf_io, qwen3
from tests.helpers_models import jit_forward, left_padded_batch, positions_from_mask, torch_forward

# (tie, num_heads, num_kv_heads, head_dim): kv ratios 1, 2, 4; head_dim != hidden/heads except in one.
CONFIGS = [
    pytest.param(dict(tie=False, num_heads=4, num_kv_heads=4, head_dim=24), id="untied-kv1-hd24"),
    pytest.param(dict(tie=True, num_heads=4, num_kv_heads=2, head_dim=16), id="tied-kv2-hd16"),
    pytest.param(dict(tie=False, num_heads=8, num_kv_heads=2, head_dim=12, rope_theta=1e6), id="untied-kv4-hd12"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_logits_and_hidden_states_match_transformers_left_padded(tiny_hf_qwen3, kw):
    path, tm = tiny_hf_qwen3(**kw)
    model = hf_io.load_hf(path)
    assert model.config.tie_word_embeddings == kw["tie"]
    ids, mask = left_padded_batch(np.random.RandomState(1), 256, [9, 5, 1])
    ref_logits, ref_hidden = torch_forward(tm, ids, mask)
    logits, hidden = jit_forward(model, return_hidden_states=True)(
        jnp.asarray(ids, jnp.int32), jnp.asarray(positions_from_mask(mask), jnp.int32), jnp.asarray(mask, jnp.int32)
    )
    valid = mask.astype(bool)
    logits = np.asarray(logits)
    assert logits.shape == ref_logits.shape
    assert np.abs(logits[valid] - ref_logits[valid]).max() <= 1e-4
    # HF: [emb, out_0 .. out_{L-2}, norm(out_{L-1})]; ours: [emb, out_0 .. out_{L-1}] (pre-norm).
    hidden = np.asarray(hidden)
    L = model.config.num_layers
    assert hidden.shape == ref_hidden.shape
    for layer in range(L):
        assert np.abs(hidden[layer][valid] - ref_hidden[layer][valid]).max() <= 1e-4, layer
    last = np.asarray(qwen3.rms_norm(jnp.asarray(hidden[L]), model.norm.scale[...], model.config.rms_norm_eps))
    assert np.abs(last[valid] - ref_hidden[L][valid]).max() <= 1e-4
    # A row alone (no padding) gives the same logits as inside the padded batch.
    alone = np.asarray(jit_forward(model)(jnp.asarray(ids[1:2, -5:], jnp.int32)))
    assert np.abs(alone[0] - logits[1, -5:]).max() <= 1e-5


# bfloat16 params and compute against the float32 transformers reference. The logits of these tiny
# random models are up to ~0.57; bf16 keeps 8 mantissa bits (relative step 2^-8 ~ 4e-3) and the error
# accumulates over 2 layers of matmuls. Measured: 6.1e-3 (bf16 compute), 3.2e-3 (bf16 params with f32
# compute). We allow 2e-2 absolute and require the same arg-max on >= 90% of positions.
BF16_ATOL = 2e-2


def test_bfloat16_close_to_float32_reference(tiny_hf_qwen3):
    path, tm = tiny_hf_qwen3(num_heads=4, num_kv_heads=2, head_dim=16)
    model = hf_io.load_hf(path, dtype="bfloat16")
    assert model.layers.q_proj[...].dtype == jnp.bfloat16
    ids = np.random.RandomState(2).randint(3, 256, (2, 12))
    ref, _ = torch_forward(tm, ids)
    logits = jit_forward(model)(jnp.asarray(ids, jnp.int32))
    assert logits.dtype == jnp.float32
    logits = np.asarray(logits)
    assert np.abs(logits - ref).max() <= BF16_ATOL
    assert (logits.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    # bf16 params with float32 compute is closer.
    mixed_model = hf_io.load_hf(path, dtype="bfloat16", compute_dtype="float32")
    mixed = np.asarray(jit_forward(mixed_model)(jnp.asarray(ids, jnp.int32)))
    assert np.abs(mixed - ref).max() <= BF16_ATOL


def test_packed_sequences_equal_separate_forwards(tiny_hf_qwen3):
    path, _ = tiny_hf_qwen3()
    model = hf_io.load_hf(path)
    rng = np.random.RandomState(3)
    a, b = rng.randint(3, 256, 5), rng.randint(3, 256, 7)
    packed = np.concatenate([a, b, [0, 0]])[None]
    seg = np.array([[1] * 5 + [2] * 7 + [0, 0]])
    pos = np.array([list(range(5)) + list(range(7)) + [0, 0]])
    fwd = jit_forward(model)
    out = np.asarray(fwd(jnp.asarray(packed, jnp.int32), jnp.asarray(pos, jnp.int32), jnp.asarray(seg, jnp.int32)))
    sep_a = np.asarray(fwd(jnp.asarray(a[None], jnp.int32)))[0]
    sep_b = np.asarray(fwd(jnp.asarray(b[None], jnp.int32)))[0]
    assert np.abs(out[0, :5] - sep_a).max() <= 1e-5
    assert np.abs(out[0, 5:12] - sep_b).max() <= 1e-5
    # Without the segment ids the second sequence would attend to the first: the check above can fail.
    leaky = np.asarray(fwd(jnp.asarray(packed, jnp.int32), jnp.asarray(pos, jnp.int32)))
    assert np.abs(leaky[0, 5:12] - sep_b).max() > 1e-3


def test_kv_cache_decoding_reproduces_full_forward(tiny_hf_qwen3):
    path, tm = tiny_hf_qwen3(num_heads=8, num_kv_heads=2, head_dim=12)
    model = hf_io.load_hf(path)
    rng = np.random.RandomState(4)
    # Two rows with different prompt lengths: prefill right-padded, then one token per step.
    seqs = [rng.randint(3, 256, 11), rng.randint(3, 256, 11)]
    prompt_lens = np.array([4, 6])
    full = [torch_forward(tm, s[None])[0][0] for s in seqs]
    P = prompt_lens.max()
    prefill = np.zeros((2, P), np.int64)
    for r in range(2):
        prefill[r, : prompt_lens[r]] = seqs[r][: prompt_lens[r]]
    cache = model.init_cache(batch=2, size=16)
    logits, cache = jax.jit(lambda ids, c, n: model(ids, cache=c, chunk_lengths=n))(
        jnp.asarray(prefill, jnp.int32), cache, jnp.asarray(prompt_lens, jnp.int32)
    )
    logits = np.asarray(logits)
    for r in range(2):
        assert np.abs(logits[r, : prompt_lens[r]] - full[r][: prompt_lens[r]]).max() <= 1e-4
    np.testing.assert_array_equal(np.asarray(cache.end), prompt_lens)
    step = jax.jit(lambda ids, c: model(ids, cache=c))
    pos = prompt_lens.copy()
    while pos.max() < 11:
        tok = np.array([[seqs[r][min(pos[r], 10)]] for r in range(2)])
        out, cache = step(jnp.asarray(tok, jnp.int32), cache)
        out = np.asarray(out)
        for r in range(2):
            if pos[r] < 11:
                assert np.abs(out[r, 0] - full[r][pos[r]]).max() <= 1e-4, (r, pos[r])
        pos += 1


def test_remat_and_unrolled_layers_match_default(tiny_hf_qwen3):
    from flax import nnx

    path, _ = tiny_hf_qwen3()
    base = hf_io.load_hf(path)
    graphdef, state = nnx.split(base)
    ids = jnp.asarray(np.random.RandomState(5).randint(3, 256, (2, 8)), jnp.int32)

    def logits_and_grads(cfg, with_grads: bool):
        """Jitted forward (+ backward of mean logsumexp(logits)) under ``cfg``."""

        def loss(st):
            m = nnx.merge(graphdef, st)
            m.config = cfg
            logits = m(ids)
            return jnp.mean(jax.nn.logsumexp(logits, axis=-1)), logits

        if not with_grads:
            return np.asarray(jax.jit(lambda st: loss(st)[1])(state)), None
        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
        return np.asarray(logits), [np.asarray(g) for g in jax.tree.leaves(grads)]

    ref_logits, ref_grads = logits_and_grads(base.config.replace(scan_layers=True), True)
    # Remat only changes what the backward pass recomputes, so gradients are the real check; each
    # fwd+bwd compile is slow on CPU, hence gradients for one policy and logits for the rest.
    for override, with_grads in (
        (dict(remat_policy="full"), True),
        (dict(remat_policy="dots_no_batch"), False),
        (dict(remat_policy="dots"), False),
        (dict(scan_layers=False), False),
    ):
        logits, grads = logits_and_grads(base.config.replace(**override), with_grads)
        np.testing.assert_allclose(logits, ref_logits, atol=1e-6, rtol=0, err_msg=str(override))
        for a, b in zip(grads or [], ref_grads):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5, err_msg=str(override))
    # The override really reaches the model (load_hf forwards Qwen3Config fields).
    assert hf_io.load_hf(path, remat_policy="dots", scan_layers=False).config.remat_policy == "dots"
    # By default a shallow stack unrolls its cache-free pass; deep stacks scan.
    assert base.config.scan_layers is None and not base.config.scans()
    assert qwen3.Qwen3Config.qwen3_0_6b().scans()
    assert base.config.replace(scan_layers=True).scans()
    with pytest.raises(ValueError, match="scan_layers"):
        base.config.replace(scan_layers="yes")
