"""EnvACE on Qwen3-30B-A3B, the reference's own checklist judge and a Qwen3-MoE (128 experts of 768, 8 per token,
48 layers): ``envace_qwen3_8b.py`` with the MoE preset, for the same v5p-64 slice. Its programs and their memory
per chip are in docs/aot.md (``make aot CONFIG=configs/envace_qwen3_30b_a3b.py TOPOLOGY=v5p:4x4x4``).

Routing replay (R3) is on: the update routes each generated token to the experts the sampler chose, the reported
fix for the train/inference routing mismatch of MoE RL (arXiv 2510.11370); the load-balancing loss stays off as
in the faithful setting (``loss.router_aux_coef``; the checkpoint's own coefficient is 0.001).

    python launch/train.py --config=configs/envace_qwen3_30b_a3b.py \\
        --config.model.hf_path=/ckpt/Qwen3-30B-A3B --config.tokenizer.path=/ckpt/Qwen3-30B-A3B \\
        --config.data.path=/data/cm2_train.jsonl --config.judge.http.base_url=http://judge:8000
"""

import os

from envace_jax.config import config_from_file


def get_config():
    c = config_from_file(os.path.join(os.path.dirname(__file__), "envace_qwen3_8b.py"))
    c.name = "envace_qwen3_30b_a3b"
    c.run_dir = "runs/envace_qwen3_30b_a3b"
    c.model.preset = "qwen3_30b_a3b"
    c.loss.routing_replay = True
    return c
