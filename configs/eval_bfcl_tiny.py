"""CI smoke run: a tiny random Qwen3 with the demo tokenizer on every multi_turn_base entry.

Scores are expected near zero; the run must finish and write results.json.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_bfcl import get_config as bfcl_config  # noqa: E402


def get_config():
    c = bfcl_config()
    c.policy = "model"
    c.model.random_tiny = True
    # BFCL prompts are 7k-11k demo-tokenizer tokens; attention over them dominates, so the smoke model
    # is as small as Qwen3's shape allows.
    c.model.tiny = dict(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=8, vocab_size=4096,
                        tokenizer_corpus="demo+bfcl")
    c.bfcl.categories = "multi_turn_base"
    c.bfcl.max_steps_per_turn = 2
    c.bfcl.batch_size = 25
    c.sampling.max_new_tokens = 16
    c.sampling.temperature = 1.0
    c.max_model_len = 8192
    c.enable_thinking = False
    return c
