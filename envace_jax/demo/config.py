"""Demo settings: one frozen dataclass, with the default preset (``make demo``) and a reduced one (CI).

The values of ``default()`` were chosen on the validation split (``launch/demo.py --eval_split=validation``);
the test split is read only for the reported numbers.
"""

from __future__ import annotations

import dataclasses

from envace_jax.data.demo_tasks import SPLITS


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    seed: int = 0
    # ---- data: splits are disjoint by construction (demo_tasks hashes task content into a split)
    sft_tasks: int = 64              # the small fixed set of demonstrations (train split, first N)
    rl_tasks: int = 512              # fresh train prompts after the demonstrations; they only ground REHEARSE and the judge
    world_model_rows: int = 1536    # real executions of varied calls (errors included) on other worlds: REHEARSE's warm start
    validation_tasks: int = 128
    test_tasks: int = 256
    eval_split: str = "test"         # tune with "validation"; report with "test"
    # ---- tokenizer / model
    vocab_size: int = 2048           # lines_digits BPE: prompts ~110 tokens, digits single tokens
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    # ---- SFT warm start
    sft_steps: int = 450
    sft_batch_rows: int = 32         # half ACT, half REHEARSE rows
    sft_lr: float = 3e-3
    sft_warmup: int = 10
    micro_batch_size: int = 16
    # ---- RL (mode "rehearsal" by default)
    rl_mode: str = "rehearsal"
    rl_steps: int = 24
    prompts_per_step: int = 8
    n_rollouts: int = 4
    rl_lr: float = 2e-4
    # SFT batches (the warm start's rows, both roles) interleaved after each RL step, with the RL optimizer:
    # keeps the shared-reward update from eroding REHEARSE fidelity (0 = pure RL, as the reference)
    rl_replay_batches: int = 1
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    temperature: float = 0.6         # both roles' training rollouts (evaluation is greedy)
    max_model_len: int = 768
    max_steps: int = 10              # rollout micro-steps per episode
    # ---- evaluation
    eval_batch: int = 128            # episodes per rollout call in the real-tool evaluation
    fidelity_tasks: int = 32        # held-out tasks whose calls are teacher-forced for REHEARSE fidelity
    more_sft: bool = True            # the equal-compute baseline

    def __post_init__(self):
        if self.eval_split not in SPLITS:
            raise ValueError(f"demo eval_split must be one of {SPLITS}, got {self.eval_split!r}")
        if self.rl_mode not in ("rehearsal", "real", "simulator"):
            raise ValueError(f"demo rl_mode must be rehearsal, real or simulator, got {self.rl_mode!r}")
        for name in ("sft_tasks", "rl_tasks", "test_tasks", "validation_tasks", "sft_batch_rows",
                     "prompts_per_step", "n_rollouts", "micro_batch_size", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"demo {name} must be >= 1, got {getattr(self, name)}")
        for name in ("sft_steps", "rl_steps", "rl_replay_batches", "world_model_rows", "fidelity_tasks"):
            if getattr(self, name) < 0:
                raise ValueError(f"demo {name} must be >= 0, got {getattr(self, name)}")

    def replace(self, **kw) -> "DemoConfig":
        return dataclasses.replace(self, **kw)


def default() -> DemoConfig:
    return DemoConfig()


def reduced() -> DemoConfig:
    """A minutes-long end-to-end run for CI: tiny model, few tasks, few steps."""
    return DemoConfig(sft_tasks=8, rl_tasks=16, world_model_rows=8, validation_tasks=8, test_tasks=8,
                      vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=16, sft_steps=3, sft_batch_rows=8, sft_warmup=0, micro_batch_size=8,
                      rl_steps=2, rl_replay_batches=1, prompts_per_step=2, n_rollouts=2, act_max_new_tokens=16,
                      rehearse_max_new_tokens=16, max_model_len=1024, max_steps=4, eval_batch=8, fidelity_tasks=4)


PRESETS = {"default": default, "reduced": reduced}
