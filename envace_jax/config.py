"""Every knob of a run, in one place: frozen dataclasses, their ranges, and ConfigDict <-> dataclass.

Config files under ``configs/`` build a ``ConfigDict`` (so every field can be overridden from the
command line with ``--config.a.b=v``); ``load_config`` turns it into an ``ExperimentConfig``. Every
knob is defined once, here, with its default and its range; the classes that use a knob (the trainer's
``OptimConfig``/``LossConfig``, the rollout engine's ``RolloutConfig``, the HTTP judge's
``HttpJudgeConfig``, the RL step's ``RLSection``) import it from here. There is one validation path:
each dataclass checks its own fields when it is built (``__post_init__``), whether from a config file
or in code, and ``load_config`` only adds the dotted name of the field (``config.optim.lr``) to the
message, so a typo in a launch command fails before any device work starts.

This module imports neither jax nor the model: reading a config file is cheap.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Callable, ClassVar, Mapping

from envace_jax.model_sizes import TINY


class ConfigError(ValueError):
    """A config field has the wrong type, an out-of-range value, or is unknown.

    Range errors carry ``leaf`` (the field's path inside the dataclass that raised), ``what`` (the
    rule) and ``value``, so that ``load_config`` can name the full dotted field.
    """

    def __init__(self, message: str, *, leaf: str = "", what: str = "", value: Any = None):
        super().__init__(message)
        self.leaf, self.what, self.value = leaf, what, value


Rule = tuple[str, Callable[[Any], bool], str]  # (field, predicate, what the value must be)

_POS = lambda v: v > 0
_NONNEG = lambda v: v >= 0
_PROB = lambda v: 0 < v <= 1


def one_of(choices: tuple) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in choices), f"one of {choices}"


def check_rules(obj: Any, label: str, rules: tuple[Rule, ...]) -> None:
    """Raises ``ConfigError`` for the first field of ``obj`` that breaks its rule."""
    for field, ok, what in rules:
        value = getattr(obj, field)
        if not ok(value):
            raise ConfigError(f"{label}.{field} must be {what}, got {value!r}", leaf=field, what=what, value=value)


class Checked:
    """Mixin: a frozen dataclass whose ``RULES`` are checked when it is built."""

    LABEL: ClassVar[str] = ""
    RULES: ClassVar[tuple[Rule, ...]] = ()

    def __post_init__(self):
        check_rules(self, self.LABEL, self.RULES)


# ----------------------------------------------------------------------------- choice lists

MODES = ("rehearsal", "simulator", "real", "noshare", "caller_frozen")  # rollout.mode (rl/rollout.py)
BASELINES = ("row_mean", "trajectory_mean", "rloo", "none")  # rl.baseline (rl/advantages.py)
# loss.agg (rl/loss.py); seq_mean_token_sum_norm is Dr. GRPO's constant normaliser (loss.agg_norm)
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_TYPES = ("k1", "k2", "k3")  # loss.kl_type (rl/loss.py)
RATIO_LEVELS = ("token", "sequence", "sequence_token")  # loss.ratio_level (rl/ratio_levels.py)
TOOL_CALL_SYNTAXES = ("qwen3", "reference")  # rollout.tool_call_syntax (chat/tool_parser)
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# model.preset: "tiny" (sizes from the model section) or a Qwen3Config preset of the same name
# rl.behaviour_is: the off-policy correction of the update (rl/loss.py behaviour_weights); "auto" resolves by
# RLSection.behaviour_correction
BEHAVIOUR_IS = ("auto", "none", "token", "sequence")
JUDGE_STREAMING = ("auto", "on", "off")  # rollout.judge_streaming (rl/judge_stream.py)
MODEL_PRESETS = ("tiny", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_4b_2507", "qwen3_8b", "qwen3_14b", "qwen3_32b")


# ----------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True)
class ModelSection(Checked):
    """Which architecture (``preset``) and which weights (``hf_path``) the policy has.

    ``preset="tiny"`` builds the architecture from the size fields below (random init unless
    ``hf_path``); a named preset (``qwen3_8b``, ...) is that Qwen3 architecture: with ``hf_path`` the
    checkpoint must have it, without one it is randomly initialised (compile and memory planning; a
    training run needs ``hf_path``, see ``check_runnable``).
    """

    LABEL: ClassVar[str] = "model"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("preset", *one_of(MODEL_PRESETS)),
        ("vocab_size", _POS, "> 0"),
        ("hidden_size", _POS, "> 0"),
        ("intermediate_size", _POS, "> 0"),
        ("num_layers", _POS, "> 0"),
        ("num_heads", _POS, "> 0"),
        ("num_kv_heads", _POS, "> 0"),
        ("head_dim", _POS, "> 0"),
        ("param_dtype", *one_of(DTYPES)),
        ("dtype", *one_of(DTYPES)),
        ("remat_policy", *one_of(REMAT_POLICIES)),
    )

    hf_path: str = ""  # local Hugging Face directory; empty = random init
    preset: str = "tiny"  # the architecture: tiny (the sizes below) or qwen3_0_6b ... qwen3_32b
    vocab_size: int = 512  # tiny preset only (overridden by the tokenizer's size when larger)
    hidden_size: int = TINY.hidden_size  # tiny preset only, like the fields up to head_dim (model_sizes.TINY)
    intermediate_size: int = TINY.intermediate_size
    num_layers: int = TINY.num_layers
    num_heads: int = TINY.num_heads
    num_kv_heads: int = TINY.num_kv_heads
    head_dim: int = TINY.head_dim
    param_dtype: str = "float32"
    dtype: str = "float32"  # compute dtype (reference: bf16 compute, fp32 master params)
    remat_policy: str = "none"
    init_seed: int = 0
    simulator_hf_path: str = ""  # simulator/noshare modes: the frozen or second REHEARSE model


@dataclasses.dataclass(frozen=True)
class TokenizerSection(Checked):
    LABEL: ClassVar[str] = "tokenizer"
    RULES: ClassVar[tuple[Rule, ...]] = (("demo_vocab_size", lambda v: v >= 300, ">= 300"),)

    path: str = ""  # local HF tokenizer directory; empty = build the offline demo tokenizer
    enable_thinking: bool = True  # reference: thinking on for both roles
    simulator_thinking: bool = True
    demo_vocab_size: int = 480


@dataclasses.dataclass(frozen=True)
class DataSection(Checked):
    LABEL: ClassVar[str] = "data"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("source", *one_of(("demo", "jsonl", "parquet", "tfds"))),
        ("num_demo_tasks", _POS, "> 0"),
        ("prompts_per_step", _POS, "> 0"),
        ("num_epochs", _NONNEG, ">= 0"),
        ("max_prompt_length", _POS, "> 0"),
    )

    source: str = "demo"  # demo | jsonl | parquet | tfds
    path: str = ""  # file (jsonl/parquet) or tfds data_dir
    tfds_name: str = "envace_records"
    split: str = "train"
    num_demo_tasks: int = 64
    prompts_per_step: int = 16  # reference train_batch_size
    shuffle: bool = True
    seed: int = 0
    num_epochs: int = 0  # 0 = repeat forever
    max_prompt_length: int = 4000  # reference: filter prompts by this (keeps <= max - margin)


@dataclasses.dataclass(frozen=True)
class RoleSampling(Checked):
    """How one role samples. ``temperature=0`` is greedy (evaluation); training needs ``> 0``."""

    LABEL: ClassVar[str] = "sampling"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("temperature", _NONNEG, ">= 0"),
        ("top_p", _PROB, "in (0, 1]"),
        ("top_k", _NONNEG, ">= 0"),
        ("max_new_tokens", _POS, "> 0"),
    )

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 8000


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Checked):
    """The rollout engine's knobs; defaults are the reference's (spec 1.2), see configs/ for the demo's."""

    LABEL: ClassVar[str] = "rollout"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("mode", *one_of(MODES)),
        ("max_steps", _POS, "> 0"),
        ("max_assistant_turns", _POS, "> 0"),
        ("max_user_turns", _POS, "> 0"),
        ("max_model_len", _POS, "> 0"),
        ("rolling_slots", _POS, "> 0"),
        ("tool_call_syntax", *one_of(TOOL_CALL_SYNTAXES)),
        ("judge_streaming", *one_of(JUDGE_STREAMING)),
        ("judge_workers", _POS, "> 0"),
    )

    mode: str = "rehearsal"
    max_steps: int = 200  # env.max_steps micro-steps
    max_assistant_turns: int = 30
    max_user_turns: int = 30
    max_model_len: int = 20000  # caller terminates when len(ctx) + act.max_new_tokens >= this
    act: RoleSampling = RoleSampling()
    rehearse: RoleSampling = RoleSampling()
    ignore_think_tool_calls: bool = False  # faithful: the reference regex scans <think> too
    # "qwen3": a <tool_call> block parses wherever it starts (real Qwen3 with thinking off starts its turn with
    # one); "reference" (faithful) needs "\n<tool_call>\n" as the reference's regex does (docs/chat_template.md)
    tool_call_syntax: str = "qwen3"
    # faithful: one pending call simulated per micro-step; False answers all calls of a turn in one step
    sequential_simulation: bool = True
    progress_bar: bool = False  # a tqdm bar over micro-steps
    # Rolling batch: each episode moves on as soon as its own generations are back, and a finished
    # row's sampler slot goes to the next waiting request (needs clients with submit/step, e.g.
    # rl.rolling_client.RollingSamplerClient; other clients run in lockstep). Per-episode behaviour
    # (transitions, seeds, caps) is unchanged; only the order across episodes differs.
    rolling: bool = False
    rolling_slots: int = 32  # rows the rolling batch decodes at once
    # A call also returns early when nothing waits yet, once a quarter of its rows are done, so their
    # episodes' next requests join (RollingSamplerClient.eager_refill). Measured on the CPU demo only
    # (benchmarks/rl_step.py --compare refill), hence off here.
    rolling_eager_refill: bool = False
    # Judging streams (rl/judge_stream.py): a turn that ends goes to the judge at once, from a bounded pool,
    # and the other episodes keep generating; its verdict is applied after the next sampler call, a point
    # fixed by the schedule and not by when the verdict arrives, so a run repeats whatever the judge's
    # latency. "off" judges every ended turn before the next call (the reference's order); "auto" is "on"
    # for an asynchronous run (rl.max_staleness >= 1) whose judge answers over HTTP, else "off"
    # (rl.train.resolve_judge_streaming); the episode engine itself streams only on "on".
    judge_streaming: str = "auto"
    judge_workers: int = 8  # judge calls (each one batch of ended turns) in flight at once when streaming
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class HttpJudgeConfig(Checked):
    """An OpenAI-compatible judge endpoint. Defaults are the reference's (spec section 4.1)."""

    LABEL: ClassVar[str] = "judge.http"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("base_url", lambda v: v.startswith(("http://", "https://")), "an http:// or https:// URL"),
        ("max_attempts", _POS, ">= 1"),
        ("max_concurrency", _POS, ">= 1"),
        ("max_tokens", _POS, ">= 1"),
        ("timeout_s", _NONNEG, ">= 0"),
        ("backoff_base_s", _NONNEG, ">= 0"),
        ("backoff_max_s", _NONNEG, ">= 0"),
    )

    base_url: str = "http://127.0.0.1:8000"
    model: str = "Qwen/Qwen3-30B-A3B"
    temperature: float = 0.6
    top_p: float = 0.8
    max_tokens: int = 6000
    max_attempts: int = 5  # total attempts per verdict, first one included
    backoff_base_s: float = 1.0  # sleep after the a-th failure (a from 0): min(base*2^a, max)
    backoff_max_s: float = 30.0
    timeout_s: float = 300.0  # per HTTP attempt, applied to connect and to each socket read
    max_concurrency: int = 32  # HTTP requests in flight at once, across all callers
    api_key_env: str | None = None  # name of an env var holding a bearer token
    use_response_format: bool = True  # send the strict json_schema (servers without it: False)

    def validate(self) -> None:
        """The construction-time checks again (kept for callers that validate explicitly)."""
        check_rules(self, self.LABEL, self.RULES)


