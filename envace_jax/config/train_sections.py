"""The sections of a run's config that define its update: ``rl`` (the RL step), ``optim`` and ``loss``.

Re-exported by ``envace_jax.config``, where the other sections and the ConfigDict conversion live; their choice
lists (``AGG_MODES`` and the like) are in ``config.choices``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from envace_jax.config.choices import AGG_MODES, BASELINES, BEHAVIOUR_IS, KL_TYPES, RATIO_LEVELS, SCHEDULES
from envace_jax.config.rules import _NONNEG, _POS, Checked, ConfigError, Rule, one_of


@dataclasses.dataclass(frozen=True)
class RLSection(Checked):
    """Knobs of one RL iteration (``rl.step.RLStep``) and of its update; defaults are the reference's
    (spec 1.2, 4.3, 5)."""

    LABEL: ClassVar[str] = "rl"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("n_rollouts", _POS, "> 0"),
        ("baseline", *one_of(BASELINES)),
        ("empty_output_penalty", _NONNEG, ">= 0"),
        ("ppo_epochs", _POS, "> 0"),
        ("mini_batches", _POS, "> 0"),
        ("micro_batch_size", _POS, "> 0"),
        ("max_row_length", lambda v: v > 1, "> 1"),
        ("length_multiple", _POS, "> 0"),
        ("adjust_batch_multiple", _NONNEG, ">= 0"),
        ("overlong_rows", *one_of(("drop", "truncate"))),
        ("max_staleness", _NONNEG, ">= 0"),
        ("behaviour_is", *one_of(BEHAVIOUR_IS)),
        ("behaviour_is_cap", lambda v: v >= 1, ">= 1"),
        ("dynamic_sampling_max_rounds", _POS, "> 0"),
        ("overlong_buffer", _NONNEG, ">= 0"),
        ("overlong_penalty", _NONNEG, ">= 0"),
    )

    n_rollouts: int = 4  # env.rollout.n
    baseline: str = "row_mean"
    normalize_std: bool = False
    # the reference's use_invalid_action_penalty: subtracted from the score of every row whose decoded
    # output is empty text (spec 4.3), in the RL step and nowhere else; 0 turns it off
    empty_output_penalty: float = 0.1
    recompute_old_logprobs: bool = True
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_size: int = 1  # rows per trainer micro-batch (gradients are accumulated exactly)
    max_row_length: int = 20000  # prompt + response tokens of one row (prompts left-truncated)
    length_multiple: int = 64
    adjust_batch_multiple: int = 0  # faithful: duplicate random rows up to a multiple (reference 128); 0 = off
    # Rows longer than max_row_length: "drop" leaves them out of the update (default; the trainer never
    # scores a context the sampler did not see); "truncate" keeps them with the prompt left-truncated
    # (the reference's row padding). A truncated row is scored under a context the sampler never saw
    # (and from position 0), so its log-probs and ratio are not those of the sampled policy.
    overlong_rows: str = "drop"
    # Exact shortcuts of the update, off in the faithful setting (the reference runs neither):
    # with one optimizer step per batch (ppo_epochs = mini_batches = 1) the recomputed old log-probs are
    # the update's own log-probs at the same weights, so take them from the update's forward pass
    # (stop-gradient: ratio 1) instead of a second pass over the batch
    old_logprobs_from_update: bool = False
    # rows whose advantage is exactly 0 add nothing to the gradient when the loss has no KL and no entropy
    # term: leave them out of the forward/backward passes and divide by the whole batch's loss count, so
    # the optimizer step is the same (needs mini_batches = 1)
    skip_zero_advantage_rows: bool = False
    # the tokens the rows of a (prompt, role) group share (their prompt) run through the update's forward
    # and backward once per micro-batch, not once per row (rl.prefix_plan), and a rollout call writes each
    # distinct prompt into the sampler's cache once (Sampler(share_prompts=True)); the same tokens and
    # log-probs up to float32 summation order; on one device only (mesh of one)
    share_prompt_prefixes: bool = False
    # Episodes that lost their judge (termination judge_api_failure: every attempt of some verdict failed)
    # get zero loss weight on all their rows and stay out of their (prompt, role) baselines; a key that
    # lost episodes and keeps fewer than 2 judged ones contributes nothing. Faithful: False, the reference
    # terminates them and trains on them with the failed items counted False (spec 4.2 and 8.10).
    mask_judge_failures: bool = True
    # Asynchronous RL (rl/async_pipeline.py): the rollouts of step k are sampled from the weights after update
    # max(0, k - max_staleness), so they run while up to max_staleness earlier steps are judged and trained.
    # The lag is fixed by the step index (a run repeats bit for bit for a seed and a lag); 0 is the
    # synchronous loop, unchanged.
    max_staleness: int = 0
    # Off-policy correction (decoupled PPO, rl/loss.py behaviour_weights): the clip is taken around the
    # proximal policy (the weights at the update: the recomputed old log-probs) and each token's loss is
    # weighted by the truncated importance weight sg(min(pi_prox / mu, behaviour_is_cap)), mu the policy that
    # sampled the row (the sampler's log-probs). "token": a weight per token; "sequence": one per row
    # (exp of the row's summed log-ratio); "none": the ratio and clip around pi_prox only. "auto": "token"
    # when max_staleness >= 1 (and old log-probs are recomputed), else "none" (docs/async_rl.md)
    behaviour_is: str = "auto"
    behaviour_is_cap: float = 2.0
    # DAPO's dynamic sampling (rl/dynamic_sampling.py): the rows of a (prompt, role) group whose rewards are all
    # equal carry no signal and leave the update; the step rolls out further batches of prompts (at most
    # dynamic_sampling_max_rounds more) until as many prompts with a signal as the step's batch holds are in
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 3
    # DAPO's soft overlong penalty (rl/reward.py overlong_penalty), per row, in tokens: a generation longer
    # than max_new_tokens - overlong_buffer loses overlong_penalty * (its excess / overlong_buffer), down to
    # -overlong_penalty at the role's max_new_tokens. 0 = off (the reference)
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0

    def behaviour_correction(self) -> str:
        """``behaviour_is`` with "auto" resolved: "token" for an asynchronous run whose update recomputes the
        proximal policy's log-probs, else "none"."""
        if self.behaviour_is != "auto":
            return self.behaviour_is
        return "token" if self.max_staleness >= 1 and self.recompute_old_logprobs else "none"

    def __post_init__(self):
        super().__post_init__()
        if self.behaviour_is in ("token", "sequence") and not self.recompute_old_logprobs:
            raise ValueError(
                f"rl.behaviour_is={self.behaviour_is!r} needs rl.recompute_old_logprobs: without the proximal "
                "policy's log-probs the old log-probs are the sampler's and every weight would be 1"
            )
        if self.old_logprobs_from_update and (
            self.ppo_epochs != 1 or self.mini_batches != 1 or not self.recompute_old_logprobs
        ):
            raise ValueError(
                "rl.old_logprobs_from_update needs rl.ppo_epochs = rl.mini_batches = 1 and "
                f"rl.recompute_old_logprobs (got {self.ppo_epochs}, {self.mini_batches}, "
                f"{self.recompute_old_logprobs}): later steps' old log-probs are not the update's own"
            )
        if self.dynamic_sampling and self.baseline == "none":
            raise ValueError(
                "rl.dynamic_sampling needs a group baseline (rl.baseline != 'none'): without one a group whose "
                "rewards are all equal still has advantages"
            )
        if self.dynamic_sampling and self.max_staleness:
            raise ValueError(
                "rl.dynamic_sampling needs rl.max_staleness = 0: its extra rollout rounds are decided from the "
                f"step's own rewards, which the asynchronous pipeline samples ahead of (got {self.max_staleness})"
            )
        if self.skip_zero_advantage_rows and self.mini_batches != 1:
            raise ValueError(
                f"rl.skip_zero_advantage_rows needs rl.mini_batches = 1, got {self.mini_batches}: "
                "each mini-batch's loss count would change with the rows left out"
            )


