"""The vocabulary head on the trained positions only: same log-probs and gradients as the plain
``log_softmax(h @ W)`` at every position, the host index built as worked out by hand, and Trainer
updates equal with and without the gather (one device here; several in test_trainer_update)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envace_jax.models import qwen3
from envace_jax.rl import placement
from envace_jax.rl.batch import build_batch
from envace_jax.rl.head_logprobs import gathered_token_logprobs
from envace_jax.rl.loss import token_logprobs
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import ACT, REHEARSE, Generation


def test_trained_positions_by_hand():
    w = np.zeros((4, 64), np.float32)
    w[0, 5:9] = 1.0  # group 0: flat positions 5..8
    w[1, 0] = 0.5  # group 0: 64 (a fractional weight still counts as trained)
    w[3, 60:64] = 1.0  # flat 3 * 64 + 60 ..; in two groups, group 1 (rows 2-3): 64 + 60 ..
    one = placement.trained_positions(w, 1)
    # 256 positions: steps of max(64, 256/16 rounded up to 64) = 64, so K = 64; padding = 256.
    assert one.shape == (1, 64) and one.dtype == np.int32
    np.testing.assert_array_equal(one[0, :9], [5, 6, 7, 8, 64, 252, 253, 254, 255])
    assert (one[0, 9:] == 256).all()
    two = placement.trained_positions(w, 2)
    np.testing.assert_array_equal(two[0, :5], [5, 6, 7, 8, 64])
    np.testing.assert_array_equal(two[1, :4], [124, 125, 126, 127])
    assert (two[0, 5:] == 128).all() and (two[1, 4:] == 128).all()
    # K = 64 of a group's 128 positions is fine; of 64 positions (four groups) it exceeds 3/4: no gather.
    assert placement.trained_positions(w, 4) is None
    assert placement.trained_positions(w, 3) is None  # 4 rows do not split into 3 groups
    w[:, :] = 1.0
    assert placement.trained_positions(w, 1) is None  # everything trained: nothing to save
    w[:, :] = 0.0
    assert placement.trained_positions(w, 1).shape == (1, 64)  # nothing trained: all padding
    assert (placement.trained_positions(w, 1) == 256).all()


@pytest.mark.parametrize("layout", ["vd", "dv"])
def test_gathered_logprobs_and_gradients_equal_the_plain_head(layout):
    rng = np.random.default_rng(0)
    B, T, D, V = 4, 24, 16, 50
    hidden = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(V, D) if layout == "vd" else (D, V)) * 0.3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    temp = jnp.asarray([[0.7], [1.0], [1.3], [0.9]], jnp.float32)
    w = np.zeros((B, T), np.float32)
    w[0, 3:7] = 1
    w[1, 20:24] = 1
    w[3, :2] = 1
    index = jnp.asarray(placement.trained_positions(w, 2, max_share=1.0))
    assert index.shape == (2, 48) and int((index < 48).sum()) == 10  # two groups of 2 rows x 24

    def plain(h, wt):
        logits = jnp.einsum("btd,vd->btv" if layout == "vd" else "btd,dv->btv", h, wt)
        return token_logprobs(logits / temp[..., None], targets)

    def gathered(h, wt):
        return gathered_token_logprobs(h, wt, targets, index, temp, head_layout=layout)

    ref, got = plain(hidden, head), gathered(hidden, head)
    np.testing.assert_allclose(np.asarray(got)[w > 0], np.asarray(ref)[w > 0], rtol=1e-5, atol=1e-5)
    assert not np.asarray(got)[w == 0].any()
    cot = jnp.asarray(rng.normal(size=(B, T)), jnp.float32) * w  # a loss that weights trained tokens only
    g_ref = jax.grad(lambda h, wt: jnp.sum(plain(h, wt) * cot), argnums=(0, 1))(hidden, head)
    g_got = jax.grad(lambda h, wt: jnp.sum(gathered(h, wt) * cot), argnums=(0, 1))(hidden, head)
    for a, b in zip(g_ref, g_got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    assert not np.asarray(g_got[0])[w == 0].any()  # untrained positions get no gradient


def _long_prompt_batch(seed=0):
    rng = np.random.default_rng(seed)
    gens = []
    for i in range(8):
        prompt = rng.integers(1, 64, rng.integers(40, 90)).tolist()
        gen = rng.integers(1, 64, rng.integers(3, 12)).tolist()
        gens.append(
            Generation(
                ACT if i % 2 == 0 else REHEARSE,
                prompt,
                gen,
                rng.normal(-3, 0.5, len(gen)).tolist(),
                f"u{i // 4}",
                i,
                0,
                temperature=float(rng.choice([0.6, 1.0])),
            )
        )
    adv = rng.normal(size=len(gens))
    return build_batch(gens, adv, [i // 4 for i in range(len(gens))], max_len=128)


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_trainer_updates_equal_with_and_without_the_gather(kind):
    cfg = qwen3.Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        tie_word_embeddings=(kind == "rl"),
    )
    batch = _long_prompt_batch()
    out = []
    for gather in (False, True):
        tr = Trainer(
            qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)),
            OptimConfig(lr=1e-2),
            LossConfig(kl_coef=0.05 if kind == "rl" else 0.0),
            micro_batch_size=4,
            gather_trained=gather,
        )
        parts = tr._local_micro_batches(batch)
        # Only the gathered trainer builds an index, and it is the saving kind (well under the positions).
        assert all(("trained_index" in mb) == gather for mb in parts)
        if gather:
            assert all(mb["trained_index"].shape[1] <= mb["tokens"].size // 2 for mb in parts)
        logp = tr.compute_logprobs(batch)
        metrics = [tr.update(batch, kind=kind) for _ in range(2)]
        out.append((logp, metrics, jax.tree.map(np.asarray, tr.params)))
    (lp0, m0, p0), (lp1, m1, p1) = out
    np.testing.assert_allclose(lp1, lp0, rtol=1e-5, atol=1e-5)
    for a, b in zip(m0, m1):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5), p0, p1)
