"""Query-blocked training attention (Qwen3Config.attention_block): rows longer than a block give the
logits of transformers' Qwen3 and the gradients of one dense block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envace_jax.models import hf_io
from tests.helpers_models import jit_forward, left_padded_batch, positions_from_mask, torch_forward


def test_blocked_attention_matches_transformers_and_dense_gradients(tiny_hf_qwen3):
    from flax import nnx

    path, tm = tiny_hf_qwen3(num_heads=4, num_kv_heads=2, head_dim=16)
    # 11 tokens in blocks of 4: three blocks, the last one padded; left padding inside the rows.
    model = hf_io.load_hf(path, attention_block=4)
    ids, mask = left_padded_batch(np.random.RandomState(3), 256, [11, 6])
    pos = positions_from_mask(mask)
    ref, _ = torch_forward(tm, ids, mask)
    args = (jnp.asarray(ids, jnp.int32), jnp.asarray(pos, jnp.int32), jnp.asarray(mask, jnp.int32))
    logits = np.asarray(jit_forward(model)(*args))
    valid = mask.astype(bool)
    assert np.abs(logits[valid] - ref[valid]).max() <= 1e-4

    graphdef, state = nnx.split(model)

    def grads(**override):
        def loss(st):
            m = nnx.merge(graphdef, st)
            m.config = m.config.replace(**override)
            out = m(*args)
            return jnp.sum(jax.nn.logsumexp(out, axis=-1) * args[2])

        return [np.asarray(g) for g in jax.tree.leaves(jax.jit(jax.grad(loss))(state))]

    dense = grads(attention_block=0)
    for override in (dict(), dict(remat_policy="full"), dict(scan_layers=False)):
        for a, b in zip(grads(**override), dense):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=str(override))
