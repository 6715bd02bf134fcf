"""tau2-bench airline, retail, telecom with tau2's own offline evaluator.

policy=oracle replays the golden actions. policy=model plays the agent; the user is a local model
(tau2.user=model, tau2.user_model_path; empty = the policy's weights) or the offline scripted user.
"""

from envace_jax.eval.config import eval_config_dict


def get_config():
    c = eval_config_dict("tau2")
    c.tau2.update(
        dict(
            domains="airline,retail,telecom",
            split="test",
            limit=0,
            user="model",
            user_model_path="",
            max_steps=60,
            batch_size=8,
        )
    )
    return c
