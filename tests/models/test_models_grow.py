"""Depth up-scaling (models/grow.py): the grown model is deeper and, at step 0, transformers' own Qwen3 gives
it the same logits as the original; training then moves the silenced copies."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.models import hf_io
from envace_jax.models.grow import grow_depth
from tests.helpers_models import torch_forward


@pytest.mark.parametrize("factor,tie", [(2, False), (3, True)], ids=["x2-untied", "x3-tied"])
def test_grown_model_exported_to_transformers_matches_the_original(tiny_hf_qwen3, tmp_path, factor, tie):
    from transformers import AutoModelForCausalLM

    path, original = tiny_hf_qwen3(tie=tie)
    grown = grow_depth(hf_io.load_hf(path), factor)
    assert grown.config.num_layers == 2 * factor
    hf_io.save_hf(grown, tmp_path / "grown")
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "grown")).eval()
    assert reloaded.config.num_hidden_layers == 2 * factor
    ids = np.random.RandomState(1).randint(3, 256, (2, 12))
    want, _ = torch_forward(original, ids)
    got, _ = torch_forward(reloaded, ids)
    assert np.abs(got - want).max() <= 1e-5
    # Every copy reads with its layer's own weights; only the copies' residual writers are silenced.
    base, deep = hf_io.load_hf(path).layers.arrays(), grown.layers.arrays()
    for name, w in deep.items():
        for j in range(w.shape[0]):
            silenced = j % factor != 0 and name in ("o_proj", "down_proj")
            want_w = np.asarray(base[name][j // factor])
            np.testing.assert_array_equal(
                np.asarray(w[j]), np.zeros_like(want_w) if silenced else want_w, err_msg=f"{name}[{j}]"
            )


def test_grown_copies_learn(tiny_hf_qwen3):
    """The silenced output projections get gradients, so the new depth is trainable (not a dead identity)."""
    import jax
    from flax import nnx

    path, _ = tiny_hf_qwen3()
    grown = grow_depth(hf_io.load_hf(path), 2)
    ids = jnp.asarray(np.random.RandomState(2).randint(3, 256, (2, 12)), jnp.int32)

    def loss(model):
        logits = model(ids[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1))

    grads = nnx.grad(loss)(grown)
    o = np.asarray(grads.layers.o_proj[...])
    assert np.abs(o[1]).max() > 0 and np.abs(o[3]).max() > 0


def test_grow_depth_rejects_a_factor_below_one(tiny_hf_qwen3):
    path, _ = tiny_hf_qwen3()
    with pytest.raises(ValueError, match="factor must be at least 1"):
        grow_depth(hf_io.load_hf(path), 0)
