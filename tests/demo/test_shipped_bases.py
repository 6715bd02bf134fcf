"""The shipped demo bases: each loads, its manifest describes its weights, and the deep one is what
``make pretrain-deep`` (preset ``deep``) and the wire one what ``make pretrain-wire`` (preset ``wire``) make from the
shipped 2-layer base, and the wire-memory one what ``make pretrain-wire-memory`` makes from the wire base."""

from __future__ import annotations

import dataclasses
import filecmp
import os

import pytest

from envace_jax.demo import pretrain as pt
from tests.helpers_paths import ROOT


@pytest.mark.parametrize(
    "name,layers", [("demo_base", 2), ("demo_base_deep", 4), ("demo_base_wire", 2), ("demo_base_wire_memory", 2)]
)
def test_a_shipped_base_matches_its_manifest_in_transformers(name, layers):
    from transformers import AutoConfig

    base = pt.load_base(os.path.join(ROOT, "assets", name))
    hf = AutoConfig.from_pretrained(os.path.join(base.directory, "model"))
    assert base.config.num_layers == hf.num_hidden_layers == layers
    assert (base.config.hidden_size, base.config.intermediate_size, len(base.tokenizer)) == (
        hf.hidden_size,
        hf.intermediate_size,
        hf.vocab_size,
    )


def test_the_deep_base_is_the_deep_preset_continuing_the_shipped_base():
    deep = pt.load_base(os.path.join(ROOT, "assets", "demo_base_deep"))
    assert dataclasses.asdict(deep.config) == dataclasses.asdict(pt.deep())
    assert deep.manifest["init"]["from"] == "assets/demo_base" and deep.manifest["init"]["grow_factor"] == 2
    same_tokenizer = filecmp.dircmp(
        os.path.join(ROOT, "assets", "demo_base", "tokenizer"), os.path.join(deep.directory, "tokenizer")
    )
    assert not same_tokenizer.diff_files and not same_tokenizer.left_only


def test_the_wire_base_is_the_wire_preset_continuing_the_shipped_base():
    wire = pt.load_base(os.path.join(ROOT, "assets", "demo_base_wire"))
    assert dataclasses.asdict(wire.config) == dataclasses.asdict(pt.wire())
    assert wire.manifest["init"]["from"] == "assets/demo_base" and wire.manifest["init"]["grow_factor"] == 1
    assert wire.manifest["corpus"]["wire_act_rows"] == 2 * 2048  # each plain task: the wire, then the reply
    same_tokenizer = filecmp.dircmp(
        os.path.join(ROOT, "assets", "demo_base", "tokenizer"), os.path.join(wire.directory, "tokenizer")
    )
    assert not same_tokenizer.diff_files and not same_tokenizer.left_only


def test_the_wire_memory_base_is_its_preset_continuing_the_wire_base():
    base = pt.load_base(os.path.join(ROOT, "assets", "demo_base_wire_memory"))
    assert dataclasses.asdict(base.config) == dataclasses.asdict(pt.wire_memory())
    assert base.manifest["init"]["from"] == "assets/demo_base_wire" and base.manifest["init"]["grow_factor"] == 1
    # the plain tasks' rows, then every assistant turn of the trap and plain tasks shown after a memory
    assert base.manifest["corpus"]["wire_act_rows"] > 2 * 2048 + 3 * 2048 + 2 * 512
    same_tokenizer = filecmp.dircmp(
        os.path.join(ROOT, "assets", "demo_base", "tokenizer"), os.path.join(base.directory, "tokenizer")
    )
    assert not same_tokenizer.diff_files and not same_tokenizer.left_only
