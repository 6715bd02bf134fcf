"""Smoke size of tau2: a tiny random Qwen3 (``eval.config.BFCL_TINY``) as the agent, the offline scripted user.

It checks the path (tau2's tools and evaluator, test-time rehearsal with ``--config.rehearsal.sweep_ns=0,1,2``),
not a score: a random model writes no valid tool call, and tau2 scores its runs near zero.
"""

import dataclasses
import os

from envace_jax.config import config_from_file
from envace_jax.eval.config import BFCL_TINY


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "eval_tau2.py"))
    c.policy = "model"
    c.model.random_tiny = True
    c.model.tiny.update(dataclasses.asdict(BFCL_TINY))
    c.tau2.user = "scripted"
    c.tau2.max_steps = 12
    c.sampling.max_new_tokens = 16
    c.sampling.temperature = 1.0
    # The domain policy and tool schemas are ~4.7k tokens (airline, retail) and ~10k (telecom) with this
    # tokenizer, which was not trained on tau2's text.
    c.max_model_len = 12288
    c.sampler.max_chunk = 512
    c.sampler.batch_buckets = "8,16"
    c.sampler.length_buckets = "64,512"
    c.sampler.window_buckets = str(12288 + 512)
    c.enable_thinking = False
    return c