@dataclasses.dataclass(frozen=True)
class JudgeSection(Checked):
    LABEL: ClassVar[str] = "judge"
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("kind", *one_of(("rule", "http", "rule_then_http"))),
        ("outage_share", lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("outage_steps", _POS, "> 0"),
    )

    kind: str = "rule"  # rule | http | rule_then_http (rules first, HTTP for items without one)
    http: HttpJudgeConfig = dataclasses.field(default_factory=HttpJudgeConfig)
    # The run stops (rl.judge_outage.JudgeOutageError) once more than ``outage_share`` of a step's episodes
    # ended without a verdict (termination ``judge_api_failure``) on ``outage_steps`` consecutive steps: an
    # unreachable judge must not pass for a policy that scores 0. 1.0 never stops.
    outage_share: float = 0.5
    outage_steps: int = 2


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


SCHEDULES = ("constant", "cosine", "linear")  # learning-rate schedules after warmup (rl/optim.py)


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


@dataclasses.dataclass(frozen=True)
class MeshSection(Checked):
    """The training mesh ``(data, fsdp, tensor)`` (-1: the rest of the chips) and where rollouts sample.

    ``rollout_chips_per_host``: 0 (colocated) samples on the chips that train (one host: the training mesh;
    several: each host's own chips). ``c >= 1`` (disaggregated) keeps the last ``c`` chips of every host for
    rollouts, each host sampling its own prompts on them, and trains on the other chips of the slice; the
    weights go to the rollout chips after every update (rl.train.build_run, docs/async_rl.md)."""

    LABEL: ClassVar[str] = "mesh"
    RULES: ClassVar[tuple[Rule, ...]] = (("rollout_chips_per_host", _NONNEG, ">= 0"),)

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    rollout_chips_per_host: int = 0


