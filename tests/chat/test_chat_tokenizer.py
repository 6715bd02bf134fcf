"""The offline demo tokenizer and load_tokenizer."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers_chat import demo_tokenizer_dir

from envace_jax.chat import QWEN3_SPECIAL_TOKENS, QWEN3_STYLE_TEMPLATE, build_demo_tokenizer, load_tokenizer


def test_demo_tokenizer_dir_loads_offline_with_autotokenizer():
    from transformers import AutoTokenizer

    d = demo_tokenizer_dir()
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(d))
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        assert json.load(f)["chat_template"] == QWEN3_STYLE_TEMPLATE
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert tok.chat_template == QWEN3_STYLE_TEMPLATE
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert len(tok) <= 512
    for i, t in enumerate(QWEN3_SPECIAL_TOKENS):
        assert tok.convert_tokens_to_ids(t) == i
        assert tok.encode(t, add_special_tokens=False) == [i]
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0


def test_special_tokens_split_and_decode_like_qwen3():
    tok = load_tokenizer(demo_tokenizer_dir())
    text = "<|im_start|>assistant\n<think>\nx<tool_call>y\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text  # byte-level: lossless round trip
    for t in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"):
        assert tok.convert_tokens_to_ids(t) in ids
    # Control tokens vanish with skip_special_tokens; the think/tool markup stays (as in Qwen3).
    assert tok.decode(ids, skip_special_tokens=True) == (
        "assistant\n<think>\nx<tool_call>y\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    )
    odd = "Zürich 中文 emoji 🙂 tabs\t\r\n"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd


def test_load_tokenizer_installs_our_template_only_when_missing(tmp_path):
    src = demo_tokenizer_dir()
    bare = tmp_path / "bare"
    shutil.copytree(src, bare)
    for name in os.listdir(bare):
        if name.endswith(".jinja"):
            os.remove(bare / name)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    from transformers import AutoTokenizer

    assert not AutoTokenizer.from_pretrained(str(bare), local_files_only=True).chat_template
    assert load_tokenizer(bare).chat_template == QWEN3_STYLE_TEMPLATE

    theirs = tmp_path / "theirs"
    shutil.copytree(bare, theirs)
    cfg["chat_template"] = "{{ messages[0].content }}"
    (theirs / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(theirs).chat_template == "{{ messages[0].content }}"
    assert load_tokenizer(theirs, use_our_template=True).chat_template == QWEN3_STYLE_TEMPLATE


def test_load_tokenizer_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        load_tokenizer(tmp_path / "missing")
    # A byte-level tokenizer without the Qwen3 control tokens is refused.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        ["hello world"] * 4,
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False),
    )
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="<\\|endoftext\\|>"):
        load_tokenizer(tmp_path / "plain")


def test_build_demo_tokenizer_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100"):
        build_demo_tokenizer(["abc"], tmp_path / "t", vocab_size=100)
    with pytest.raises(ValueError, match="corpus_texts"):
        build_demo_tokenizer([], tmp_path / "t")


def test_bpe_learns_merges_from_the_corpus(tmp_path):
    corpus = ["get_balance transfer account " * 50] * 20
    tok = build_demo_tokenizer(corpus, tmp_path / "t", vocab_size=300)
    # Frequent words become few tokens; an unseen word falls back to (more) byte-level pieces.
    assert len(tok.encode(" transfer", add_special_tokens=False)) == 1
    assert len(tok.encode(" qzxv", add_special_tokens=False)) >= 2


def test_lines_digits_split_merges_across_words_but_keeps_digits_single(tmp_path):
    line = '{"name": "check_stock", "arguments": {"item": "pen"}} -> {"price": 17, "stock": 305}\n'
    corpus = [line * 30, "Balance of acct 4920 is 118.\n" * 30]
    tok = build_demo_tokenizer(corpus, tmp_path / "t", vocab_size=400, pre_split="lines_digits")
    ids = tok.encode(
        '{"name": "check_stock", "arguments": {"item": "pen"}} -> {"price": 98}\n', add_special_tokens=False
    )
    pieces = [tok.decode([i]) for i in ids]
    # A frequent multi-word run is one token, which the Qwen-style split can never produce.
    assert any(" " in p and len(p) > 12 for p in pieces), pieces
    # Every digit is a token of its own, also for numbers never seen in the corpus.
    assert "9" in pieces and "8" in pieces
    assert all(not (any(c.isdigit() for c in p) and len(p) > 1) for p in pieces), pieces
    assert tok.decode(ids) == '{"name": "check_stock", "arguments": {"item": "pen"}} -> {"price": 98}\n'
    qwen = build_demo_tokenizer(corpus, tmp_path / "q", vocab_size=400, pre_split="qwen")
    assert len(qwen.encode(line, add_special_tokens=False)) > 2 * len(tok.encode(line, add_special_tokens=False))
