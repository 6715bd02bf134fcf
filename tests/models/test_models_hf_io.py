"""HF checkpoint import/export: transformers round trips, sharded files, config spellings, bad input, re-export
into a used folder (stale files, stopped and killed exports), generation ids, file modes."""

from __future__ import annotations

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from envace_jax.models import hf_io, qwen3
from tests.helpers_models import jit_forward, torch_forward
from tests.helpers_paths import ROOT


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
    with pytest.raises(
        hf_io.WeightsError, match=r"model\.safetensors: missing tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"
    ):
        hf_io.load_hf(path)

    def wrong_shape(t):
        restore(t)
        t["model.layers.0.mlp.up_proj.weight"] = np.zeros((95, 64), np.float32)

    _rewrite(path, wrong_shape)
    with pytest.raises(
        hf_io.WeightsError,
        match=r"model\.safetensors: tensor model\.layers\.0\.mlp\.up_proj\.weight "
        r"has shape \(95, 64\), expected \(96, 64\)",
    ):
        hf_io.load_hf(path)

    def unexpected(t):
        restore(t)
        t["model.layers.0.self_attn.q_proj.bias"] = np.zeros((96,), np.float32)

    _rewrite(path, unexpected)
    with pytest.raises(hf_io.WeightsError, match=r"unexpected tensor.*model\.layers\.0\.self_attn\.q_proj\.bias"):
        hf_io.load_hf(path)

    def integer(t):
        restore(t)
        t["model.norm.weight"] = np.ones((64,), np.int32)

    _rewrite(path, integer)
    with pytest.raises(hf_io.WeightsError, match=r"tensor model\.norm\.weight has dtype I32"):
        hf_io.load_hf(path)

    _rewrite(path, restore)
    hf_io.load_hf(path)  # and the restored checkpoint loads again
    assert issubclass(hf_io.WeightsError, ValueError)  # what callers caught before keeps working

    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf_io.load_hf(path)


def test_missing_shard_file_is_named(tiny_hf_qwen3, tmp_path):
    path, _ = tiny_hf_qwen3()
    files = hf_io.save_hf(hf_io.load_hf(path), tmp_path / "s", max_shard_size="50KB")
    os.remove(tmp_path / "s" / files[-1])
    with pytest.raises(FileNotFoundError, match=files[-1]):
        hf_io.load_hf(tmp_path / "s")


BASE_HF = dict(
    model_type="qwen3",
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
)


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, r"rope_scaling.*'yarn'"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, r"rope_parameters.*'yarn'"),
        ("model_type", "mixtral", r"model_type.*'mixtral'"),
        ("use_sliding_window", True, r"use_sliding_window"),
        ("hidden_act", "gelu", r"hidden_act.*'gelu'"),
        ("attention_bias", True, r"attention_bias"),
        ("dtype", "int8", r"'int8'"),
    ],
)
def test_unsupported_config_fields_are_named(tmp_path, field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        qwen3.Qwen3Config.from_hf({**BASE_HF, field: value})
    # Through load_hf too: the config is checked before any tensor is read.
    (tmp_path / "config.json").write_text(json.dumps({**BASE_HF, field: value}))
    with pytest.raises(ValueError, match=pattern):
        hf_io.load_hf(tmp_path)


def test_from_hf_reads_4x_and_5x_spellings():
    v4 = qwen3.Qwen3Config.from_hf({**BASE_HF, "rope_theta": 5e6, "torch_dtype": "bfloat16", "rope_scaling": None})
    v5 = qwen3.Qwen3Config.from_hf(
        {**BASE_HF, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}, "dtype": "bfloat16"}
    )
    assert v4 == v5
    assert v4.rope_theta == 5e6 and v4.param_dtype == "bfloat16" and v4.dtype == "bfloat16"
    assert v4.head_dim == 24 and v4.num_kv_heads == 2
    # transformers' own config object (5.x spelling), and our to_hf() output read back.
    from transformers import Qwen3Config as HFConfig

    hf = HFConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        rope_theta=5e6,
    )
    assert qwen3.Qwen3Config.from_hf(hf.to_dict()).rope_theta == 5e6
    assert qwen3.Qwen3Config.from_hf(v4.to_hf()) == v4