@dataclasses.dataclass(frozen=True)
class CheckpointSection(Checked):
    LABEL: ClassVar[str] = "checkpoint"
    RULES: ClassVar[tuple[Rule, ...]] = (("every", _POS, "> 0"), ("keep", _POS, "> 0"))

    every: int = 50  # reference save_freq
    keep: int = 3
    async_save: bool = True
    hash_files: bool = False


@dataclasses.dataclass(frozen=True)
class LogSection(Checked):
    LABEL: ClassVar[str] = "log"
    RULES: ClassVar[tuple[Rule, ...]] = (("every", _POS, "> 0"),)

    every: int = 1
    tensorboard: bool = True
    plot: bool = True
    progress_bar: bool = True


def check_group_size(rl: RLSection) -> None:
    """A training run's GRPO group (the ``rl.n_rollouts`` rollouts of one prompt) needs two members.

    The baseline of a row is taken over its (prompt, role) group; with one rollout there is nothing to
    compare with: every row of a multi-turn episode carries the episode's score, so ``row_mean`` and
    ``rloo`` give them advantage 0, and a lone row (or ``trajectory_mean``'s one episode) keeps its raw
    score. Checked for a whole run only (``ExperimentConfig``): an ``RLSection`` built in code may hold
    one rollout on purpose (tests of the update)."""
    if rl.n_rollouts < 2 and rl.baseline != "none":
        raise ConfigError(
            f"config.rl.n_rollouts must be >= 2 with rl.baseline={rl.baseline!r}, got "
            f"{rl.n_rollouts}: a group of one rollout has no group-relative advantage (0 or the raw "
            f"score); raise rl.n_rollouts, or set rl.baseline='none' to train on raw scores"
        )


