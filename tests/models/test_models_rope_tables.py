"""RoPE's tables: their values, and on CPU that one forward computes them once, not once per layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envace_jax.models import qwen3


def test_rope_tables_values_by_hand():
    # head_dim 4, theta 100: inverse frequencies 100^0 = 1 and 100^(-2/4) = 0.1.
    positions = jnp.asarray([[0, 3], [7, 1]], jnp.int32)
    cos, sin = qwen3.rope_tables(positions, 4, 100.0)
    assert cos.shape == sin.shape == (2, 2, 1, 2)
    angles = np.asarray([[[0.0, 0.0], [3.0, 0.3]], [[7.0, 0.7], [1.0, 0.1]]])
    np.testing.assert_allclose(np.asarray(cos)[:, :, 0], np.cos(angles), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(sin)[:, :, 0], np.sin(angles), rtol=1e-6, atol=1e-7)


def _cosines_in_compiled_forward(num_layers: int) -> int:
    cfg = qwen3.Qwen3Config.tiny(vocab_size=64, hidden_size=32, num_layers=num_layers)
    graph, state = nnx.split(qwen3.init_model(cfg, seed=0))
    ids = jnp.ones((2, 8), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
    segments = jnp.ones((2, 8), jnp.int32)
    fwd = jax.jit(lambda s, i, p, g: nnx.merge(graph, s).final_hidden(i, p, g))
    return fwd.lower(state, ids, positions, segments).compile().as_text().count("cosine(")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the conditional is XLA CPU's workaround only")
def test_rope_cosines_are_computed_once_per_forward_not_per_layer():
    # XLA CPU used to copy the tables' producer into every layer's q and k rotation: 2 cosines per layer.
    # rope_tables makes them inside a conditional (both branches the same), so the count does not grow.
    two, five = _cosines_in_compiled_forward(2), _cosines_in_compiled_forward(5)
    assert two == five <= 2, (two, five)
