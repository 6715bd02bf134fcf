"""CI smoke run: a tiny random Qwen3 with the demo tokenizer on every multi_turn_base entry.

Scores are expected near zero; the run must finish and write results.json.
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "eval_bfcl.py"))
    c.policy = "model"
    c.model.random_tiny = True
    # BFCL prompts are ~17k characters (~30 tool schemas): 7k-11k tokens with the demo tokenizer, ~4k
    # with Qwen3's word-level pre-split even when trained on BFCL. A line-level BPE trained on the
    # schemas and questions (tokens up to 64 characters) brings them to ~300-800 tokens (mean ~540),
    # so prefill no longer dominates the run. The model is as small as Qwen3's shape allows.
    c.model.tiny.update(
        dict(
            hidden=32,
            layers=1,
            heads=2,
            kv_heads=1,
            head_dim=8,
            vocab_size=8192,
            tokenizer_corpus="demo+bfcl",
            pre_split="lines",
            max_token_chars=64,
        )
    )
    c.bfcl.categories = "multi_turn_base"
    c.bfcl.max_steps_per_turn = 2
    c.bfcl.batch_size = 32  # live entries; a finished entry's slot goes to the next one
    c.sampling.max_new_tokens = 16
    c.sampling.temperature = 1.0
    # Conversations stay under ~1.5k tokens (a prompt of <= ~900, then ~50 per turn); a longer
    # one ends as length_budget, which BFCL's checker scores as a failure like any other.
    c.max_model_len = 2048
    # Compilation, not compute, dominates this run on CPU: one batch size, one cache window and two
    # chunk lengths keep it to a few prefill programs and one decode program.
    c.sampler.max_chunk = 512
    c.sampler.batch_buckets = "32"
    c.sampler.length_buckets = "64,512"
    c.sampler.window_buckets = str(2048 + 512)
    c.enable_thinking = False
    return c
