"""EnvACE on Qwen3-8B (configs/envace_qwen3_8b.py) trained with GSPO (sequence-level importance ratio, clips 3e-4 /
4e-4, no dual clip).

The objective's knobs come from ``envace_jax/rl/recipes.py`` (its table says what each sets and why); every
other field is the 8B config's. Any knob can still be overridden, e.g. ``--config.loss.clip_high=0.3``::

    python launch/train.py --config=configs/gspo.py --config.model.hf_path=/ckpt/Qwen3-8B ...
"""

import os

from envace_jax.config import config_from_file
from envace_jax.rl.recipes import apply_to_config


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "gspo"
    c.run_dir = "runs/gspo"
    return apply_to_config(c, "gspo")