@dataclasses.dataclass(frozen=True)
class OptimConfig(Checked):
    """Reference values (spec 1.2): AdamW 1e-6 constant, betas (0.9, 0.999), wd 0.01, clip 1.0.

    ``total_steps`` is the schedule's length in optimizer steps. In an ``ExperimentConfig`` leave it at
    0: it is derived from the run (``total_steps x rl.ppo_epochs x rl.mini_batches``). Used on its own
    (a Trainer in code), 0 is only valid for the constant schedule.
    """

    LABEL: ClassVar[str] = "optim"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("lr", _POS, "> 0"),
        ("schedule", *one_of(SCHEDULES)),
        ("warmup_steps", _NONNEG, ">= 0"),
        ("total_steps", _NONNEG, ">= 0"),
        ("b1", lambda v: 0 <= v < 1, "in [0, 1)"),
        ("b2", lambda v: 0 <= v < 1, "in [0, 1)"),
        ("eps", _POS, "> 0"),
        ("weight_decay", _NONNEG, ">= 0"),
        ("grad_clip", _POS, "> 0"),
        ("max_consecutive_nonfinite", _POS, "> 0"),
    )

    lr: float = 1e-6
    schedule: str = "constant"  # constant | cosine | linear
    warmup_steps: int = 0
    total_steps: int = 0  # 0: derived from the run (see the class doc)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_consecutive_nonfinite: int = 100


