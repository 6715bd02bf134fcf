"""Issue 7 part 4: test-time rehearsal N in {0, 1, 2, 4} x {parallel, sequential} on the demo suite.

Writes results.json/md (one category per mode x N) and sweep.md/json (score and success with 95%
intervals versus N and extra tokens).
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "eval_demo.py"))
    c.suite = "rehearsal_sweep"
    c.policy = "model"
    return c
