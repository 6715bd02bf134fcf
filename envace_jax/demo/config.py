"""Demo settings: one frozen dataclass and its presets.

``default()`` (``make demo``) is the setting EnvACE is for. RL starts from the shipped base model
(``assets/demo_base``, trained once by ``make pretrain`` on train-split tasks only: demonstrations plentiful
on the paths where the tools simply answer and scarce on the branches where the environment pushes back, plus
logs of real tool executions, errors included). RL prompts and held-out tasks carry a stated, larger share of
push-back branches. ``legacy()`` is the previous default: SFT from scratch on 64 demonstrations of the natural
mix, then RL, 256 test tasks. ``reduced()`` is a minutes-long end-to-end run for CI.

The values of the presets were chosen on the validation split (``launch/demo.py --eval_split=validation``);
the test split is read only for the reported numbers.
"""

from __future__ import annotations

import dataclasses
import typing

from envace_jax.data.demo_tasks import FAMILIES, SPLITS
from envace_jax.eval.config import MEMORY_GATES, check_memory_tools
from envace_jax.model_sizes import DEMO, MICRO
from envace_jax.rl.recipes import ALGORITHMS

DEFAULT_BASE_DIR = "assets/demo_base"
# rl_replay_roles -> the roles of the corpus rows RL's replay batches are drawn from
SILENT_ODDS = ("share", "natural")  # rl_silent_odds (demo.data.draw_rl_tasks)
REPLAY_ROLES = {"act+rehearse": ("act", "rehearse"), "rehearse": ("rehearse",)}