# Model cards of the dense Qwen3 family: total and non-embedding parameters, in billions.
CARDS = {
    "qwen3_0_6b": (0.6, 0.44),
    "qwen3_1_7b": (1.7, 1.4),
    "qwen3_4b": (4.0, 3.6),
    "qwen3_8b": (8.2, 6.95),
    "qwen3_14b": (14.8, 13.2),
    "qwen3_32b": (32.8, 31.2),
}


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


# ------------------------------------------------------------------------------------------
# re-exporting into a used folder; a killed export; generation ids; file modes; unreadable files

FIVE_SHARDS, THREE_SHARDS = 32_500, 50_000  # shard sizes that split _tiny() (128 KB in f32) into 5 / 3 files


def _tiny(seed: int) -> qwen3.Qwen3:
    """Two seeds: two different models of one architecture (an old and a new export)."""
    cfg = qwen3.Qwen3Config.tiny(256, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
    return qwen3.init_model(cfg, seed=seed)


def _weights_files(d) -> set[str]:
    return {n for n in os.listdir(d) if n.endswith(".safetensors") or n == hf_io.INDEX_FILE}


def _which(d, old, new, logits: bool = True) -> str:
    """'old' or 'new': the model whose weights both our loader and transformers read from ``d`` (checked
    by logits, or with ``logits=False`` by comparing transformers' tensors with the model's HF tensors)."""
    import torch
    from transformers import AutoModelForCausalLM

    ours = _params(hf_io.load_hf(d))
    same = lambda m: all(np.array_equal(ours[k], v) for k, v in _params(m).items())
    found = [name for name, m in (("old", old), ("new", new)) if same(m)]
    assert len(found) == 1, f"{d}: our loader reads neither model whole"
    model = old if found[0] == "old" else new
    hf = AutoModelForCausalLM.from_pretrained(str(d), torch_dtype=torch.float32).eval()
    if logits:
        ids = np.random.RandomState(0).randint(0, 256, (1, 9))
        ref, _ = torch_forward(hf, ids)
        want = np.asarray(jit_forward(model)(jnp.asarray(ids, jnp.int32)))
        assert np.abs(ref - want).max() <= 1e-4, f"{d}: transformers reads other weights than our loader"
    else:
        theirs = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
        for name, want in hf_io.iter_hf_tensors(model):
            assert np.array_equal(theirs[name], want), f"{d}: transformers reads another {name} than our loader"
    return found[0]


@pytest.mark.parametrize(
    "first, second",
    [(FIVE_SHARDS, "5GB"), ("5GB", THREE_SHARDS), (FIVE_SHARDS, FIVE_SHARDS)],
    ids=["5_shards_then_1_file", "1_file_then_3_shards", "5_shards_then_5_shards"],
)
def test_reexport_into_a_used_folder_replaces_the_weights(tmp_path, first, second):
    old, new = _tiny(0), _tiny(1)
    d = tmp_path / "export"
    (d / "mine").mkdir(parents=True)
    (d / "notes.txt").write_text("my notes")
    (d / "mine" / "model-00001-of-00002.safetensors").write_text("not ours to remove: another folder")
    old_files = hf_io.save_hf(old, d, max_shard_size=first)
    assert _which(d, old, new) == "old"
    new_files = hf_io.save_hf(new, d, max_shard_size=second)
    assert len(old_files) == (1 if first == "5GB" else 5)
    assert len(new_files) == (1 if second == "5GB" else 3 if second == THREE_SHARDS else 5)
    if len(new_files) == 1:
        assert _weights_files(d) == {hf_io.SINGLE_FILE}
    else:
        assert _weights_files(d) == set(new_files) | {hf_io.INDEX_FILE}
        assert set(json.loads((d / hf_io.INDEX_FILE).read_text())["weight_map"].values()) == set(new_files)
    assert _which(d, old, new) == "new"
    # The user's files stay, and no temporary is left behind.
    assert (d / "notes.txt").read_text() == "my notes"
    assert (d / "mine" / "model-00001-of-00002.safetensors").read_text().startswith("not ours")
    assert not [n for n in os.listdir(d) if n.endswith(".partial")]


def test_a_folder_with_a_stale_index_reads_its_single_file(tmp_path):
    """A folder left by an earlier exporter: an index with its shards beside a newer model.safetensors.
    transformers reads the single file; so must we."""
    old, new = _tiny(0), _tiny(1)
    hf_io.save_hf(old, tmp_path / "d", max_shard_size=FIVE_SHARDS)
    hf_io.save_hf(new, tmp_path / "single")
    os.rename(tmp_path / "single" / hf_io.SINGLE_FILE, tmp_path / "d" / hf_io.SINGLE_FILE)
    assert _which(tmp_path / "d", old, new) == "new"


class _Killed(BaseException):
    """Stands for the process dying at a chosen step of an export."""


@pytest.mark.parametrize(
    "first, second",
    [(FIVE_SHARDS, "5GB"), ("5GB", THREE_SHARDS), (FIVE_SHARDS, FIVE_SHARDS)],
    ids=["5_shards_to_1_file", "1_file_to_3_shards", "5_shards_to_5_shards"],
)
def test_an_export_stopped_at_any_step_leaves_one_whole_model(tmp_path, monkeypatch, first, second):
    """Stops the second export before each of its renames and removals in turn: the folder then holds the
    old model or the new one, whole, for our loader and transformers alike."""
    old, new = _tiny(0), _tiny(1)
    real = {"replace": os.replace, "remove": os.remove}
    seen = []
    for stop_at in range(1, 40):
        d = tmp_path / f"stop{stop_at}"
        hf_io.save_hf(old, d, max_shard_size=first)
        calls = {"n": 0}

        def step(op):
            def run(*args, **kw):
                calls["n"] += 1
                if calls["n"] == stop_at:
                    raise _Killed
                return real[op](*args, **kw)

            return run

        monkeypatch.setattr(os, "replace", step("replace"))
        monkeypatch.setattr(os, "remove", step("remove"))
        try:
            new_files = hf_io.save_hf(new, d, max_shard_size=second)
            finished = True
        except _Killed:
            finished = False
        finally:
            monkeypatch.setattr(os, "replace", real["replace"])
            monkeypatch.setattr(os, "remove", real["remove"])
        seen.append(_which(d, old, new, logits=False))
        if finished:
            break
    else:
        pytest.fail("the export never finished")
    # The old model up to the switch, the new one from it on; nothing in between.
    switch = seen.index("new")
    assert seen[:switch] == ["old"] * switch and seen[switch:] == ["new"] * (len(seen) - switch)
    assert switch >= len(new_files) > 0  # every new shard was written before the switch


KILL_SCRIPT = """
import os, signal, sys
from envace_jax.models import hf_io, qwen3
cfg = qwen3.Qwen3Config.tiny(256, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
d = sys.argv[1]
hf_io.save_hf(qwen3.init_model(cfg, seed=0), d, max_shard_size=%d)
renames = {"n": 0}
real = os.replace
def replace(*a):
    renames["n"] += 1
    if renames["n"] == 3:  # the third new shard is written but not yet renamed into place
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a)
os.replace = replace
hf_io.save_hf(qwen3.init_model(cfg, seed=1), d, max_shard_size=%d)
""" % (FIVE_SHARDS, THREE_SHARDS)


def test_a_killed_export_process_leaves_the_old_export(tmp_path):
    import signal
    import subprocess
    import sys

    root = ROOT
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    d = tmp_path / "export"
    r = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(d)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    left = [n for n in os.listdir(d) if n.endswith(".partial")]
    assert len(left) == 1  # the killed write's temporary
    old, new = _tiny(0), _tiny(1)
    assert _which(d, old, new) == "old"
    hf_io.save_hf(new, d, max_shard_size=THREE_SHARDS)  # the next export clears what the killed one left
    assert _which(d, old, new) == "new"
    assert not [n for n in os.listdir(d) if n.endswith(".partial")]
    assert len(_weights_files(d)) == 4  # 3 shards and the index


def test_generation_config_carries_eos_and_pad_and_generate_stops_there(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = _tiny(0)
    prompt = torch.tensor([[5, 17, 101, 42]])
    hf_io.save_hf(model, tmp_path / "no_ids")  # the tiny config has no eos: generate runs to the limit
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "no_ids")).eval()
    assert plain.generation_config.eos_token_id is None
    greedy = plain.generate(prompt, max_new_tokens=8, do_sample=False)[0, 4:].tolist()
    assert len(greedy) == 8
    # The first generated token not seen before it becomes the stop token; the pad id is another one.
    j = next(j for j in range(1, 8) if greedy[j] not in greedy[:j])
    stop, pad = greedy[j], next(t for t in range(256) if t not in greedy)
    hf_io.save_hf(model, tmp_path / "ids", eos_token_ids=[stop, pad], pad_token_id=pad)
    gen = json.loads((tmp_path / "ids" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [stop, pad] and gen["pad_token_id"] == pad
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ids")).eval()
    assert hf.generation_config.eos_token_id == [stop, pad] and hf.generation_config.pad_token_id == pad
    out = hf.generate(prompt, max_new_tokens=8, do_sample=False)[0, 4:].tolist()
    assert out == greedy[: j + 1]  # stopped at the eos token
    # config.json carries them too, so our loader reads them back.
    back = hf_io.load_hf(tmp_path / "ids").config
    assert back.eos_token_ids == (stop, pad) and back.pad_token_id == pad
    with pytest.raises(ValueError, match=r"\[256\].*vocabulary of 256"):
        hf_io.save_hf(model, tmp_path / "bad", eos_token_ids=[stop, 256])


def test_exported_files_are_0644_and_created_folders_0755_whatever_the_umask(tmp_path):
    existing = tmp_path / "private"
    existing.mkdir(mode=0o700)
    existing.chmod(0o700)
    old = os.umask(0o077)
    try:
        hf_io.save_hf(_tiny(0), existing / "a" / "b", max_shard_size=THREE_SHARDS)
        hf_io.save_hf(_tiny(0), existing / "a" / "b")  # a re-export too
    finally:
        os.umask(old)
    mode = lambda p: os.stat(p).st_mode & 0o777
    assert mode(existing) == 0o700  # a folder that was there keeps its mode
    assert mode(existing / "a") == mode(existing / "a" / "b") == 0o755
    files = os.listdir(existing / "a" / "b")
    assert {"config.json", "generation_config.json", hf_io.SINGLE_FILE} == set(files)
    assert {f: mode(existing / "a" / "b" / f) for f in files} == {f: 0o644 for f in files}


def test_truncated_or_corrupt_safetensors_errors_name_the_file(tmp_path):
    model = _tiny(0)
    single = tmp_path / "single" / hf_io.SINGLE_FILE
    hf_io.save_hf(model, single.parent)
    data = single.read_bytes()
    single.write_bytes(data[:-100])  # cut short, as by a full disk or an interrupted copy
    with pytest.raises(hf_io.WeightsError, match=rf"{re.escape(str(single))}: .*truncated or corrupt"):
        hf_io.load_hf(single.parent)
    single.write_bytes(b"\x00" * 64)
    with pytest.raises(hf_io.WeightsError, match=rf"{re.escape(str(single))}: .*truncated or corrupt"):
        hf_io.load_hf(single.parent)
    files = hf_io.save_hf(model, tmp_path / "sharded", max_shard_size=THREE_SHARDS)
    shard = tmp_path / "sharded" / files[1]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(hf_io.WeightsError, match=rf"{re.escape(str(shard))}: .*truncated or corrupt"):
        hf_io.load_hf(tmp_path / "sharded")
    (tmp_path / "sharded" / hf_io.INDEX_FILE).write_text("{not json")
    with pytest.raises(hf_io.WeightsError, match=r"model\.safetensors\.index\.json: not a safetensors index"):
        hf_io.load_hf(tmp_path / "sharded")
