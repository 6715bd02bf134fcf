"""Evaluation: benchmark harnesses (BFCL, tau2, the demo suite), the rehearsal-fidelity metric and
test-time rehearsal (inference, not training). Names load from their modules on first use."""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # configs and the runner
    "EvalConfig": "envace_jax.eval.config",
    "load_eval_config": "envace_jax.eval.config",
    "run_eval": "envace_jax.eval.runner",
    # results
    "CategoryResult": "envace_jax.eval.results",
    "EntryResult": "envace_jax.eval.results",
    "load_results": "envace_jax.eval.results",
    "wilson_ci": "envace_jax.eval.results",
    # rehearsal fidelity
    "FidelityCase": "envace_jax.eval.fidelity",
    "evaluate_fidelity": "envace_jax.eval.fidelity",
    # test-time rehearsal
    "RehearsalConfig": "envace_jax.eval.config",
    "TestTimeRehearsal": "envace_jax.eval.rehearsal",
    "rehearsal_sweep": "envace_jax.eval.rehearsal",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