def tool_names(spec: str) -> tuple[str, ...]:
    """The tool names of a comma-separated field (``rehearsal_real_reads``, ``rehearsal_memory_tools``)."""
    return tuple(t.strip() for t in spec.split(",") if t.strip())


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    seed: int = 0
    # the RL stage's own randomness (prompt order, rollout sampling, replay batches); None = ``seed``. With
    # another value the tasks (RL prompts, held-out tasks) stay ``seed``'s: it tells a draw's effect from luck
    rl_seed: int | None = None
    # ---- the start of RL: a pretrained base directory (``make pretrain``), or "" for SFT from scratch on
    # ``sft_tasks`` demonstrations with ``world_model_rows`` world-model rows (the legacy setting)
    base_dir: str = ""
    # ---- data: splits are disjoint by construction (demo_tasks hashes task content into a split)
    sft_tasks: int = 64  # from scratch: the small fixed set of demonstrations (train split, first N)
    rl_tasks: int = 512  # fresh train prompts; they only ground REHEARSE and the judge
    world_model_rows: int = 1536  # from scratch: real executions of varied calls (errors included) on other worlds
    validation_tasks: int = 128
    test_tasks: int = 256
    eval_split: str = "test"  # tune with "validation"; report with "test"
    # share of push-back branches (data.demo_tasks.PUSH_BACK) in the RL prompts and the held-out tasks;
    # None keeps the natural mix (about 23%)
    rl_push_back_share: float | None = None
    eval_push_back_share: float | None = None
    # how rl_push_back_share is reached: "share" takes push-back tasks wherever they fall; "natural" keeps,
    # per task type, the natural odds of a silent push-back (no tool error announces it: a condition on a
    # value fails) against a happy path, so RL cannot learn a branch from how often it is asked
    rl_silent_odds: str = "share"
    # the worlds of the RL prompts and the held-out tasks (data.demo_tasks.FAMILIES): "default", or
    # "irreversible" (the wire world: rules in the tool descriptions, wrong calls that cannot be undone; the
    # test-time rehearsal tasks). The base's pretraining and the SFT demonstrations always use "default", so
    # an "irreversible" task is never in them; that family has no push-back branch, so the push-back shares
    # are not applied to it.
    task_family: str = "default"
    # ---- tokenizer / model
    vocab_size: int = 2048  # lines_digits BPE: prompts ~110 tokens, digits single tokens
    hidden_size: int = DEMO.hidden_size  # model_sizes.DEMO
    intermediate_size: int = DEMO.intermediate_size
    num_layers: int = DEMO.num_layers
    num_heads: int = DEMO.num_heads
    num_kv_heads: int = DEMO.num_kv_heads
    head_dim: int = DEMO.head_dim
    # ---- SFT warm start
    sft_steps: int = 450
    sft_batch_rows: int = 32  # half ACT, half REHEARSE rows
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
    # which of the corpus's roles the replay batches hold: "act+rehearse", or "rehearse" (world-model rows
    # only: they keep REHEARSE faithful without pulling ACT back to the demonstrations' happy paths)
    rl_replay_roles: str = "act+rehearse"
    # the update's exact shortcuts (rl.old_logprobs_from_update, rl.skip_zero_advantage_rows): the same
    # optimizer steps as the reference's two-pass update over every row (tests/rl/test_update_shortcuts.py),
    # in less time (most groups' rollouts score alike: ~70% of the rows carry no advantage)
    rl_update_shortcuts: bool = True
    # every K RL steps, greedy real-tool success on the eval split (the learning curve: summary["rl"]["curve"],
    # report.md, success_curve.png); its time is kept off the RL stage's clock, so the more-SFT baseline's
    # budget is unchanged. 0 = no curve.
    rl_eval_every: int = 0
    # asynchronous RL (rl.max_staleness, rl/async_pipeline.py): step k's rollouts sample from the weights after
    # update max(0, k - rl_max_staleness) while earlier steps train; 0 = the synchronous loop (the default)
    rl_max_staleness: int = 0
    # its off-policy correction (rl.behaviour_is: auto | none | token | sequence) and weight cap
    rl_behaviour_is: str = "auto"
    rl_behaviour_is_cap: float = 2.0
    # the RL objective (rl/recipes.py): grpo (the reference's), gspo, dapo (with dynamic sampling: needs
    # rl_max_staleness = 0) or dr_grpo; the recipe's lengths follow act/rehearse_max_new_tokens
    rl_algorithm: str = "grpo"
    # LoRA in RL (models/lora.py): > 0 trains adapters of this rank on every projection (the start frozen), folded
    # into the weights when RL ends; lora_alpha 0 = 2 x rank. LoRA wants a larger rl_lr than full training.
    lora_rank: int = 0
    lora_alpha: float = 0.0
    act_max_new_tokens: int = 64
    rehearse_max_new_tokens: int = 64
    temperature: float = 0.6  # both roles' training rollouts (evaluation is greedy)
    max_model_len: int = 768
    max_steps: int = 10  # rollout micro-steps per episode
    # Rolling batch (rl/rolling_client.py) in RL rollouts and evaluation: a finished row's sampler slot
    # goes to the next waiting request; False = lockstep micro-steps (one sampler call per step)
    rolling: bool = True
    rolling_slots: int = 32  # rows of the RL rollouts' rolling batch (evaluation uses eval_batch)
    # ... and a call returns once a quarter of its rows are done even when nothing waits yet: the rollout
    # engine queues their episodes' next requests at once (benchmarks/rl_step.py --compare refill)
    rolling_eager_refill: bool = True
    # What generates rollouts and evaluations: "native" (our Sampler) or "vllm" (rl/vllm_engine.py: a vLLM engine
    # per model in a process of its own, synced after every change of weights; needs `make vllm-deps`). vLLM
    # batches continuously itself, so `rolling` does not apply to it. vllm_enforce_eager: no torch.compile at the
    # engine's start (the demo's model is tiny: compiling costs more than it saves in a run this short)
    rollout_engine: str = "native"
    vllm_enforce_eager: bool = True
    # ---- evaluation
    eval_batch: int = 128  # episodes per rollout call in the real-tool evaluation
    fidelity_tasks: int = 32  # held-out tasks whose calls are teacher-forced for REHEARSE fidelity
    more_sft: bool = True  # the equal-compute baseline
    more_sft_lr: float = 0.0  # its learning rate when RL starts from a base (0: sft_lr)
    # ---- test-time rehearsal table (launch/demo.py --rehearsal_sweep)
    rehearsal_temperature: float = 0.6  # sampling of the imagined episodes (the committed run is greedy)
    rehearsal_max_memory_chars: int = 600
    # "on_mistake": the memory reaches the real attempt only when a rehearsal wrote a call the tool schema
    # rejects (eval.rehearsal); "on_error": only when a rehearsal met a failure, an imagined refusal included;
    # "on_tools": only when a rehearsal called one of rehearsal_memory_tools; "always": every time, as EnvACE does
    rehearsal_place_memory: str = "on_mistake"
    # comma-separated tools of rehearsal_place_memory="on_tools" (e.g. "close_account")
    rehearsal_memory_tools: str = ""
    # comma-separated tools that change nothing (e.g. "get_balance"): a rehearsal's calls of them, before its
    # first call of another tool, run on its own copy of the real world (eval.rehearsal, "Real reads");
    # "": every response imagined, as EnvACE does
    rehearsal_real_reads: str = ""
    # ---- rehearsal memories in RL prompts (demo.rl_memory): this share of each RL step's prompts first gets
    # the memory test-time rehearsal builds from rl_memory_rehearsals imagined episodes of the current policy
    # (the rehearsal_* settings above), so the policy learns to act on one. 0 = none (the default).
    rl_memory_fraction: float = 0.0
    rl_memory_rehearsals: int = 1
    # longest training row in tokens (prompt + generation; demo.stages.TRAIN_LEN by default). The RL update
    # drops longer rows (rl overlong_rows="drop", logged as update/overlong_rows_dropped): the wire world's long
    # tool descriptions plus a memory need more (a prompt with a 600-character memory is ~350 tokens)
    train_len: int = 384

    def __post_init__(self):
        if self.eval_split not in SPLITS:
            raise ValueError(f"demo eval_split must be one of {SPLITS}, got {self.eval_split!r}")
        for name in ("rl_push_back_share", "eval_push_back_share"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"demo {name} must be None or in [0, 1], got {v!r}")
        if self.temperature <= 0 or self.rehearsal_temperature < 0:
            raise ValueError("demo temperature must be > 0 (training rollouts sample) and rehearsal_temperature >= 0")
        if self.rehearsal_place_memory not in MEMORY_GATES:
            raise ValueError(
                f"demo rehearsal_place_memory must be one of {MEMORY_GATES}, got {self.rehearsal_place_memory!r}"
            )
        check_memory_tools(
            self.rehearsal_place_memory,
            tool_names(self.rehearsal_memory_tools),
            "demo rehearsal_place_memory",
            "rehearsal_memory_tools",
        )
        if self.rl_replay_roles not in REPLAY_ROLES:
            raise ValueError(
                f"demo rl_replay_roles must be one of {sorted(REPLAY_ROLES)}, got {self.rl_replay_roles!r}"
            )
        if not 0.0 <= self.rl_memory_fraction <= 1.0:
            raise ValueError(f"demo rl_memory_fraction must be in [0, 1], got {self.rl_memory_fraction!r}")
        if isinstance(self.rl_memory_rehearsals, bool) or not isinstance(self.rl_memory_rehearsals, int):
            raise ValueError(f"demo rl_memory_rehearsals must be an int >= 1, got {self.rl_memory_rehearsals!r}")
        if self.rl_memory_rehearsals < 1:
            raise ValueError(f"demo rl_memory_rehearsals must be an int >= 1, got {self.rl_memory_rehearsals!r}")
        if isinstance(self.train_len, bool) or not isinstance(self.train_len, int) or self.train_len < 64:
            raise ValueError(f"demo train_len must be an int >= 64, got {self.train_len!r}")
        if self.task_family not in FAMILIES:
            raise ValueError(f"demo task_family must be one of {sorted(FAMILIES)}, got {self.task_family!r}")
        if self.rl_silent_odds not in SILENT_ODDS:
            raise ValueError(f"demo rl_silent_odds must be one of {SILENT_ODDS}, got {self.rl_silent_odds!r}")
        if self.rl_seed is not None and (
            isinstance(self.rl_seed, bool) or not isinstance(self.rl_seed, int) or self.rl_seed < 0
        ):
            raise ValueError(f"demo rl_seed must be None or an int >= 0, got {self.rl_seed!r}")
        if self.rl_max_staleness and self.rl_memory_fraction:
            raise ValueError(
                "demo rl_memory_fraction > 0 needs rl_max_staleness = 0: the memories are built with the current "
                "policy at each step, which an asynchronous step's rollouts do not sample from"
            )
        if self.rl_algorithm not in ALGORITHMS:
            raise ValueError(f"demo rl_algorithm must be one of {ALGORITHMS}, got {self.rl_algorithm!r}")
        if self.rl_algorithm == "dapo" and self.rl_max_staleness:
            raise ValueError(
                "demo rl_algorithm='dapo' needs rl_max_staleness = 0: dynamic sampling decides its extra rollout "
                "rounds from the step's own rewards"
            )
        if self.rollout_engine not in ("native", "vllm"):
            raise ValueError(f"demo rollout_engine must be native or vllm, got {self.rollout_engine!r}")
        if self.rollout_engine == "vllm" and self.rl_max_staleness:
            raise ValueError("demo rollout_engine='vllm' needs rl_max_staleness = 0 (one engine, synchronous steps)")
        if self.rl_mode not in ("rehearsal", "real", "simulator"):
            raise ValueError(f"demo rl_mode must be rehearsal, real or simulator, got {self.rl_mode!r}")
        for name in (
            "sft_tasks",
            "rl_tasks",
            "test_tasks",
            "validation_tasks",
            "sft_batch_rows",
            "prompts_per_step",
            "n_rollouts",
            "micro_batch_size",
            "eval_batch",
            "rolling_slots",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"demo {name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "sft_steps",
            "rl_steps",
            "rl_replay_batches",
            "world_model_rows",
            "fidelity_tasks",
            "rl_eval_every",
            "rl_max_staleness",
            "lora_rank",
            "lora_alpha",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"demo {name} must be >= 0, got {getattr(self, name)}")

    def replace(self, **kw) -> "DemoConfig":
        return dataclasses.replace(self, **kw)

    @property
    def from_base(self) -> bool:
        return bool(self.base_dir)

    @property
    def rl_stream_seed(self) -> int:
        return self.seed if self.rl_seed is None else self.rl_seed


