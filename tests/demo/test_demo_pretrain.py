"""The demo's pretraining stage: step-indexed batches, rehearsal-memory rows built by the test-time code,
and a tiny run that writes a loadable base and resumes bit-exactly after a preemption."""

from __future__ import annotations

import collections
import json
import logging
import os

import numpy as np
import pytest

from envace_jax.demo import pretrain as pt
from envace_jax.eval.rehearsal import MEMORY_HEADER
from envace_jax.rl.types import ACT, REHEARSE, Generation


def _rows(role, n):
    return [Generation(role, [1, 2], [3], [0.0], f"{role}-{i}", i, 0) for i in range(n)]


def test_indexed_batches_are_a_pure_function_of_the_step():
    groups = {ACT: _rows(ACT, 7), REHEARSE: _rows(REHEARSE, 30)}
    a = pt.IndexedBatches(groups, {ACT: 3, REHEARSE: 5}, seed=4)
    b = pt.IndexedBatches(groups, {ACT: 3, REHEARSE: 5}, seed=4)
    for k in (0, 5, 17, 3):
        assert [r.uid for r in a.batch(k)] == [r.uid for r in b.batch(k)]
        assert collections.Counter(r.role for r in a.batch(k)) == {ACT: 3, REHEARSE: 5}
    assert [r.uid for r in a.batch(0)] != [r.uid for r in pt.IndexedBatches(groups, {ACT: 3, REHEARSE: 5}, 5).batch(0)]
    # 7 ACT rows at 3 per batch: the first 7 positions of the stream are one permutation of all rows
    stream = [r.uid for k in range(3) for r in a.batch(k) if r.role == ACT]
    assert sorted(stream[:7]) == sorted(r.uid for r in groups[ACT])
    with pytest.raises(ValueError, match="no rows"):
        pt.IndexedBatches({ACT: [], REHEARSE: _rows(REHEARSE, 2)}, {ACT: 1, REHEARSE: 1}, 0)


def test_split_shares_keeps_the_role_halves():
    assert pt.split_shares(32, 0.25) == ({ACT: 16, REHEARSE: 16}, {ACT: 12, pt.MEMORY_GROUP: 4, REHEARSE: 16})
    assert pt.split_shares(8, 0.01) == ({ACT: 4, REHEARSE: 4}, {ACT: 3, pt.MEMORY_GROUP: 1, REHEARSE: 4})


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="push_back_share"):
        pt.tiny().replace(push_back_share=1.5)
    with pytest.raises(ValueError, match="steps"):
        pt.tiny().replace(steps=0)
    assert pt.tiny().memory_step == 3 and pt.tiny().replace(memory_share=0.0).memory_step is None


def _params(model_dir):
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(model_dir, f)))
    return out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pretrain") / "base")
    manifest = pt.run_pretrain(pt.tiny(), out, progress=False)
    return out, manifest


