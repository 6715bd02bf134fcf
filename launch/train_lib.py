"""Moved: the training run's library code is ``envace_jax.rl.train`` (inside the package, importable
without ``sys.path`` edits). This thin module re-exports it so that scripts doing ``import train_lib``
from launch/ keep working."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envace_jax.rl.train import (Run, build_data, build_judge, build_make_env, build_model,  # noqa: E402,F401
                                 build_policies, build_run, build_tokenizer, data_state, gather_json,
                                 global_metrics, init_distributed, load_task_records, make_client, resume,
                                 rollout_copy, tiny_model_config, train)
