"""LoRA adapters against PEFT: our model with adapters, PEFT's ``PeftModel`` on transformers' Qwen3 with the adapter
we write, and the merged export in transformers give the same logits; PEFT's own adapters load into ours; the
sampler's prepared weights are merged once."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.models import hf_io, lora, peft_io
from tests.helpers_models import jit_forward, make_tiny_hf_qwen3, torch_forward

peft = pytest.importorskip("peft")


def _random_b(model, seed=1, std=0.05):
    """Nonzero B matrices (fresh adapters are zero there), so every adapter changes the outputs."""
    for i, (name, v) in enumerate(sorted(lora.adapter_arrays(model).items())):
        if name.endswith(lora.B_SUFFIX):
            getattr(model.layers, name).set_value(std * jax.random.normal(jax.random.key(seed + i), v.shape))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    make_tiny_hf_qwen3(d, seed=3, num_layers=2)
    return d


IDS = np.array([[5, 17, 3, 99, 42, 7, 250, 1, 64]], np.int64)


@pytest.mark.parametrize(
    "rank,alpha,targets,rslora",
    [(4, 8, lora.DEFAULT_TARGETS, False), (2, 7, ("q_proj", "v_proj", "down_proj"), False), (8, 16, ("o_proj",), True)],
)
def test_our_adapter_in_peft_gives_our_logits(hf_dir, tmp_path, rank, alpha, targets, rslora):
    from transformers import Qwen3ForCausalLM

    model = hf_io.load_hf(hf_dir)
    base_logits = np.asarray(jit_forward(model)(jnp.asarray(IDS, jnp.int32)))
    lora.add_adapters(model, rank, alpha, targets, seed=0, rslora=rslora)
    _random_b(model)
    ours = np.asarray(jit_forward(model)(jnp.asarray(IDS, jnp.int32)))
    assert np.abs(ours - base_logits).max() > 1e-2  # the adapters do change the model

    cfg = peft_io.save_adapter(model, str(tmp_path / "adapter"), base=str(hf_dir), rslora=rslora)
    assert cfg["r"] == rank and cfg["lora_alpha"] == alpha and cfg["target_modules"] == list(targets)
    hf = Qwen3ForCausalLM.from_pretrained(str(hf_dir)).eval()
    with _no_missing_key_warning():
        peft_model = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter"))
    theirs, _ = torch_forward(peft_model, IDS)
    np.testing.assert_allclose(theirs, ours, rtol=2e-4, atol=2e-4)

    # the merged export (save_hf on a model with adapters writes W + scale * A @ B) in plain transformers
    hf_io.save_hf(model, tmp_path / "merged")
    merged = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    np.testing.assert_allclose(torch_forward(merged, IDS)[0], ours, rtol=2e-4, atol=2e-4)
    assert lora.adapter_arrays(model)  # the live model keeps its adapters


class _no_missing_key_warning:
    """PEFT only warns about adapter tensors it could not place; such a warning here is a failure."""

    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self._log = self._cm.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        bad = [str(w.message) for w in self._log if "missing adapter keys" in str(w.message).lower()]
        assert not bad, bad


def test_peft_trained_adapter_loads_into_ours(hf_dir, tmp_path):
    """An adapter made by PEFT itself (its own init, random B set through torch) loads into our model and gives
    PEFT's logits: the names and layouts we read are PEFT's."""
    import torch
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(str(hf_dir)).eval()
    conf = peft.LoraConfig(r=3, lora_alpha=6, target_modules=["k_proj", "up_proj", "o_proj"], lora_dropout=0.0)
    pm = peft.get_peft_model(hf, conf)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn_like(p))
    pm.save_pretrained(str(tmp_path / "theirs"))
    theirs, _ = torch_forward(pm.eval(), IDS)

    model = peft_io.load_adapter(hf_io.load_hf(hf_dir), str(tmp_path / "theirs"))
    assert sorted(lora.adapted(lora.adapter_arrays(model))) == ["k_proj", "o_proj", "up_proj"]
    ours = np.asarray(jit_forward(model)(jnp.asarray(IDS, jnp.int32)))
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)


def test_misnamed_or_misshapen_adapters_are_refused(hf_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    model = hf_io.load_hf(hf_dir)
    lora.add_adapters(model, 2, 4, ("q_proj",))
    peft_io.save_adapter(model, str(tmp_path / "a"))
    tensors = load_file(str(tmp_path / "a" / peft_io.WEIGHTS_FILE))
    name = peft_io.tensor_name(1, "q_proj", "A")

    renamed = dict(tensors)
    renamed[name.replace("self_attn", "attn")] = renamed.pop(name)  # a Gemma-style path PEFT would skip
    save_file(renamed, str(tmp_path / "a" / peft_io.WEIGHTS_FILE))
    with pytest.raises(ValueError, match="1 missing .*1 unexpected"):
        peft_io.load_adapter(hf_io.load_hf(hf_dir), str(tmp_path / "a"))

    reshaped = dict(tensors)
    reshaped[name] = reshaped[name][:, :-1]
    save_file(reshaped, str(tmp_path / "a" / peft_io.WEIGHTS_FILE))
    with pytest.raises(ValueError, match="1 of the wrong shape"):
        peft_io.load_adapter(hf_io.load_hf(hf_dir), str(tmp_path / "a"))

    cfg = json.loads((tmp_path / "a" / peft_io.CONFIG_FILE).read_text())
    (tmp_path / "a" / peft_io.CONFIG_FILE).write_text(json.dumps(dict(cfg, use_dora=True, bias="all")))
    with pytest.raises(ValueError, match="use_dora=True; bias='all'"):
        peft_io.load_adapter(hf_io.load_hf(hf_dir), str(tmp_path / "a"))


def test_the_sampler_reads_merged_weights(hf_dir):
    """The cached (sampling) path reads weights prepared once with the adapters folded in: no adapter arrays
    reach a decode step, and its logits are the training path's."""
    model = hf_io.load_hf(hf_dir)
    lora.add_adapters(model, 4, 8)
    _random_b(model)
    layers = model.decode_weights().layers
    assert all(not lora.adapted(p) for p in layers)
    stacked = model.layers.arrays()
    w = np.asarray(layers[1]["q_proj"])
    a, b = np.asarray(stacked["q_proj_lora_a"][1]), np.asarray(stacked["q_proj_lora_b"][1])
    want = np.asarray(stacked["q_proj"][1]) + model.config.lora_scale * np.einsum("dr,rnh->dnh", a, b)
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
    ids = jnp.asarray(IDS[:, :6], jnp.int32)
    cached, _ = model(ids, cache=model.init_cache(1, 16), decode_weights=model.decode_weights())
    np.testing.assert_allclose(np.asarray(cached), np.asarray(model(ids)), rtol=2e-4, atol=2e-4)
