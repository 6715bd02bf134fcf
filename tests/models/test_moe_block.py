"""Qwen3-MoE's sparse MLP block (models/moe.py): the router's weights by hand, the block against transformers'
``Qwen3MoeSparseMoeBlock`` in float32 for every dispatch and both ``norm_topk_prob`` settings, the
dispatches' gradients against each other, and routing replay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from benchmarks.moe_block import hf_block
from envace_jax.models import moe


def _weights(seed, D=16, F=24, E=8):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(D, E)).astype(np.float32),
        (rng.normal(size=(E, D, F)) * 0.2).astype(np.float32),
        (rng.normal(size=(E, D, F)) * 0.2).astype(np.float32),
        (rng.normal(size=(E, F, D)) * 0.2).astype(np.float32),
    )


def test_routing_by_hand():
    router = np.zeros((2, 4), np.float32)
    router[0] = [2.0, 0.0, 1.0, np.log(3.0)]  # probabilities: e^2 = 7.39 > 3 > e > 1
    z = np.exp([2.0, 0.0, 1.0, np.log(3.0)])
    p = z / z.sum()
    h = jnp.asarray([[1.0, 0.0]])
    r = moe.route(h, jnp.asarray(router), top_k=2, norm_topk_prob=False)
    assert r.experts.tolist() == [[0, 3]]
    np.testing.assert_allclose(np.asarray(r.weights), [[p[0], p[3]]], rtol=1e-6)
    r = moe.route(h, jnp.asarray(router), top_k=2, norm_topk_prob=True)
    np.testing.assert_allclose(np.asarray(r.weights), [[p[0] / (p[0] + p[3]), p[3] / (p[0] + p[3])]], rtol=1e-6)
    # Replay: experts 1 and 2 as recorded, weighted by this forward's probabilities (renormalised).
    r = moe.route(h, jnp.asarray(router), top_k=2, norm_topk_prob=True, replay=jnp.asarray([[1, 2]]))
    assert r.experts.tolist() == [[1, 2]]
    np.testing.assert_allclose(np.asarray(r.weights), [[p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])]], rtol=1e-6)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("dispatch", moe.DISPATCHES)
def test_block_equals_transformers(dispatch, norm_topk_prob):
    weights = _weights(1)
    h = np.random.default_rng(2).normal(size=(3, 11, 16)).astype(np.float32)  # 33 tokens, 8 experts, top 3
    with torch.no_grad():
        want = hf_block(weights, 3, norm_topk_prob, impl="eager")(torch.from_numpy(h)).numpy()
    got, r = moe.sparse_block(
        jnp.asarray(h), *map(jnp.asarray, weights), top_k=3, norm_topk_prob=norm_topk_prob, dispatch=dispatch, block=4
    )
    assert got.shape == h.shape and r.experts.shape == (33, 3)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block", [1, 4, 64])
def test_dispatches_have_the_same_gradient(block):
    weights = tuple(map(jnp.asarray, _weights(3, E=6)))
    h = jnp.asarray(np.random.default_rng(4).normal(size=(29, 16)), jnp.float32)

    def loss(params, x, dispatch):
        y, _ = moe.sparse_block(x, *params, top_k=2, norm_topk_prob=True, dispatch=dispatch, block=block)
        return jnp.sum(jnp.sin(y))

    want = jax.grad(loss, argnums=(0, 1))(weights, h, "dense")
    for dispatch in ("ragged", "blocked", "megablox"):
        got = jax.grad(loss, argnums=(0, 1))(weights, h, dispatch)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_replay_keeps_the_recorded_experts_and_the_routers_gradient():
    router, gate, up, down = map(jnp.asarray, _weights(5))
    h = jnp.asarray(np.random.default_rng(6).normal(size=(40, 16)), jnp.float32)
    y, r = moe.sparse_block(h, router, gate, up, down, top_k=2, norm_topk_prob=True)
    again, _ = moe.sparse_block(h, router, gate, up, down, top_k=2, norm_topk_prob=True, replay=r.experts)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(y))  # replaying its own routing changes nothing
    # Weights that moved (an update later): some tokens would pick other experts; replay keeps the recorded ones.
    moved = router + 0.5 * jnp.asarray(np.random.default_rng(7).normal(size=router.shape), jnp.float32)
    fresh = moe.route(h, moved, 2, True)
    replayed = moe.route(h, moved, 2, True, replay=r.experts)
    assert (np.asarray(fresh.experts) != np.asarray(r.experts)).any()
    np.testing.assert_array_equal(np.asarray(replayed.experts), np.asarray(r.experts))

    def loss(w):
        out, _ = moe.sparse_block(h, w, gate, up, down, top_k=2, norm_topk_prob=True, replay=r.experts)
        return jnp.sum(out**2)

    assert float(jnp.abs(jax.grad(loss)(moved)).max()) > 0  # the router still learns under replay
    with pytest.raises(ValueError, match=r"expert ids \(40, 3\), expected \(40, 2\)"):
        moe.route(h, moved, 2, True, replay=jnp.zeros((40, 3), jnp.int32))
    with pytest.raises(ValueError, match="dispatch 'tokamax'"):
        moe.experts(h, fresh, gate, up, down, dispatch="tokamax")
