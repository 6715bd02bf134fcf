"""Hand-written backward passes of the training step against independent truths: autodiff of the plain
formulas, and torch autograd through transformers' Qwen3ForCausalLM for the whole SFT gradient."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.models import hf_io, vjp_ops
from envace_jax.models.numerics import MASK_VALUE
from envace_jax.rl.batch import build_batch
from envace_jax.rl.trainer import OptimConfig, Trainer
from envace_jax.rl.types import ACT, Generation


def _plain_attention(q, k, v, mask):
    B, T, N, H = q.shape
    K = k.shape[2]
    qg = q.reshape(B, T, K, N // K, H)
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k) * H**-0.5
    p = jax.nn.softmax(jnp.where(mask[:, None, None], s, MASK_VALUE), axis=-1)
    return jnp.einsum("bkgts,bskh->btkgh", p, v).reshape(B, T, N, H)


def test_dense_values_and_gradients_equal_autodiff():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((7, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((5, 3)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((7, 3)), jnp.float32)
    ours = jax.value_and_grad(lambda x, w: jnp.sum(vjp_ops.dense(x, w) * cot), (0, 1))(x, w)
    plain = jax.value_and_grad(lambda x, w: jnp.sum((x @ w) * cot), (0, 1))(x, w)
    np.testing.assert_allclose(ours[0], plain[0], rtol=1e-6)
    for a, b in zip(ours[1], plain[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # bfloat16 inputs: float32 accumulation, bf16 result and gradients.
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    y = vjp_ops.dense(xb, wb)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(y, np.float32), np.asarray(xb, np.float32) @ np.asarray(wb, np.float32), rtol=1e-2, atol=1e-2
    )
    gx, gw = jax.grad(lambda x, w: jnp.sum(vjp_ops.dense(x, w).astype(jnp.float32) * cot), (0, 1))(xb, wb)
    assert gx.dtype == gw.dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "n_heads,n_kv,T,causal",
    [(4, 2, 12, False), (2, 2, 12, False), (4, 1, 12, False), (4, 2, 64, True), (2, 1, 128, True)],
)
def test_attention_values_and_gradients_equal_autodiff_with_packing_and_padding(n_heads, n_kv, T, causal):
    """T=64 / 128 with causal=True run 2 / 4 query blocks that skip the keys after each block."""
    assert vjp_ops.causal_blocks(T) == {12: 1, 64: 2, 128: 4}[T]
    rng = np.random.default_rng(1)
    B, H = 2, 8
    q = jnp.asarray(rng.standard_normal((B, T, n_heads, H)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, T, n_kv, H)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, T, n_kv, H)), jnp.float32)
    # Row 0: two packed segments then padding; row 1: left padding. Padding queries see no key at all
    # (they attend uniformly to every key), and the cotangent on them is not zero, so their "no
    # gradient" rule is exercised.
    a, b = 5 * T // 12, 4 * T // 12
    seg = jnp.asarray([[1] * a + [2] * b + [0] * (T - a - b), [0] * (T // 3) + [1] * (T - T // 3)], jnp.int32)
    idx = jnp.arange(T)
    mask = (idx[None, :, None] >= idx[None, None, :]) & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    cot = jnp.asarray(rng.standard_normal((B, T, n_heads, H)), jnp.float32)
    ours = lambda q, k, v, mask: vjp_ops.attention(q, k, v, mask, causal=causal)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v, mask) * cot), (0, 1, 2)))(q, k, v)

    (lo, go), (lp, gp) = loss(ours), loss(_plain_attention)
    np.testing.assert_allclose(lo, lp, rtol=1e-5)
    np.testing.assert_allclose(ours(q, k, v, mask), _plain_attention(q, k, v, mask), atol=1e-5)
    for x, y in zip(go, gp):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_causal_attention_needs_square_scores():
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="causal attention needs as many keys as queries"):
        vjp_ops.attention(q, jnp.zeros((1, 6, 1, 8)), jnp.zeros((1, 6, 1, 8)), jnp.ones((1, 4, 6), bool), causal=True)


def _torch_sft_grads(tm, batch):
    """Gradient of the trainer's SFT loss (mean over trained tokens of -log p(target)) by torch autograd."""
    import torch

    tm.zero_grad(set_to_none=True)
    seg = torch.tensor(batch.segment_ids)
    logits = tm(
        input_ids=torch.tensor(batch.tokens, dtype=torch.long),
        attention_mask=(seg != 0).long(),
        position_ids=torch.tensor(batch.positions, dtype=torch.long),
    ).logits
    temp = torch.tensor(batch.temperature)[:, None, None]
    logp = torch.log_softmax(logits.float() / temp, -1)
    picked = logp.gather(-1, torch.tensor(batch.targets, dtype=torch.long)[..., None])[..., 0]
    w = torch.tensor(batch.loss_weights)
    (-(picked * w).sum() / w.sum()).backward()
    return {n: p.grad.numpy() for n, p in tm.named_parameters()}


@pytest.mark.parametrize("tie", [True, False])
def test_trainer_sft_gradient_equals_torch_autograd(tiny_hf_qwen3, tie):
    path, tm = tiny_hf_qwen3(tie=tie, num_heads=4, num_kv_heads=2, head_dim=16)
    model = hf_io.load_hf(path)
    rng = np.random.default_rng(2)
    rows = [(5, 7, 1.0), (9, 3, 0.7), (2, 12, 1.3)]  # prompt, response, sampling temperature
    gens = [
        Generation(
            ACT,
            rng.integers(3, 256, n_p).tolist(),
            rng.integers(3, 256, n_g).tolist(),
            [0.0] * n_g,
            "u",
            i,
            0,
            temperature=t,
        )
        for i, (n_p, n_g, t) in enumerate(rows)
    ]
    batch = build_batch(gens, [1.0] * 3, [0, 1, 2], max_len=32, length_multiple=8)
    trainer = Trainer(model, OptimConfig(), micro_batch_size=2)
    grads = trainer.gradients(batch, kind="sft")
    holder = copy.deepcopy(model)
    from flax import nnx

    nnx.update(holder, grads)
    ours = dict(hf_io.iter_hf_tensors(holder))
    want = _torch_sft_grads(tm.float().train(), batch)
    if tie:
        want.pop("lm_head.weight", None)  # shares storage with the embedding; its grad is the embedding's
    assert set(ours) == set(want)
    for name, g in want.items():
        scale = np.abs(g).max()
        np.testing.assert_allclose(ours[name], g, atol=2e-5 * max(scale, 1.0), rtol=1e-3, err_msg=name)
