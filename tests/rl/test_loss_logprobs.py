"""Chunked log-probs (no full [B, T, V] logits) against full logits, and through a real Qwen3 model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.models import qwen3
from envace_jax.rl.head_logprobs import fused_token_logprobs
from envace_jax.rl.loss import chunked_token_logprobs, model_token_logprobs, token_entropy, token_logprobs


@pytest.mark.parametrize("chunk,layout", [(3, "dv"), (4, "vd"), (64, "dv")])
def test_chunked_equals_full_values_and_gradients(chunk, layout):
    rng = np.random.default_rng(0)
    B, T, D, V = 2, 10, 8, 37  # T=10 is not a multiple of 3 or 4: the padded tail must be dropped
    h = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, V) if layout == "dv" else (V, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    cot = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)

    @jax.jit
    def both(h, w):
        def chunked(h, w):
            lp, ent = chunked_token_logprobs(h, w, y, 0.7, chunk_size=chunk, head_layout=layout, with_entropy=True)
            return jnp.sum(lp * cot) + jnp.sum(ent), (lp, ent)

        def full(h, w):
            logits = h @ (w if layout == "dv" else w.T)
            lp, ent = token_logprobs(logits, y, 0.7), token_entropy(logits, 0.7)
            return jnp.sum(lp * cot) + jnp.sum(ent), (lp, ent)

        return (
            jax.value_and_grad(chunked, (0, 1), has_aux=True)(h, w),
            jax.value_and_grad(full, (0, 1), has_aux=True)(h, w),
        )

    ((_, (lp_c, ent_c)), g_c), ((_, (lp_f, ent_f)), g_f) = both(h, w)
    np.testing.assert_allclose(lp_c, lp_f, atol=2e-5)
    np.testing.assert_allclose(ent_c, ent_f, atol=2e-5)
    for a, b in zip(g_c, g_f):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_model_token_logprobs_chunked_matches_full_logits(tie):
    cfg = qwen3.Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        tie_word_embeddings=tie,
    )
    model = qwen3.init_model(cfg, seed=1)
    ids = jnp.asarray(np.random.default_rng(2).integers(0, 96, (2, 9)), jnp.int32)
    tgt = jnp.roll(ids, -1, axis=1)
    seg = jnp.array([[1] * 9, [1] * 6 + [0] * 3], jnp.int32)

    @jax.jit
    def run(ids, tgt, seg):
        logits = model(ids, None, seg)
        lp, ent = model_token_logprobs(model, ids, tgt, 0.8, segment_ids=seg, chunk_size=4, with_entropy=True)
        plain = model_token_logprobs(model, ids, tgt, 0.8, segment_ids=seg)
        return token_logprobs(logits, tgt, 0.8), token_entropy(logits, 0.8), lp, ent, plain

    full, full_ent, lp, ent, plain = run(ids, tgt, seg)
    np.testing.assert_allclose(lp, full, atol=2e-5)
    np.testing.assert_allclose(ent, full_ent, atol=2e-5)
    np.testing.assert_allclose(plain, full, atol=1e-6)


@pytest.mark.parametrize("layout", ["dv", "vd"])
def test_fused_head_equals_full_logits_values_and_gradients(layout):
    """The hand-written backward (rl.head_logprobs) against autodiff through full logits, with a
    temperature per row."""
    rng = np.random.default_rng(3)
    B, T, D, V = 3, 7, 8, 41
    h = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, V) if layout == "dv" else (V, D)), jnp.float32)
    y = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    temp = jnp.asarray([0.7, 1.0, 1.6], jnp.float32)
    cot = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)

    def fused(h, w):
        lp = fused_token_logprobs(h, w, y, temp[:, None], head_layout=layout)
        return jnp.sum(lp * cot), lp

    def full(h, w):
        lp = token_logprobs(h @ (w if layout == "dv" else w.T), y, temp[:, None, None])
        return jnp.sum(lp * cot), lp

    (_, lp_f), g_f = jax.jit(jax.value_and_grad(fused, (0, 1), has_aux=True))(h, w)
    (_, lp_r), g_r = jax.jit(jax.value_and_grad(full, (0, 1), has_aux=True))(h, w)
    np.testing.assert_allclose(lp_f, lp_r, atol=2e-5)
    for a, b in zip(g_f, g_r):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # A scalar temperature, and bfloat16 matmul inputs (float32 softmax) stay close.
    np.testing.assert_allclose(
        fused_token_logprobs(h, w, y, 0.7, head_layout=layout),
        token_logprobs(h @ (w if layout == "dv" else w.T), y, 0.7),
        atol=2e-5,
    )
    lp_bf = fused_token_logprobs(h, w, y, 1.0, head_layout=layout, compute_dtype="bfloat16")
    assert lp_bf.dtype == jnp.float32
    np.testing.assert_allclose(lp_bf, token_logprobs(h @ (w if layout == "dv" else w.T), y), atol=0.15)


def test_bad_input_names_the_problem():
    h, y = jnp.zeros((1, 4, 8)), jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="head_layout"):
        chunked_token_logprobs(h, jnp.zeros((8, 5)), y, head_layout="x")
    with pytest.raises(ValueError, match="does not match hidden size 8"):
        chunked_token_logprobs(h, jnp.zeros((7, 5)), y)
    with pytest.raises(ValueError, match="targets"):
        chunked_token_logprobs(h, jnp.zeros((8, 5)), jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="disagree"):
        token_logprobs(jnp.zeros((1, 4, 5)), jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="does not match hidden size 8"):
        fused_token_logprobs(h, jnp.zeros((5, 7)), y)
    with pytest.raises(ValueError, match="targets"):
        fused_token_logprobs(h, jnp.zeros((5, 8)), jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="temperature"):
        fused_token_logprobs(h, jnp.zeros((5, 8)), y, 0.0)