def default() -> DemoConfig:
    """`make demo`: the EnvACE setting, RL from the base shipped in assets/demo_base."""
    return envace()


def envace() -> DemoConfig:
    """The EnvACE setting (module doc); RL settings chosen on validation (256 tasks, from the base, whose
    success is 0.809: happy 0.938, push-back 0.680).

    RL prompts are 75% push-back: the base's pass@16 exceeds its greedy success there (0.781 vs 0.680)
    and barely where the tools simply answer (0.969 vs 0.938), so those prompts carry the GRPO signal;
    the 25% happy prompts let RL see (and punish) a push-back where none belongs. The replay batch after
    each step holds world-model rows only: replaying the base's ACT demonstrations (96% happy) pulled ACT
    back to the happy paths and held push-back learning to +3 points (0.809 -> 0.824 at 96 and at 144
    steps, all push-back prompts), while with no replay at all push-back rose to 0.844 but happy fell to
    0.820. 75% push-back with world-model replay: 0.852 / 0.852 / 0.855 / 0.879 after 48 / 96 / 144 / 192
    steps (happy 0.898, push-back 0.859 at 192); 50% push-back: 0.836 / 0.832 / 0.840 (happy 0.930,
    push-back 0.750 at 144). Held-out tasks stay at half push-back.

    2,048 test tasks: the RL gain on validation was +7.0 and +5.1 points (seeds 0 and 1); with 1,024 tasks two
    95% Wilson CIs around 0.78-0.85 stop overlapping only for gains above ~5 points (seed 1's test gain of
    +4.5 missed by 0.4 on 1,024 tasks), with 2,048 above ~3.5. The first 1,024 tasks are the same as before
    (a longer split starts with the shorter one)."""
    return DemoConfig(
        base_dir=DEFAULT_BASE_DIR,
        rl_tasks=1024,
        validation_tasks=256,
        test_tasks=2048,
        rl_push_back_share=0.75,
        eval_push_back_share=0.5,
        sft_steps=0,
        fidelity_tasks=128,
        more_sft_lr=3e-4,
        rl_steps=192,
        rl_lr=3e-4,
        rl_replay_roles="rehearse",
    )


