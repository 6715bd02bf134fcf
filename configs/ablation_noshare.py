"""Ablation: ACT and REHEARSE as two independent policies (the reference's run_checklist_noshare.sh).

Two models, two optimizers with the same hyperparameters; each is trained on its own role's rows
with the same role-wise GRPO advantages.
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "ablation_noshare"
    c.run_dir = "runs/ablation_noshare"
    c.rollout.mode = "noshare"
    c.model.simulator_hf_path = ""  # set to the same Qwen3-8B directory as model.hf_path
    return c