# Settings that act only together with another field's value; given without it they would be ignored
# without a word, so a run refuses them, naming both fields. Each entry: (is the setting given, does its
# context read it, message). Only settings whose "given" is unambiguous are here (a non-empty path, a flag
# turned on): a size or name equal to its default cannot be told apart from one left alone. The other
# pairs of that kind, not refused for that reason: model.vocab_size ... head_dim with a named model.preset
# or a model.hf_path (the architecture comes from the preset or the checkpoint); tokenizer.demo_vocab_size
# with a tokenizer.path; data.num_demo_tasks unless data.source='demo'; data.tfds_name unless 'tfds';
# data.split with 'jsonl' or 'parquet'; rollout.rolling_slots without rollout.rolling; loss.kl_type with
# loss.kl_coef=0; judge.http.* with judge.kind='rule'; rollout.rehearse.* and tokenizer.simulator_thinking
# with rollout.mode='real' (no REHEARSE role).
_TAKES_EFFECT: tuple[tuple[Callable[[Any], bool], Callable[[Any], bool], Callable[[Any], str]], ...] = (
    (
        lambda c: bool(c.data.path),
        lambda c: c.data.source != "demo",
        lambda c: (
            f"config.data.path={c.data.path!r} is never read with config.data.source='demo' (the demo tasks are "
            f"generated): set data.source to jsonl, parquet or tfds, or leave data.path empty"
        ),
    ),
    (
        lambda c: bool(c.model.simulator_hf_path),
        lambda c: c.rollout.mode in ("simulator", "noshare"),
        lambda c: (
            f"config.model.simulator_hf_path={c.model.simulator_hf_path!r} is read only by rollout.mode "
            f"'simulator' or 'noshare', but config.rollout.mode={c.rollout.mode!r}: set the mode or leave "
            f"model.simulator_hf_path empty"
        ),
    ),
    (
        lambda c: c.rollout.rolling_eager_refill,
        lambda c: c.rollout.rolling,
        lambda c: (
            "config.rollout.rolling_eager_refill=True acts only with config.rollout.rolling=True "
            "(it changes when the rolling batch refills): turn rollout.rolling on, or the refill off"
        ),
    ),
)


