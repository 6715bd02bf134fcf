"""Rehearsal fidelity on real benchmark logs (BFCL ground-truth replays, tau2 golden runs): exact, field and
error agreement, split into read-only / state-changing calls (read from the real environment) and success /
error responses, with the optimistic and pessimistic hallucination rates (envace_jax/eval/fidelity_bench.py).

    python launch/eval.py --config=configs/eval_fidelity.py --config.output_dir=/tmp/fid_oracle
    python launch/eval.py --config=configs/eval_fidelity.py --config.fidelity.rehearser=constant \
        --config.output_dir=/tmp/fid_constant
    python launch/eval.py --config=configs/eval_fidelity.py --config.fidelity.rehearser=model \
        --config.model.model_path=/ckpt/qwen3-8b --config.output_dir=/tmp/fid_qwen3
"""

from envace_jax.eval.config import eval_config_dict


def get_config():
    c = eval_config_dict("fidelity")
    c.fidelity.update(
        dict(
            rehearser="oracle",  # oracle | constant | model
            bfcl_categories="multi_turn_base,multi_turn_miss_func,multi_turn_miss_param,multi_turn_long_context",
            tau2_domains="airline,retail,telecom",
            tau2_split="test",
            demo_tasks=0,  # demo reference conversations too (0: none)
            demo_split="test",
            limit=0,  # entries / tasks per category and domain (0 = all)
            with_reference=False,  # show the whole replay in the REHEARSE few-shot block (an upper bound)
            batch_size=16,  # REHEARSE prompts per generate call (model)
        )
    )
    return c
