"""The Trainer with LoRA adapters: only the adapters train and sit in the optimizer state, their gradient is the
chain rule of the full model's gradient through W + scale * A @ B, the base never moves, and checkpoints hold
the adapters."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from envace_jax.models import lora, qwen3
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from tests.rl.test_trainer_update import CFG, _batch

RANK, ALPHA = 3, 6.0


def _lora_model(seed=0):
    m = qwen3.Qwen3(CFG, rngs=nnx.Rngs(seed))
    lora.add_adapters(m, RANK, ALPHA, seed=seed)
    for i, (name, v) in enumerate(sorted(lora.adapter_arrays(m).items())):
        if name.endswith(lora.B_SUFFIX):  # nonzero B, so A's gradient is not trivially zero
            getattr(m.layers, name).set_value(0.05 * jax.random.normal(jax.random.key(10 + i), v.shape))
    return m


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _named(state) -> dict[str, np.ndarray]:
    return {str(k[-1]): np.asarray(v) for k, v in nnx.to_flat_state(state)}


def test_only_adapters_train_and_are_in_the_optimizer_state():
    m = _lora_model()
    tr = Trainer(m, OptimConfig(lr=1e-2, weight_decay=0.0), LossConfig(), micro_batch_size=2)
    trained = {str(k[-1]) for k, _ in nnx.to_flat_state(tr.params)}
    assert trained == set(lora.adapter_arrays(m))
    n_adapter = sum(x.size for x in jax.tree.leaves(tr.params))
    n_base = sum(x.size for x in jax.tree.leaves(tr.frozen))
    n_moments = sum(x.size for x in jax.tree.leaves(tr.opt_state) if getattr(x, "ndim", 0) > 0)
    assert n_moments == 2 * n_adapter and n_adapter < n_base / 3
    base_before = _host(tr.frozen)
    adapters_before = _host(tr.params)
    batch = _batch()
    tr.update(batch)
    jax.tree.map(np.testing.assert_array_equal, base_before, _host(tr.frozen))
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), adapters_before, _host(tr.params))
    assert min(jax.tree.leaves(moved)) > 0  # every adapter matrix moved


def test_adapter_gradient_is_the_chain_rule_of_the_full_gradient():
    """dL/dA = s G B^T and dL/dB = s A^T G, with G the full model's gradient at W + s A B (a full-training
    Trainer on the merged model): per layer and projection."""
    batch = _batch()
    m = _lora_model()
    s = m.config.lora_scale
    adapters = _host(lora.adapter_arrays(m))
    g_lora = _named(Trainer(m, micro_batch_size=3).gradients(batch))
    g_full = _named(Trainer(lora.merge_into_base(_lora_model()), micro_batch_size=6).gradients(batch))
    for name in lora.DEFAULT_TARGETS:
        a, b, g = adapters[name + lora.A_SUFFIX], adapters[name + lora.B_SUFFIX], g_full[name]
        L, r = a.shape[0], a.shape[-1]
        a2, b2 = a.reshape(L, -1, r), b.reshape(L, r, -1)
        g2 = g.reshape(L, a2.shape[1], b2.shape[2])
        want_a = s * np.einsum("lio,lro->lir", g2, b2).reshape(a.shape)
        want_b = s * np.einsum("lir,lio->lro", a2, g2).reshape(b.shape)
        np.testing.assert_allclose(g_lora[name + lora.A_SUFFIX], want_a, rtol=2e-4, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(g_lora[name + lora.B_SUFFIX], want_b, rtol=2e-4, atol=1e-8, err_msg=name)


def test_micro_batches_and_state_dict_round_trip():
    batch = _batch()
    results = []
    for mbs in (6, 2):
        tr = Trainer(_lora_model(), OptimConfig(lr=1e-2), LossConfig(kl_coef=0.1), micro_batch_size=mbs)
        results.append((tr.update(batch)["loss"], _host(tr.params), tr))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), results[0][1], results[1][1])
    # a checkpoint's trainer state holds the adapters and their moments, nothing of the base
    tr = results[0][2]
    state = tr.state_dict()
    assert {str(k[-1]) for k, _ in nnx.to_flat_state(state["params"])} == set(lora.adapter_arrays(tr.model))
    fresh = Trainer(_lora_model(), OptimConfig(lr=1e-2), LossConfig(kl_coef=0.1), micro_batch_size=6)
    fresh.load_state_dict(jax.tree.map(np.asarray, state))
    a, b = tr.update(batch), fresh.update(batch)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-8)
    jax.tree.map(close, _host(tr.params), _host(fresh.params))
