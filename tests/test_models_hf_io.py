"""HF checkpoint import/export: transformers round trips, sharded files, config spellings, bad input."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from envace_jax.models import hf_io, qwen3
from helpers_models import jit_forward, torch_forward


def _params(model) -> dict:
    return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_save_hf_loads_in_transformers_with_same_logits(tiny_hf_qwen3, tmp_path, tie):
    from transformers import AutoModelForCausalLM

    path, tm = tiny_hf_qwen3(tie=tie, num_heads=8, num_kv_heads=2, head_dim=12)
    model = hf_io.load_hf(path)
    out = tmp_path / "export"
    files = hf_io.save_hf(model, out)
    assert files == ["model.safetensors"] and not (out / hf_io.INDEX_FILE).exists()
    assert ("lm_head.weight" in load_file(out / "model.safetensors")) == (not tie)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(reloaded).__name__ == "Qwen3ForCausalLM"
    ids = np.random.RandomState(0).randint(3, 256, (2, 10))
    ref, _ = torch_forward(reloaded, ids)
    ours = np.asarray(jit_forward(model)(jnp.asarray(ids, jnp.int32)))
    assert np.abs(ours - ref).max() <= 1e-4
    # ... and the exported weights are exactly the ones transformers started from.
    orig = load_file(os.path.join(path, "model.safetensors"))
    exported = load_file(out / "model.safetensors")
    assert set(exported) == set(orig) - ({"lm_head.weight"} if tie else set())
    for k in exported:
        np.testing.assert_array_equal(exported[k], orig[k], err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_save_load_is_bit_exact_and_sharded_checkpoints_load(tiny_hf_qwen3, tmp_path, dtype):
    path, _ = tiny_hf_qwen3()
    a = hf_io.load_hf(path, dtype=dtype)
    # ~20 KB shards: the 2-layer model (about 190 KB in f32) splits into many files with an index.
    files = hf_io.save_hf(a, tmp_path / "sharded", max_shard_size="20KB")
    assert len(files) > 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "sharded" / hf_io.INDEX_FILE).read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(files)
    assert set(index["weight_map"]) == set(hf_io.expected_hf_tensors(a.config))
    for f in files:  # each shard respects the limit unless it holds one tensor bigger than it
        tensors = load_file(tmp_path / "sharded" / f)
        assert len(tensors) == 1 or sum(t.nbytes for t in tensors.values()) <= 20_000
    assert json.loads((tmp_path / "sharded" / "config.json").read_text())["dtype"] == dtype
    b = hf_io.load_hf(tmp_path / "sharded", dtype=None)  # dtype=None keeps the checkpoint's dtype
    assert b.config == a.config
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == pb[k].dtype and pa[k].dtype == np.dtype(qwen3.as_dtype(dtype))
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


def test_transformers_sharded_checkpoint_loads(tiny_hf_qwen3, tmp_path):
    """A checkpoint sharded by transformers itself (not by us) loads and matches its logits."""
    path, tm = tiny_hf_qwen3()
    tm.save_pretrained(str(tmp_path / "hf_sharded"), max_shard_size="50KB")
    assert (tmp_path / "hf_sharded" / hf_io.INDEX_FILE).exists()
    model = hf_io.load_hf(tmp_path / "hf_sharded")
    ids = np.random.RandomState(1).randint(3, 256, (1, 7))
    ref, _ = torch_forward(tm, ids)
    assert np.abs(np.asarray(jit_forward(model)(jnp.asarray(ids, jnp.int32))) - ref).max() <= 1e-4


def _rewrite(path, fn):
    f = os.path.join(path, "model.safetensors")
    tensors = load_file(f)
    fn(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_bad_tensors_raise_errors_naming_them(tiny_hf_qwen3):
    path, _ = tiny_hf_qwen3()
    good = load_file(os.path.join(path, "model.safetensors"))
    restore = lambda t: (t.clear(), t.update(good))

    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        hf_io.load_hf(path)

    def wrong_shape(t):
        restore(t)
        t["model.layers.0.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)
    _rewrite(path, wrong_shape)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \(95, 64\), "
                                         r"expected \(96, 64\)"):
        hf_io.load_hf(path)

    def unexpected(t):
        restore(t)
        t["model.layers.0.self_attn.q_proj.bias"] = np.zeros((96,), np.float32)
    _rewrite(path, unexpected)
    with pytest.raises(ValueError, match=r"unexpected tensor.*model\.layers\.0\.self_attn\.q_proj\.bias"):
        hf_io.load_hf(path)

    _rewrite(path, restore)
    hf_io.load_hf(path)  # and the restored checkpoint loads again

    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf_io.load_hf(path)


def test_missing_shard_file_is_named(tiny_hf_qwen3, tmp_path):
    path, _ = tiny_hf_qwen3()
    files = hf_io.save_hf(hf_io.load_hf(path), tmp_path / "s", max_shard_size="50KB")
    os.remove(tmp_path / "s" / files[-1])
    with pytest.raises(FileNotFoundError, match=files[-1]):
        hf_io.load_hf(tmp_path / "s")


BASE_HF = dict(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=24)


@pytest.mark.parametrize("field, value, pattern", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, r"rope_scaling.*'yarn'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, r"rope_parameters.*'yarn'"),
    ("model_type", "qwen3_moe", r"model_type.*'qwen3_moe'"),
    ("use_sliding_window", True, r"use_sliding_window"),
    ("hidden_act", "gelu", r"hidden_act.*'gelu'"),
    ("attention_bias", True, r"attention_bias"),
    ("dtype", "int8", r"'int8'"),
])
def test_unsupported_config_fields_are_named(tmp_path, field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        qwen3.Qwen3Config.from_hf({**BASE_HF, field: value})
    # Through load_hf too: the config is checked before any tensor is read.
    (tmp_path / "config.json").write_text(json.dumps({**BASE_HF, field: value}))
    with pytest.raises(ValueError, match=pattern):
        hf_io.load_hf(tmp_path)


def test_from_hf_reads_4x_and_5x_spellings():
    v4 = qwen3.Qwen3Config.from_hf({**BASE_HF, "rope_theta": 5e6, "torch_dtype": "bfloat16",
                                    "rope_scaling": None})
    v5 = qwen3.Qwen3Config.from_hf({**BASE_HF, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6},
                                    "dtype": "bfloat16"})
    assert v4 == v5
    assert v4.rope_theta == 5e6 and v4.param_dtype == "bfloat16" and v4.dtype == "bfloat16"
    assert v4.head_dim == 24 and v4.num_kv_heads == 2
    # transformers' own config object (5.x spelling), and our to_hf() output read back.
    from transformers import Qwen3Config as HFConfig

    hf = HFConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, rope_theta=5e6)
    assert qwen3.Qwen3Config.from_hf(hf.to_dict()).rope_theta == 5e6
    assert qwen3.Qwen3Config.from_hf(v4.to_hf()) == v4


# Model cards of the dense Qwen3 family: total and non-embedding parameters, in billions.
CARDS = {"qwen3_0_6b": (0.6, 0.44), "qwen3_1_7b": (1.7, 1.4), "qwen3_4b": (4.0, 3.6), "qwen3_8b": (8.2, 6.95),
         "qwen3_14b": (14.8, 13.2), "qwen3_32b": (32.8, 31.2)}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_presets_have_model_card_parameter_counts(name):
    cfg = getattr(qwen3.Qwen3Config, name)()
    abstract = nnx.eval_shape(lambda: qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing was allocated
    total = sum(int(np.prod(x.shape)) for x in leaves)
    assert total == cfg.num_params()
    embed = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    card_total, card_non_embed = CARDS[name]
    decimals = lambda v: len(repr(v).split(".")[1])  # compare at the precision the card quotes
    assert round(total / 1e9, decimals(card_total)) == card_total
    assert round((total - embed) / 1e9, decimals(card_non_embed)) == card_non_embed
    # The exact figures quoted elsewhere: Qwen3-0.6B 596,049,920 and Qwen3-8B 8,190,735,360.
    if name == "qwen3_0_6b":
        assert total == 596_049_920
    if name == "qwen3_8b":
        assert total == 8_190_735_360


def test_parse_size():
    assert hf_io.parse_size("5GB") == 5 * 10**9
    assert hf_io.parse_size("2GiB") == 2 * 2**30
    assert hf_io.parse_size("500MB") == 500 * 10**6
    assert hf_io.parse_size(123) == 123
    with pytest.raises(ValueError, match="'5 gigs'"):
        hf_io.parse_size("5 gigs")
