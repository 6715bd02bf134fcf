"""Demo task suite in the real demo worlds: success (every checklist item passed) and checklist score.

    python launch/eval.py --config=configs/eval_demo.py --config.policy=model \
        --config.model.model_path=runs/demo/model --config.rehearsal.n=2
"""

from envace_jax.eval.config import eval_config_dict


def get_config():
    c = eval_config_dict("demo")
    c.demo.update(dict(num_tasks=40, seed=0, split="test", max_steps=24, max_assistant_turns=8, max_user_turns=4))
    c.sampling.max_new_tokens = 256
    c.max_model_len = 4096
    return c
