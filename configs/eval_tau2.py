"""tau2-bench airline, retail, telecom with tau2's own offline evaluator.

policy=oracle replays the golden actions. policy=model plays the agent; the user is a local model
(tau2.user=model, tau2.user_model_path; empty = the policy's weights) or the offline scripted user.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_common import base_eval_config  # noqa: E402


def get_config():
    c = base_eval_config("tau2")
    c.tau2.update(dict(domains="airline,retail,telecom", split="test", limit=0, user="model", user_model_path="",
                       max_steps=60, batch_size=8))
    return c
