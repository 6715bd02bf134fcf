"""BFCL-v4: the four multi-turn categories (executable envs, BFCL's multi-turn checker) and the
python single-turn AST categories (BFCL's ast_checker).

    python launch/eval.py --config=configs/eval_bfcl.py --config.output_dir=/tmp/bfcl_oracle
    python launch/eval.py --config=configs/eval_bfcl.py --config.policy=model \
        --config.model.model_path=/ckpt/qwen3-8b --config.output_dir=/tmp/bfcl_qwen3
"""

from envace_jax.eval.config import eval_config_dict


def get_config():
    c = eval_config_dict("bfcl")
    c.bfcl.categories = (
        "multi_turn_base,multi_turn_miss_func,multi_turn_miss_param,multi_turn_long_context,"
        "simple_python,multiple,parallel,parallel_multiple,live_simple,live_multiple,"
        "live_parallel,live_parallel_multiple"
    )
    c.bfcl.limit = 0  # entries per category (0 = all)
    c.bfcl.max_steps_per_turn = 20  # BFCL's MAXIMUM_STEP_LIMIT
    c.bfcl.batch_size = 16  # conversations per sampler batch
    return c