def check_takes_effect(cfg: Any) -> None:
    """Raises ``ConfigError`` for the first setting of ``_TAKES_EFFECT`` that its context would ignore."""
    for given, read, message in _TAKES_EFFECT:
        if given(cfg) and not read(cfg):
            raise ConfigError(message(cfg))


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(Checked):
    """A whole training run. Checks that span sections live here (``__post_init__``)."""

    LABEL: ClassVar[str] = "config"
    RULES: ClassVar[tuple[Rule, ...]] = (("total_steps", _POS, "> 0"),)

    name: str = "envace"
    run_dir: str = "runs/envace"
    seed: int = 0
    total_steps: int = 200  # RL iterations
    model: ModelSection = ModelSection()
    tokenizer: TokenizerSection = TokenizerSection()
    data: DataSection = DataSection()
    rollout: RolloutConfig = RolloutConfig()
    judge: JudgeSection = JudgeSection()
    rl: RLSection = RLSection()
    optim: OptimConfig = OptimConfig()
    loss: LossConfig = LossConfig()
    mesh: MeshSection = MeshSection()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()

    def __post_init__(self):
        super().__post_init__()
        # Training rows are scored at their sampling temperature (log-probs of logits / T): a greedy
        # training rollout has no distribution to score.
        for role in ("act", "rehearse"):
            t = getattr(self.rollout, role).temperature
            if not t > 0:
                raise ConfigError(
                    f"config.rollout.{role}.temperature must be > 0 for training (greedy "
                    f"sampling is for evaluation), got {t!r}",
                    leaf=f"rollout.{role}.temperature",
                    what="> 0 for training",
                    value=t,
                )
        check_group_size(self.rl)
        check_takes_effect(self)

    def run_optim(self) -> OptimConfig:
        """``optim`` with the schedule's length filled in: ``optim.total_steps`` when set, else one
        optimizer step per mini-batch per PPO epoch of each of the run's ``total_steps`` iterations."""
        if self.optim.total_steps:
            return self.optim
        steps = self.total_steps * self.rl.ppo_epochs * self.rl.mini_batches
        return dataclasses.replace(self.optim, total_steps=steps)


