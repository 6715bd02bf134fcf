"""A SMOKE config: a tiny run that finishes on a laptop CPU and checks that every part of training
works (random 2-layer Qwen3, offline demo tokenizer, demo tool worlds with rule-checked checklists).
Same code path as the 8B config; only sizes differ.

It does not learn: a random model never passes a checklist item, so the reward is 0 at every step and
every advantage is 0. The learning demo is ``make demo`` (``configs/demo.py`` via ``launch/demo.py``:
RL from a shipped pretrained tiny base; docs/demo.md).

    python launch/train.py --config=configs/demo_cpu.py --config.run_dir=/tmp/demo
"""

from envace_jax.config import base_config


def get_config():
    c = base_config()
    c.name = "demo_cpu"
    c.run_dir = "runs/demo_cpu"
    c.seed = 0
    c.total_steps = 20

    c.model.hf_path = ""  # random init
    c.model.preset = "tiny"
    c.model.vocab_size = 512
    c.model.hidden_size = 64
    c.model.intermediate_size = 128
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 16
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"

    c.tokenizer.path = ""  # build the offline demo tokenizer into run_dir
    c.tokenizer.demo_vocab_size = 480

    c.data.source = "demo"
    c.data.num_demo_tasks = 32
    c.data.prompts_per_step = 2
    c.data.num_epochs = 0

    c.rollout.mode = "rehearsal"
    c.rollout.max_steps = 12
    c.rollout.max_assistant_turns = 4
    c.rollout.max_user_turns = 2
    c.rollout.max_model_len = 2048
    for role in (c.rollout.act, c.rollout.rehearse):
        role.max_new_tokens = 24

    c.judge.kind = "rule"

    c.rl.n_rollouts = 2
    c.rl.micro_batch_size = 4
    c.rl.max_row_length = 2048

    c.optim.lr = 1e-3  # constant schedule; its length follows total_steps

    c.mesh.fsdp = -1
    c.checkpoint.every = 5
    c.checkpoint.keep = 2
    c.checkpoint.async_save = False
    return c
