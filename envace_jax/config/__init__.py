"""Every knob of a run, in one place: frozen dataclasses, their ranges, and ConfigDict <-> dataclass.

Config files under ``configs/`` build a ``ConfigDict`` (so every field can be overridden from the
command line with ``--config.a.b=v``); ``load_config`` turns it into an ``ExperimentConfig``. Every
knob is defined once, in this package, with its default and its range (the update's sections ``rl``,
``optim`` and ``loss`` in ``config.train_sections``, the choice lists in ``config.choices``, the checking
machinery in ``config.rules``, the ConfigDict conversion in ``config.convert``; all re-exported here); the
classes that use a knob (the trainer's ``OptimConfig``/``LossConfig``, the rollout engine's
``RolloutConfig``, the HTTP judge's ``HttpJudgeConfig``, the RL step's ``RLSection``) import it from here.
There is one validation path: each dataclass checks its own fields when it is built (``__post_init__``),
whether from a config file or in code, and ``load_config`` only adds the dotted name of the field
(``config.optim.lr``) to the message, so a typo in a launch command fails before any device work starts.

This package imports neither jax nor the model: reading a config file is cheap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

from envace_jax.model_sizes import TINY
from envace_jax.config.rules import (
    _NONNEG,
    _POS,
    _PROB,
    Checked,
    ConfigError,
    Rule,
    one_of,
)
from envace_jax.config.choices import (  # noqa: F401  (public names of envace_jax.config)
    AGG_MODES,
    BASELINES,
    BEHAVIOUR_IS,
    DTYPES,
    JUDGE_STREAMING,
    KL_TYPES,
    MODEL_PRESETS,
    MODES,
    MOE_DISPATCHES,
    MOE_PRESETS,
    RATIO_LEVELS,
    REMAT_POLICIES,
    ROLLOUT_ENGINES,
    SCHEDULES,
    TOOL_CALL_SYNTAXES,
    VLLM_DTYPES,
)
from envace_jax.config.convert import _build, _convert, load_section, to_config_dict  # noqa: F401
from envace_jax.config.engine_sections import VllmSettings
from envace_jax.config.judge_sections import JUDGE_KINDS, HttpJudgeConfig, JudgeSection, LocalJudgeConfig  # noqa: F401
from envace_jax.config.train_sections import LossConfig, OptimConfig, RLSection

# model.lora_targets: the projections a LoRA adapter may sit on (models/lora.py TARGETS, PEFT's module names)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _layer_list_ok(v) -> bool:
    try:
        return all(int(i) >= 0 for i in str(v).split(",") if i.strip())
    except ValueError:
        return False


def _lora_targets_ok(v) -> bool:
    names = [t.strip() for t in str(v).split(",") if t.strip()]
    return bool(names) and set(names) <= set(LORA_TARGETS)


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
        ("preset", *one_of(MODEL_PRESETS + MOE_PRESETS)),
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
        ("lora_rank", _NONNEG, ">= 0"),
        ("lora_alpha", _POS, "> 0"),
        (
            "lora_dropout",
            lambda v: v == 0,
            "0 (adapters are merged into each layer's weights, where no dropout of their input can act)",
        ),
        ("lora_targets", lambda v: _lora_targets_ok(v), f"a comma-separated subset of {LORA_TARGETS}"),
        ("num_experts", _NONNEG, ">= 0"),
        ("num_experts_per_tok", _POS, "> 0"),
        ("moe_intermediate_size", _POS, "> 0"),
        ("decoder_sparse_step", _POS, "> 0"),
        ("mlp_only_layers", lambda v: _layer_list_ok(v), "a comma-separated list of layer indices (or empty)"),
        ("moe_dispatch", *one_of(MOE_DISPATCHES)),
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
    # LoRA (models/lora.py): rank > 0 trains adapters of that rank on lora_targets and freezes the base (it leaves
    # the optimizer state and the checkpoints); scale lora_alpha / rank (/ sqrt(rank) with lora_rslora).
    # lora_adapter: a PEFT adapter directory to start from (its rank, alpha and targets are used; lora_rank may
    # stay 0). Exports write the adapter (PEFT) and the merged model (launch/export_hf.py).
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: str = ",".join(LORA_TARGETS)
    lora_rslora: bool = False
    lora_adapter: str = ""
    # Qwen3-MoE (models/qwen3_moe.py). A tiny preset with num_experts > 0 is a Qwen3-MoE of these sizes (every
    # layer sparse unless mlp_only_layers / decoder_sparse_step say otherwise, as in transformers); the MoE presets
    # (qwen3_30b_a3b, ...) and checkpoints carry their own. moe_dispatch: how the experts run (auto: blocked on
    # CPU, ragged_dot elsewhere), for presets and checkpoints too.
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    decoder_sparse_step: int = 1
    mlp_only_layers: str = ""
    norm_topk_prob: bool = True
    moe_dispatch: str = "auto"

    @property
    def moe(self) -> bool:
        return bool(self.num_experts) or self.preset in MOE_PRESETS

    def moe_kwargs(self) -> dict:
        """The tiny preset's Qwen3MoeConfig fields (empty for a dense tiny model)."""
        if not self.num_experts:
            return {}
        layers = tuple(int(i) for i in str(self.mlp_only_layers).split(",") if i.strip())
        return dict(
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate_size,
            decoder_sparse_step=self.decoder_sparse_step,
            mlp_only_layers=layers,
            norm_topk_prob=self.norm_topk_prob,
            moe_dispatch=self.moe_dispatch,
        )

    @property
    def lora(self) -> bool:
        return bool(self.lora_rank or self.lora_adapter)


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
        ("engine", *one_of(ROLLOUT_ENGINES)),
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
    # What generates both roles' turns: "native" (our Sampler) or "vllm" (a vLLM engine in a process of its own,
    # weights sent to it after every update; rl/vllm_engine.py, docs/vllm.md)
    engine: str = "native"
    vllm: VllmSettings = VllmSettings()


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
        lambda c: bool(c.judge.local.hf_path),
        lambda c: c.judge.kind.endswith("local"),
        lambda c: (
            f"config.judge.local.hf_path={c.judge.local.hf_path!r} is never read with "
            f"config.judge.kind={c.judge.kind!r}; set config.judge.kind='local' (or 'rule_then_local') to judge with it"
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
