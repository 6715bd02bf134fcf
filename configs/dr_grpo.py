"""EnvACE on Qwen3-8B (configs/envace_qwen3_8b.py) trained with Dr. GRPO (advantages without std division; each row's
token sum divided by the 8000-token budget).

The objective's knobs come from ``envace_jax/rl/recipes.py`` (its table says what each sets and why); every
other field is the 8B config's. Any knob can still be overridden, e.g. ``--config.loss.clip_high=0.3``::

    python launch/train.py --config=configs/dr_grpo.py --config.model.hf_path=/ckpt/Qwen3-8B ...
"""

import os

from envace_jax.config import config_from_file
from envace_jax.rl.recipes import apply_to_config


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "dr_grpo"
    c.run_dir = "runs/dr_grpo"
    return apply_to_config(c, "dr_grpo")
