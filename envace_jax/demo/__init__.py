"""The embedded demo (``make demo``): data + tokenizer, SFT warm start, world-rehearsal RL, real-tool
evaluation before/after with CIs, rehearsal fidelity, an equal-compute more-SFT baseline, report files.
Names load from their modules on first use."""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # settings
    "DemoConfig": "envace_jax.demo.config",
    "load_demo_config": "envace_jax.demo.config",
    "PretrainConfig": "envace_jax.demo.pretrain",
    # runs
    "run_demo": "envace_jax.demo.pipeline",
    "run_compare": "envace_jax.demo.pipeline",
    "run_pretrain": "envace_jax.demo.pretrain",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