def legacy() -> DemoConfig:
    """The previous default: SFT from scratch on 64 natural-mix demonstrations, then RL; 256 test tasks."""
    return DemoConfig()


def reduced() -> DemoConfig:
    """A minutes-long end-to-end run for CI: tiny model from scratch, few tasks, few steps."""
    return DemoConfig(
        sft_tasks=8,
        rl_tasks=16,
        world_model_rows=8,
        validation_tasks=8,
        test_tasks=8,
        vocab_size=512,
        **MICRO.fields(),
        sft_steps=3,
        sft_batch_rows=8,
        sft_warmup=0,
        micro_batch_size=8,
        rl_steps=2,
        rl_replay_batches=1,
        prompts_per_step=2,
        n_rollouts=2,
        act_max_new_tokens=16,
        rehearse_max_new_tokens=16,
        max_model_len=1024,
        max_steps=4,
        eval_batch=8,
        fidelity_tasks=4,
        rl_push_back_share=0.5,
        eval_push_back_share=0.5,
    )


PRESETS = {"default": default, "envace": envace, "legacy": legacy, "reduced": reduced}


def demo_config_dict(preset: str = "default"):
    """A ConfigDict of every ``DemoConfig`` field of ``preset`` (what ``configs/demo.py`` returns, so each
    field can be overridden with ``--config.field=value``); read it back with ``load_demo_config``."""
    from envace_jax.config import to_config_dict

    if preset not in PRESETS:
        raise ValueError(f"demo preset {preset!r}; choose one of {sorted(PRESETS)}")
    return to_config_dict(PRESETS[preset]())