@dataclasses.dataclass(frozen=True)
class LossConfig(Checked):
    """Reference values (spec 5.3): clip 0.2/0.2, dual clip 3.0, KL off, entropy 0."""

    LABEL: ClassVar[str] = "loss"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("clip_low", lambda v: 0 <= v < 1, "in [0, 1)"),
        ("clip_high", _NONNEG, ">= 0"),
        ("dual_clip", lambda v: v is None or v > 1, "> 1 or None"),
        ("log_ratio_clamp", _POS, "> 0"),
        ("agg", *one_of(AGG_MODES)),
        ("kl_type", *one_of(KL_TYPES)),
        ("ratio_level", *one_of(RATIO_LEVELS)),
        ("kl_coef", _NONNEG, ">= 0"),
        ("entropy_coef", _NONNEG, ">= 0"),
        ("agg_norm", _NONNEG, ">= 0"),
        ("router_aux_coef", _NONNEG, ">= 0"),
    )

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    log_ratio_clamp: float = 20.0
    agg: str = "seq_mean_token_mean"
    kl_coef: float = 0.0
    kl_type: str = "k3"
    entropy_coef: float = 0.0
    role_balanced: bool = False
    # The importance ratio the clip acts on (rl/ratio_levels.py): "token" (the reference's), "sequence" (GSPO:
    # the row's geometric-mean ratio, clipped as one; the paper's clips are 3e-4 / 4e-4, without dual clip) or
    # "sequence_token" (GSPO-token).
    ratio_level: str = "token"
    # agg = "seq_mean_token_sum_norm" (Dr. GRPO): the constant each row's token sum is divided by, in tokens
    # (Dr. GRPO divides by the generation budget, e.g. rollout.act.max_new_tokens); unused by the other modes
    agg_norm: float = 0.0
    # Qwen3-MoE policies (models/qwen3_moe.py). router_aux_coef: weight of transformers' load-balancing loss
    # (load_balancing_loss_func) added to the update's loss; 0 in the faithful setting (the reference trains
    # dense Qwen3, and transformers adds it only with output_router_logits; the checkpoints' own coefficient
    # is 0.001). routing_replay: the update routes each generated token to the experts the sampler routed it to
    # (R3, arXiv 2510.11370), weighted by the update's own router; prompt tokens route themselves.
    router_aux_coef: float = 0.0
    routing_replay: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.agg == "seq_mean_token_sum_norm" and not self.agg_norm > 0:
            raise ConfigError(
                "loss.agg='seq_mean_token_sum_norm' needs loss.agg_norm > 0 (the constant length the row sums are "
                f"divided by, e.g. the generation budget in tokens), got {self.agg_norm!r}",
                leaf="agg_norm",
                what="> 0 with agg='seq_mean_token_sum_norm'",
                value=self.agg_norm,
            )
