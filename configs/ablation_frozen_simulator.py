"""Ablation: a frozen simulator plays the environment; only ACT is trained.

REHEARSE generations come from a separate, never-updated model (``model.simulator_hf_path``, by
default the starting checkpoint), so the caller learns against a fixed world model.
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "ablation_frozen_simulator"
    c.run_dir = "runs/ablation_frozen_simulator"
    c.rollout.mode = "simulator"
    c.model.simulator_hf_path = ""  # set to the same Qwen3-8B directory as model.hf_path
    return c