# ----------------------------------------------------------------------------- conversion


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _convert(value: Any, hint: Any, where: str, default: Any = None) -> Any:
    """Checks ``value`` against a type hint (int, float, str, bool, X | None, tuple[X, ...], nested
    dataclass; a nested section fills the fields it does not give from ``default``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where} must be {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, default if isinstance(default, hint) else None)
    if origin is tuple:
        # tuple[X, ...]: a list, or a comma-separated string (which overrides cleanly from the command line)
        args = typing.get_args(hint)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise ConfigError(f"{where}: unsupported field type {hint!r}")
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if args[0] is int:
                try:
                    value = [int(v) for v in value]
                except ValueError:
                    raise ConfigError(f"{where} must be comma-separated ints, got {value!r}") from None
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list or a comma-separated string, got {value!r}")
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be a bool, got {type(value).__name__} {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an int, got {type(value).__name__} {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} must be finite, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint!r}")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a section (dict/ConfigDict), got {type(value).__name__}")
    return value


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _build(cls: type, value: Any, where: str, base: Any = None) -> Any:
    """``value`` (a mapping) -> ``cls``. Fields it does not give keep their value in ``base`` (the parent
    section's default for this field, e.g. an eval config's greedy ``sampling``), else the class default."""
    if isinstance(value, cls):
        return value
    data = _as_mapping(value, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        near = {u: difflib.get_close_matches(u, list(fields), n=1, cutoff=0.6) for u in unknown}
        hints = [f"{where}.{m[0]} for {u!r}" for u, m in near.items() if m]
        hint = f"did you mean {', '.join(hints)}? " if hints else ""
        raise ConfigError(f"{where} has unknown field(s) {unknown}; {hint}known: {sorted(fields)}")
    defaults = {k: getattr(base, k) if base is not None else _field_default(f) for k, f in fields.items()}
    kwargs = {k: v for k, v in defaults.items() if k not in data and base is not None}
    kwargs.update({k: _convert(v, hints[k], f"{where}.{k}", defaults[k]) for k, v in data.items()})
    try:
        return cls(**kwargs)
    except ConfigError as e:  # the dataclass's own range rules: name the full dotted field
        if not e.leaf:
            raise
        raise ConfigError(
            f"{where}.{e.leaf} must be {e.what}, got {e.value!r}", leaf=e.leaf, what=e.what, value=e.value
        ) from e
    except (ValueError, TypeError) as e:  # other construction-time checks
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from e


def load_section(cls: type, value: Any, where: str = "config") -> Any:
    """A mapping (dict / ConfigDict) -> the frozen dataclass ``cls``, every field type- and range-checked;
    errors name the dotted field under ``where``. The one converter for every config shape (training
    runs, eval runs, the demo)."""
    return _build(cls, value, where)


def check_runnable(cfg: ExperimentConfig) -> None:
    """Checks that a run can start: the paths that the reference configs leave to the command line."""
    if cfg.data.source != "demo" and not cfg.data.path:
        raise ConfigError(f"config.data.path is required for data.source={cfg.data.source!r}")
    if cfg.model.preset != "tiny" and not cfg.model.hf_path:
        raise ConfigError(
            f"config.model.hf_path is required for model.preset={cfg.model.preset!r} "
            f"(a training run starts from pretrained weights; random init is only for the tiny "
            f"preset)"
        )
    if cfg.model.hf_path and not cfg.tokenizer.path:
        raise ConfigError("config.tokenizer.path is required with a pretrained model.hf_path")
    if cfg.rollout.mode in ("simulator", "noshare") and cfg.model.hf_path and not cfg.model.simulator_hf_path:
        raise ConfigError(
            f"config.model.simulator_hf_path is required for rollout.mode={cfg.rollout.mode!r} "
            f"with a pretrained policy (model.hf_path)"
        )


def load_config(config: Any) -> ExperimentConfig:
    """A ConfigDict / dict (as written in configs/*.py) -> validated ``ExperimentConfig``."""
    return load_section(ExperimentConfig, config, "config")


def _config_value(value: Any, hint: Any) -> Any:
    import ml_collections

    if dataclasses.is_dataclass(value):
        hints = typing.get_type_hints(type(value))
        return ml_collections.ConfigDict(
            {f.name: _config_value(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(value)}
        )
    if isinstance(value, tuple):  # comma-separated, so ``--config.x=a,b`` overrides it
        return ",".join(str(v) for v in value)
    if value is None:  # a typed placeholder, so ``--config.x=v`` can still set an optional field
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return ml_collections.config_dict.placeholder(kinds[0] if len(kinds) == 1 else object)
    return value


def to_config_dict(cfg: Any):
    """The inverse of ``load_section`` / ``load_config``: a ConfigDict of a frozen config dataclass in which
    every field can be overridden from the command line (tuples as comma-separated strings, unset optional
    fields as typed placeholders)."""
    return _config_value(cfg, type(cfg))


def as_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def base_config():
    """A ConfigDict holding every field at its default (reference values); configs/*.py edit it."""
    return to_config_dict(ExperimentConfig())


def config_from_file(path: str, arg: str | None = None):
    """Runs ``get_config()`` of a config file (how ablation configs start from a base config)."""
    import importlib.util
    import os

    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    name = "envace_cfg_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path!r} has no get_config()")
    return module.get_config() if arg is None else module.get_config(arg)
