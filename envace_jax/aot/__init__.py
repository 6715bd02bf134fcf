"""Ahead-of-time compilation of a run's programs for a TPU topology on a CPU host (libtpu, no TPU):
per-chip memory and a roofline. Names load from their modules on first use."""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # the report
    "Report": "envace_jax.aot.report",
    "compile_report": "envace_jax.aot.report",
    # step-time estimate
    "StepAssumptions": "envace_jax.aot.estimate",
    "estimate_step": "envace_jax.aot.estimate",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
