"""World-rehearsal RL: the batched episode engine (``rollout``), checklist rewards and judges, role-wise
GRPO, the loss, the trainer, one RL iteration (``step``) and the training run (the module ``train``; its
function is ``envace_jax.train``). Names load from their modules on first use."""

from envace_jax._lazy import lazy_exports

_EXPORTS = {
    # records
    "Generation": "envace_jax.rl.types",
    "Episode": "envace_jax.rl.types",
    "State": "envace_jax.rl.types",
    # rollout and reward
    "RolloutEngine": "envace_jax.rl.rollout",
    "RuleJudge": "envace_jax.rl.judges",
    "HttpJudge": "envace_jax.rl.judges",
    "LocalModelJudge": "envace_jax.rl.judges",
    # the update
    "role_wise_advantages": "envace_jax.rl.advantages",
    "Trainer": "envace_jax.rl.trainer",
    "RLStep": "envace_jax.rl.step",
    # the vLLM rollout engine (rollout.engine="vllm")
    "VllmClient": "envace_jax.rl.vllm_client",
    "StepResult": "envace_jax.rl.step",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
