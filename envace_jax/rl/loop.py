"""Moved: one RL iteration is ``envace_jax.rl.step`` (the training loop is ``envace_jax.rl.train``).

This module only re-exports the step's names so that existing imports keep working.
"""

from envace_jax.rl.rollout import TRAINED_ROLES  # noqa: F401
from envace_jax.rl.step import (ROLE_NAMES, RLStep, StepConfig, StepResult, adjust_batch_copy,  # noqa: F401
                                logprob_mismatch, repeat_prompts, rollout_metrics, row_scores)
