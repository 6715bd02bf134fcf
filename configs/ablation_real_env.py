"""Ablation: plain GRPO against the real executable environment.

Tool calls run in each task's ToolEnvironment (the record's ``env`` entry), so there are no REHEARSE
rows and only ACT is trained. Everything else is the Qwen3-8B reference setting.
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "ablation_real_env"
    c.run_dir = "runs/ablation_real_env"
    c.rollout.mode = "real"
    return c
