"""CI smoke run: a tiny random Qwen3 with the demo tokenizer on every multi_turn_base entry.

Scores are expected near zero; the run must finish and write results.json.
"""

import dataclasses
import os

from envace_jax.config import config_from_file
from envace_jax.eval.config import BFCL_TINY


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "eval_bfcl.py"))
    c.policy = "model"
    c.model.random_tiny = True
    c.model.tiny.update(dataclasses.asdict(BFCL_TINY))  # eval.config.BFCL_TINY says why these sizes
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
