"""A SMOKE config for Qwen3-MoE: ``demo_cpu.py``'s run with a tiny random Qwen3-MoE policy (8 experts of 32, 2 per
token, the middle of 3 layers dense), routing replay on and the load-balancing loss at the checkpoints' 0.001.
It checks that every part of training runs on a MoE (sampling both roles with the routing record, the update
with replay, checkpoints, export in the Hub's per-expert layout); like demo_cpu it does not learn.

    python launch/train.py --config=configs/moe_cpu.py --config.run_dir=/tmp/moe
    python launch/export_hf.py --config=configs/moe_cpu.py --config.run_dir=/tmp/moe --out_dir=/tmp/moe_hf
    python launch/eval.py --config=configs/eval_demo.py --config.policy=model --config.model.model_path=/tmp/moe_hf
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "demo_cpu.py"))
    c.name = "moe_cpu"
    c.run_dir = "runs/moe_cpu"
    c.total_steps = 4
    c.model.num_layers = 3
    c.model.num_experts = 8
    c.model.num_experts_per_tok = 2
    c.model.moe_intermediate_size = 32
    c.model.mlp_only_layers = "1"
    c.loss.routing_replay = True
    c.loss.router_aux_coef = 0.001
    c.checkpoint.every = 2
    return c
