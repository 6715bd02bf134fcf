"""Issue 7 part 4: test-time rehearsal N in {0, 1, 2, 4} x {parallel, sequential} on the demo suite.

Writes results.json/md (one category per mode x N) and sweep.md/json (score and success with 95%
intervals versus N and extra tokens).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_demo import get_config as demo_config  # noqa: E402


def get_config():
    c = demo_config()
    c.suite = "rehearsal_sweep"
    c.policy = "model"
    return c
