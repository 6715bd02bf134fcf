"""envace-jax: world-rehearsal agentic RL (EnvACE) for Qwen3 in JAX / Flax NNX.

The names most scripts need, each importable from here or from its home module (docs/api.md lists
them). They load on first use: ``import envace_jax`` and the host packages (chat, envs, data, config)
stay free of jax until a model, sampler or trainer is asked for.
"""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # the model and its Hugging Face checkpoints
    "Qwen3Config": "envace_jax.models.qwen3",
    "Qwen3": "envace_jax.models.qwen3",
    "init_model": "envace_jax.models.qwen3",
    "load_hf": "envace_jax.models.hf_io",
    "save_hf": "envace_jax.models.hf_io",
    "SIZES": "envace_jax.model_sizes",
    # sampling
    "Sampler": "envace_jax.sampling",
    "SamplingParams": "envace_jax.sampling",
    # chat text <-> ids and the two parsers
    "Qwen3ChatCodec": "envace_jax.chat",
    "load_tokenizer": "envace_jax.chat",
    "parse_tool_calls": "envace_jax.chat",
    "parse_simulator_output": "envace_jax.chat",
    # configs, training, evaluation
    "ExperimentConfig": "envace_jax.config",
    "load_config": "envace_jax.config",
    "role_wise_advantages": "envace_jax.rl.advantages",
    "train": "envace_jax.rl.train",
    "run_eval": "envace_jax.eval.runner",
    "TestTimeRehearsal": "envace_jax.eval.rehearsal",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