def test_tiny_run_writes_a_base_that_transformers_loads(tiny_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, manifest = tiny_run
    assert sorted(os.listdir(out)) >= ["curve.png", "manifest.json", "memories.json", "model", "tokenizer"]
    assert not os.path.exists(os.path.join(out, "checkpoints"))
    on_disk = json.load(open(os.path.join(out, "manifest.json")))
    assert on_disk["config"] == manifest["config"] and on_disk["corpus"]["demonstrations"] == 24
    assert on_disk["corpus"]["push_back_demonstrations"] == 6  # 24 x 0.25, by construction
    assert {"success", "success_happy", "success_push_back"} <= set(on_disk["validation"])
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(out, "model")).eval()
    # generate stops where our sampler does: <|im_end|> and <|endoftext|>, padding with the latter.
    assert hf.generation_config.eos_token_id == tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert hf.generation_config.pad_token_id == tok.pad_token_id
    ids = tok("<|im_start|>user\nWhat is ana's balance?<|im_end|>", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = hf(ids).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_memory_rows_carry_memories_built_by_the_test_time_code(tiny_run):
    from envace_jax.chat import load_tokenizer
    from envace_jax.demo import data as demo_data

    out, manifest = tiny_run
    memories = json.load(open(os.path.join(out, "memories.json")))
    assert len(memories) == 4 and all(m.startswith(MEMORY_HEADER) for m in memories.values())
    codec = demo_data.make_codec(load_tokenizer(os.path.join(out, "tokenizer")))
    demos = pt.demonstrations(pt.tiny())[:4]
    rows = pt.memory_rows(demos, memories, codec)
    plain = [r for t in demos for r in demo_data.act_rows(t, codec)]
    assert manifest["corpus"]["memory_rows"] == len(rows) == len(plain)
    for r, p in zip(rows, plain):
        assert r.gen_ids == p.gen_ids  # same demonstration target
        text = codec.decode(r.prompt_ids)
        assert MEMORY_HEADER in text and MEMORY_HEADER not in codec.decode(p.prompt_ids)


def test_preempted_run_resumes_to_the_same_parameters(tiny_run, tmp_path, monkeypatch, caplog):
    from envace_jax import checkpoint

    out, _ = tiny_run
    calls = {"n": 0}
    real_check = checkpoint.PreemptionGuard.check

    def check_then_preempt(self):
        calls["n"] += 1
        if calls["n"] == 4:  # after step 4, past the memory step (3)
            self._flag.set()
        return real_check(self)

    monkeypatch.setattr(checkpoint.PreemptionGuard, "check", check_then_preempt)
    resumed = str(tmp_path / "base")
    with pytest.raises(SystemExit) as stop, caplog.at_level(logging.INFO, logger="envace_jax"):
        pt.run_pretrain(pt.tiny(), resumed, progress=False)
    assert stop.value.code == 0 and os.path.exists(os.path.join(resumed, "checkpoints"))
    monkeypatch.setattr(checkpoint.PreemptionGuard, "check", real_check)
    with caplog.at_level(logging.INFO, logger="envace_jax"):
        pt.run_pretrain(pt.tiny(), resumed, progress=False)
    # What the run reports is logged (launch/pretrain.py shows it on stderr), not printed.
    said = [r.getMessage() for r in caplog.records if r.name == "envace_jax.demo.pretrain"]
    stop_at = said.index("pretrain: preempted at step 4; rerun to resume")
    assert said[0].startswith("pretrain corpus: ") and said[stop_at + 1].startswith("pretrain corpus: "), said
    assert said[stop_at + 2] == "pretrain: resumed at step 4", said
    a, b = _params(os.path.join(out, "model")), _params(os.path.join(resumed, "model"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_split_shares_places_tank_rows_in_the_act_half():
    assert pt.split_shares(32, 0.0, 4) == (
        {ACT: 12, pt.TANK_GROUP: 4, REHEARSE: 16},
        {ACT: 12, pt.TANK_GROUP: 4, pt.MEMORY_GROUP: 0, REHEARSE: 16},
    )
    assert pt.split_shares(32, 0.25, 4)[1] == {ACT: 8, pt.TANK_GROUP: 4, pt.MEMORY_GROUP: 4, REHEARSE: 16}
    with pytest.raises(ValueError, match="no demonstration row"):
        pt.split_shares(8, 0.5, 2)
    with pytest.raises(ValueError, match="no demonstration row"):
        pt.tiny().replace(tank_share=4)
    with pytest.raises(ValueError, match="grow_factor"):
        pt.tiny().replace(grow_factor=2)
    with pytest.raises(ValueError, match="schedule"):
        pt.tiny().replace(schedule="step")


def _continued(base_dir, **kw):
    return pt.tiny().replace(
        init_from=base_dir,
        grow_factor=2,
        num_layers=4,
        tank_share=1,
        tank_tasks=8,
        memory_share=0.0,
        schedule="constant",
        **kw,
    )


def test_a_continued_base_is_the_base_grown_with_its_tokenizer(tiny_run, tmp_path):
    """At a vanishing learning rate the continued 4-layer model computes what the 2-layer base computes, in
    transformers: it starts from the base's weights, not from a random init."""
    import filecmp

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir, _ = tiny_run
    out = str(tmp_path / "deep")
    manifest = pt.run_pretrain(_continued(base_dir, lr=1e-12, steps=2), out, progress=False)
    assert manifest["config"]["num_layers"] == 4 and manifest["init"]["num_layers"] == 2
    assert manifest["init"]["validation"] == json.load(open(os.path.join(base_dir, "manifest.json")))["validation"]
    # 8 tank conversations: one ACT row per assistant step (a read, maybe a pump, the reply)
    from envace_jax.data.tank_tasks import tank_tasks

    assert manifest["corpus"]["tank_rows"] == sum(
        m["role"] == "assistant" for t in tank_tasks(8, pt.TANK_SEED) for m in t["reference_messages"]
    )
    assert not filecmp.dircmp(os.path.join(base_dir, "tokenizer"), os.path.join(out, "tokenizer")).diff_files
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    ids = tok("<|im_start|>user\nIf north holds at least 40, pump 40.<|im_end|>", return_tensors="pt").input_ids
    base = AutoModelForCausalLM.from_pretrained(os.path.join(base_dir, "model")).eval()
    deep = AutoModelForCausalLM.from_pretrained(os.path.join(out, "model")).eval()
    assert deep.config.num_hidden_layers == 4 and base.config.num_hidden_layers == 2
    with torch.no_grad():
        torch.testing.assert_close(deep(ids).logits, base(ids).logits, rtol=0, atol=1e-4)
    # the demo reads it like any base: the corpus config and the grown shape
    loaded = pt.load_base(out)
    assert loaded.config.num_layers == 4 and loaded.config.init_from == base_dir


def test_a_continued_base_refuses_a_base_it_does_not_match(tiny_run, tmp_path):
    base_dir, _ = tiny_run
    with pytest.raises(ValueError, match=r"num_layers \(base 2 x grow_factor 2 != 6\)"):
        pt.run_pretrain(_continued(base_dir).replace(num_layers=6), str(tmp_path / "a"), progress=False)
    with pytest.raises(ValueError, match="hidden_size"):
        pt.run_pretrain(_continued(base_dir).replace(hidden_size=64), str(tmp_path / "b"), progress=False)
    with pytest.raises(FileNotFoundError, match="make pretrain"):
        pt.run_pretrain(_continued(str(tmp_path / "nowhere")), str(tmp_path / "c"), progress=False)


def test_a_preempted_continued_run_resumes_to_the_same_parameters(tiny_run, tmp_path, monkeypatch):
    from envace_jax import checkpoint

    base_dir, _ = tiny_run
    cfg = _continued(base_dir, steps=4)
    whole = str(tmp_path / "whole")
    pt.run_pretrain(cfg, whole, progress=False)
    calls = {"n": 0}
    real_check = checkpoint.PreemptionGuard.check

    def check_then_preempt(self):
        calls["n"] += 1
        if calls["n"] == 3:
            self._flag.set()
        return real_check(self)

    monkeypatch.setattr(checkpoint.PreemptionGuard, "check", check_then_preempt)
    resumed = str(tmp_path / "resumed")
    with pytest.raises(SystemExit):
        pt.run_pretrain(cfg, resumed, progress=False)
    monkeypatch.setattr(checkpoint.PreemptionGuard, "check", real_check)
    pt.run_pretrain(cfg, resumed, progress=False)
    a, b = _params(os.path.join(whole, "model")), _params(os.path.join(resumed, "model"))
    base = _params(os.path.join(base_dir, "model"))
    assert len([k for k in a if "layers.3." in k]) > 0 and not any("layers.3." in k for k in base)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # trained: the silenced copies' output projections moved off zero
    assert np.abs(a["model.layers.1.self_attn.o_proj.weight"]).max() > 0


def test_split_shares_places_wire_rows_in_both_halves():
    assert pt.split_shares(32, 0.0, 0, 4, 4) == (
        {ACT: 12, pt.WIRE_ACT_GROUP: 4, REHEARSE: 12, pt.WIRE_REHEARSE_GROUP: 4},
        {ACT: 12, pt.WIRE_ACT_GROUP: 4, pt.MEMORY_GROUP: 0, REHEARSE: 12, pt.WIRE_REHEARSE_GROUP: 4},
    )
    with pytest.raises(ValueError, match="REHEARSE rows"):
        pt.split_shares(8, 0.0, 0, 0, 4)
    with pytest.raises(ValueError, match="needs wire_demonstrations"):
        pt.tiny().replace(wire_act_share=1)


def test_a_wire_run_trains_on_plain_wire_rows_and_the_demo_sees_them_in_its_corpus(tmp_path):
    """The wire rows join the batches at their shares, the manifest counts them, and ``Base.corpus_rows`` (the
    demo's more-SFT rows and the uids kept out of its RL prompts) holds them: ACT rows of plain wire tasks
    only (one wire, then the reply) and REHEARSE rows whose targets are the wire world's real responses."""
    from envace_jax.demo import data as demo_data

    cfg = pt.tiny().replace(
        wire_demonstrations=6, wire_world_model_rows=12, wire_act_share=1, wire_rehearse_share=1, memory_share=0.0
    )
    out = str(tmp_path / "wire")
    manifest = pt.run_pretrain(cfg, out, progress=False)
    base = pt.load_base(out)
    assert dataclasses_equal(base.config, cfg)
    codec = demo_data.make_codec(base.tokenizer)
    act, reh = pt.wire_rows(cfg, codec)
    assert manifest["corpus"]["wire_act_rows"] == len(act) == 12  # 6 tasks x (the wire, the reply)
    assert manifest["corpus"]["wire_rehearse_rows"] == len(reh) == 6 + 12  # each task's logged call + 12 calls
    demos = base.demonstrations()
    rows = base.corpus_rows(demos, codec)
    assert [r.gen_ids for r in rows[-len(act) - len(reh) :]] == [r.gen_ids for r in act + reh]
    assert {r.uid for r in act} <= base.corpus_uids(rows, demos)
    for r in act:
        text = codec.decode(r.gen_ids)
        assert "close_account" not in text and "get_balance" not in text and text.count("<tool_call>") <= 1
    assert all("transfer" in codec.decode(r.prompt_ids) for r in act)
    assert all("<execution_result>" in codec.decode(r.gen_ids) for r in reh)


def test_wire_rows_add_the_rows_after_a_memory_and_only_those_carry_one():
    """``wire_retry_tasks`` / ``wire_memory_plain`` add ACT rows after a memory (``demo.wire_memory``) to the wire
    ACT rows; the plain rows without a memory stay as they were, and no row without one shows a trap."""
    from envace_jax.chat import load_tokenizer
    from envace_jax.demo import data as demo_data
    from envace_jax.eval.rehearsal import MEMORY_HEADER

    codec = demo_data.make_codec(load_tokenizer("assets/demo_base_wire/tokenizer"))
    plain_cfg = pt.tiny().replace(
        wire_demonstrations=5, wire_world_model_rows=4, wire_act_share=1, wire_rehearse_share=1, memory_share=0.0
    )
    cfg = plain_cfg.replace(wire_retry_tasks=6, wire_memory_plain=2)
    act0, reh0 = pt.wire_rows(plain_cfg, codec)
    act, reh = pt.wire_rows(cfg, codec)
    assert [r.gen_ids for r in reh] == [r.gen_ids for r in reh0]
    assert [r.gen_ids for r in act[: len(act0)]] == [r.gen_ids for r in act0]
    extra = act[len(act0) :]
    assert all(MEMORY_HEADER in codec.decode(r.prompt_ids) for r in extra)
    assert not any(MEMORY_HEADER in codec.decode(r.prompt_ids) for r in act0)
    assert len({r.uid for r in extra}) == 6 + 2
    # episodes of their own: after the plain tasks' and the world-model calls'
    assert min(r.episode for r in extra) > max(r.episode for r in act0 + reh0)
    with pytest.raises(ValueError, match="wire_memory_plain=6"):
        plain_cfg.replace(wire_memory_plain=6)
    with pytest.raises(ValueError, match="needs wire_act_share"):
        plain_cfg.replace(wire_act_share=0, wire_retry_tasks=1)


def dataclasses_equal(a, b) -> bool:
    import dataclasses

    return dataclasses.asdict(a) == dataclasses.asdict(b)


def test_the_cli_offers_every_preset():
    from envace_jax.cli import pretrain as cli

    assert sorted(cli.PRESET_NAMES) == sorted(pt.PRESETS)