def load_demo_config(cfg) -> DemoConfig:
    """A ConfigDict / dict -> a checked ``DemoConfig`` (the converter of every other config)."""
    from envace_jax.config import load_section

    return load_section(DemoConfig, cfg, "config")


def parse_overrides(cfg, items: typing.Sequence[str]):
    """``cfg`` (a frozen dataclass) with ``field=value`` items applied; values are parsed by the field's
    type (``none`` for an optional field, ``true``/``false`` for a flag). Unknown fields and unparsable
    values are errors that name the field."""
    hints = typing.get_type_hints(type(cfg))
    kw = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected field=value")
        k, v = item.split("=", 1)
        if k not in hints:
            raise ValueError(f"--set {k}: unknown field of {type(cfg).__name__}; known: {sorted(hints)}")
        kinds = [t for t in typing.get_args(hints[k]) or (hints[k],) if t is not type(None)]
        optional = type(None) in typing.get_args(hints[k])
        if optional and v.lower() == "none":
            kw[k] = None
        elif kinds[0] is bool:
            if v.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"--set {k}={v!r}: expected true or false")
            kw[k] = v.lower() in ("1", "true", "yes")
        else:
            try:
                kw[k] = kinds[0](v)
            except ValueError:
                raise ValueError(f"--set {k}={v!r}: expected {kinds[0].__name__}") from None
    return dataclasses.replace(cfg, **kw)
