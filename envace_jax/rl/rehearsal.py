"""Moved: test-time rehearsal is inference, not RL training; it lives in ``envace_jax.eval.rehearsal``.

This module only re-exports its names so that existing imports keep working; new code imports
``envace_jax.eval.rehearsal``. (The layering test allows this one upward import, as a listed shim.)
"""

from envace_jax.eval.rehearsal import (MEMORY_HEADER, MEMORY_KINDS, MODES, PLACEMENTS, SUMMARY_SYSTEM,  # noqa: F401
                                       ImaginedEngine, RehearsalConfig, RehearsalRun, RehearsalTrace, StepTrace,
                                       SweepResult, TaskRehearsal, TestTimeRehearsal, advance_judge,
                                       build_template_memory, imagined_record, rehearsal_sweep, summarize_run,
                                       summary_messages, trace_of, wilson_ci, with_memory)
