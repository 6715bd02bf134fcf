"""Tokenizer loading (local Hugging Face directories only) and the offline demo tokenizer."""

from __future__ import annotations

import json
import os
from typing import Iterable

from envace_jax.chat.template import (
    CONTROL_TOKENS,
    ENDOFTEXT,
    IM_END,
    MARKUP_TOKENS,
    QWEN3_SPECIAL_TOKENS,
    QWEN3_STYLE_TEMPLATE,
)

# Qwen2/Qwen3's pre-tokenisation split (contractions, letters, single digits, punctuation runs, newline runs,
# spaces) so the demo tokenizer cuts text where a real Qwen3 tokenizer does.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Whole lines (newline included): merges may then span words, so text repeated verbatim in every
# prompt (benchmark tool schemas) shrinks to a few long tokens. Meant for tiny CI models only.
_LINE_PATTERN = r"[^\n]*\n|[^\n]+"
# As "lines", but every digit is its own piece: numbers stay digit by digit, so copying a number out of a
# tool response is the same task whatever its neighbours (the demo's small models learn it much faster).
_LINE_DIGIT_PATTERN = r"\p{N}|[^\n\p{N}]*\n|[^\n\p{N}]+"
_PRE_SPLITS = {"qwen": _SPLIT_PATTERN, "lines": _LINE_PATTERN, "lines_digits": _LINE_DIGIT_PATTERN}

# Qwen3's official tokenizer files, which a checkout fetches once (``make qwen3-files``, sha256-pinned in
# tests/qwen3_official.py) for the tests and benchmarks that compare against the real tokenizer.
QWEN3_FILES = ("tokenizer.json", "tokenizer_config.json")
QWEN3_FILES_ENV = "ENVACE_QWEN3_DIR"


def official_qwen3_dir(repo: str | os.PathLike) -> str:
    """Where the checkout at ``repo`` keeps Qwen3's official tokenizer files: ``$ENVACE_QWEN3_DIR``, else
    ``.cache/qwen3-official`` in the checkout (the files themselves may not be there yet)."""
    return os.environ.get(QWEN3_FILES_ENV) or os.path.join(os.fspath(repo), ".cache", "qwen3-official")


def load_tokenizer(path: str | os.PathLike, *, use_our_template: bool = False):
    """Loads a tokenizer from a local Hugging Face directory (never the hub).

    Our Qwen3-style template is installed when the directory has no chat template, or when
    ``use_our_template`` is set (e.g. to render full episodes exactly as they were sampled, see
    envace_jax/chat/template.py). Raises ValueError if a Qwen3 control token is missing or split.
    """
    from transformers import AutoTokenizer

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"tokenizer path {path!r} is not a local directory")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if use_our_template or not getattr(tok, "chat_template", None):
        tok.chat_template = QWEN3_STYLE_TEMPLATE
    for token in (ENDOFTEXT, "<|im_start|>", IM_END):
        ids = tok.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"tokenizer at {path!r}: {token!r} is not a single token (got ids {ids}); "
                f"the Qwen3 chat format needs it"
            )
    return tok


def build_demo_tokenizer(
    corpus_texts: Iterable[str],
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 1024,
    min_frequency: int = 2,
    pre_split: str = "qwen",
    max_token_chars: int | None = None,
):
    """Trains a byte-level BPE on ``corpus_texts`` and saves a Hugging Face tokenizer directory.

    Ids 0..8 are the Qwen3 special tokens in ``QWEN3_SPECIAL_TOKENS`` order (``<|endoftext|>`` = 0,
    ``<|im_start|>`` = 1, ``<|im_end|>`` = 2, then the think/tool markup). The control tokens are
    special (dropped by ``skip_special_tokens``); the markup tokens are added but not special, as in
    Qwen3, so decoded text keeps ``<think>`` and ``<tool_call>``. eos = ``<|im_end|>``, pad =
    ``<|endoftext|>``; the chat template is ours. Returns the loaded tokenizer.

    ``pre_split``: "qwen" cuts text where Qwen3's tokenizer does; "lines" only at newlines, so one
    token may cover several words (up to ``max_token_chars`` characters, default unlimited);
    "lines_digits" as "lines" with every digit a token of its own.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    min_vocab = 256 + len(QWEN3_SPECIAL_TOKENS)
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size={vocab_size} is below {min_vocab} (256 bytes + {len(QWEN3_SPECIAL_TOKENS)} special tokens)"
        )
    if pre_split not in _PRE_SPLITS:
        raise ValueError(f"pre_split={pre_split!r}; choose one of {sorted(_PRE_SPLITS)}")
    if max_token_chars is not None and max_token_chars < 1:
        raise ValueError(f"max_token_chars={max_token_chars} must be >= 1 (or None)")
    texts = [t for t in corpus_texts]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("corpus_texts must be a non-empty iterable of strings")

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRE_SPLITS[pre_split]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(QWEN3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_chars,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    for i, t in enumerate(QWEN3_SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise AssertionError(f"demo tokenizer: {t!r} got id {tok.token_to_id(t)}, expected {i}")

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = QWEN3_STYLE_TEMPLATE
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    # Keep the template inside tokenizer_config.json too, where older transformers look for it.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] = QWEN3_STYLE_TEMPLATE
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return load_tokenizer(out_dir)
