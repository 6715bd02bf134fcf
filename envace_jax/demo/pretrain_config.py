"""``PretrainConfig``: what ``make pretrain`` trains (corpus sizes, model shape, optimisation, the shares of
each row group in a batch) and its presets (``default``, ``tiny``, ``deep``, ``wire``, ``wire_memory``). The run
itself is ``demo.pretrain``."""

from __future__ import annotations

import dataclasses

from envace_jax.config import SCHEDULES
from envace_jax.model_sizes import DEMO, MICRO
from envace_jax.rl.types import ACT, REHEARSE

# Row groups of a batch besides ACT and REHEARSE (``split_shares``).
MEMORY_GROUP = "act+memory"
TANK_GROUP = "act+tank"
WIRE_ACT_GROUP = "act+wire"
WIRE_REHEARSE_GROUP = "rehearse+wire"
# Fields a continued base must share with the base it continues (its corpus, tokenizer and layer shapes).
SHARED_WITH_INIT = (
    "seed",
    "demonstrations",
    "push_back_share",
    "world_model_rows",
    "tokenizer_tasks",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    seed: int = 0
    # ---- corpus (train split only)
    demonstrations: int = 8192
    push_back_share: float = 0.04  # rare but present: RL can only sharpen what sampling already emits
    world_model_rows: int = 8192
    tokenizer_tasks: int = 2048
    vocab_size: int = 2048
    # ---- model (a tiny Qwen3)
    hidden_size: int = DEMO.hidden_size  # model_sizes.DEMO
    intermediate_size: int = DEMO.intermediate_size
    num_layers: int = DEMO.num_layers
    num_heads: int = DEMO.num_heads
    num_kv_heads: int = DEMO.num_kv_heads
    head_dim: int = DEMO.head_dim
    # ---- optimisation
    steps: int = 6000
    batch_rows: int = 32  # half ACT, half REHEARSE
    micro_batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 100  # then ``schedule``
    schedule: str = "cosine"  # after warmup: "cosine" or "linear" decay to 0 at ``steps``, or "constant"
    # ---- continuing a base (the ``deep`` preset)
    init_from: str = ""  # a base directory to continue (its weights and tokenizer); "" = from scratch
    grow_factor: int = 1  # the continued model is this many times deeper (``num_layers`` is the result)
    tank_share: int = 0  # ACT rows of a batch that are tank-world comparison rows
    tank_tasks: int = 16384  # tank conversations to draw those rows from
    # ---- the wire world's happy path and rules (the ``wire`` preset; ``data.wire_corpus``)
    wire_demonstrations: int = 0  # plain wire tasks (both roles' rows)
    wire_world_model_rows: int = 0  # REHEARSE rows of real single calls on those tasks' worlds
    wire_act_share: int = 0  # ACT rows of a batch that are wire rows
    wire_rehearse_share: int = 0  # REHEARSE rows of a batch that are wire rows
    # ---- ACT rows after a rehearsal memory in the wire world (the ``wire_memory`` preset; ``demo.wire_memory``),
    # drawn with the wire ACT rows
    wire_retry_tasks: int = 0  # trap tasks shown after a memory of a failed, rule-blind attempt
    wire_memory_plain: int = 0  # plain wire tasks shown after a memory of their own plan
    # ---- rehearsal-memory rows
    memory_from: float = 0.8  # fraction of the steps after which memory rows join the ACT half
    memory_share: float = 0.25  # of the ACT rows of a batch
    memory_tasks: int = 1024  # demonstrations whose memories are built
    memory_max_chars: int = 600
    # ---- REHEARSE's prompt: the compact one with the tools' descriptions (``demo.data.make_codec``); a demo run
    # from this base uses the same prompt
    rehearse_tool_descriptions: bool = False
    memory_temperature: float = 0.6  # sampling of the imagined episodes (as the demo's test-time table)
    # ---- bookkeeping
    eval_every: int = 1000  # validation curve (0: only at the end)
    validation_tasks: int = 256
    validation_push_back_share: float = 0.5
    checkpoint_every: int = 200

    def __post_init__(self):
        for name in (
            "demonstrations",
            "tokenizer_tasks",
            "steps",
            "batch_rows",
            "micro_batch_size",
            "validation_tasks",
            "checkpoint_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"pretrain {name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "world_model_rows",
            "memory_tasks",
            "eval_every",
            "warmup",
            "tank_share",
            "tank_tasks",
            "wire_demonstrations",
            "wire_world_model_rows",
            "wire_act_share",
            "wire_rehearse_share",
            "wire_retry_tasks",
            "wire_memory_plain",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"pretrain {name} must be >= 0, got {getattr(self, name)}")
        for name in ("push_back_share", "memory_from", "memory_share", "validation_push_back_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"pretrain {name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0 or self.memory_temperature <= 0:
            raise ValueError("pretrain lr and memory_temperature must be > 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pretrain schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.grow_factor < 1 or (self.grow_factor > 1 and not self.init_from):
            raise ValueError(
                f"pretrain grow_factor must be >= 1, and above 1 only with init_from (a base to grow); "
                f"got grow_factor={self.grow_factor}, init_from={self.init_from!r}"
            )
        if self.tank_share and not self.tank_tasks:
            raise ValueError("pretrain tank_share > 0 needs tank_tasks > 0")
        if (self.wire_act_share or self.wire_rehearse_share) and not self.wire_demonstrations:
            raise ValueError("pretrain wire_act_share or wire_rehearse_share > 0 needs wire_demonstrations > 0")
        if self.wire_memory_plain > self.wire_demonstrations:
            raise ValueError(
                f"pretrain wire_memory_plain={self.wire_memory_plain} takes its tasks from the "
                f"{self.wire_demonstrations} wire_demonstrations; it cannot be larger"
            )
        if (self.wire_retry_tasks or self.wire_memory_plain) and not self.wire_act_share:
            raise ValueError("pretrain wire_retry_tasks or wire_memory_plain > 0 needs wire_act_share > 0")
        # the halves must hold them all
        split_shares(self.batch_rows, self.memory_share, self.tank_share, self.wire_act_share, self.wire_rehearse_share)

    def replace(self, **kw) -> "PretrainConfig":
        return dataclasses.replace(self, **kw)

    @property
    def memory_step(self) -> int | None:
        """The step at which memory rows are built (None: never)."""
        if self.memory_share <= 0 or self.memory_tasks == 0:
            return None
        return int(round(self.memory_from * self.steps))


def default() -> PretrainConfig:
    return PretrainConfig()


def tiny() -> PretrainConfig:
    """Seconds-long, for tests and CI."""
    return PretrainConfig(
        demonstrations=24,
        push_back_share=0.25,
        world_model_rows=16,
        tokenizer_tasks=24,
        vocab_size=512,
        **MICRO.fields(),
        steps=6,
        batch_rows=8,
        micro_batch_size=8,
        warmup=0,
        memory_from=0.5,
        memory_share=0.5,
        memory_tasks=4,
        memory_max_chars=300,
        eval_every=0,
        validation_tasks=8,
        checkpoint_every=2,
    )


def deep() -> PretrainConfig:
    """The shipped base continued: 2x deeper (4 layers), 3,000 more steps at a constant 3e-4 on its own corpus with
    4 of the 16 ACT rows of a batch tank rows (``comparison_probe.py --mode mixed --form tool --grow 2 --steps
    3000 --share 4 --lr 3e-4``: a gentler recipe than the probe's share 10 at lr 1e-3, which cost the start 0.10
    of validation success)."""
    return default().replace(
        init_from="assets/demo_base",
        grow_factor=2,
        num_layers=4,
        steps=3000,
        lr=3e-4,
        warmup=0,
        schedule="constant",
        tank_share=4,
        memory_share=0.0,
    )


def wire() -> PretrainConfig:
    """The shipped base continued 1,500 steps at a constant 3e-4 on its own corpus, with 4 of the 16 ACT rows and 4 of
    the 16 REHEARSE rows of a batch wire rows (``data.wire_corpus``): the start that test-time rehearsal on the
    "irreversible" task family needs (docs/results.md, "Tasks where rehearsing can prevent a mistake")."""
    return default().replace(
        init_from="assets/demo_base",
        steps=1500,
        lr=3e-4,
        warmup=0,
        schedule="constant",
        memory_share=0.0,
        wire_demonstrations=2048,
        wire_world_model_rows=4096,
        wire_act_share=4,
        wire_rehearse_share=4,
    )


def wire_memory() -> PretrainConfig:
    """The wire base continued 1,500 steps at a constant 3e-4 with 8 of the 16 ACT rows of a batch wire rows, now
    with ACT rows after a rehearsal memory (``demo.wire_memory``): 2,048 trap tasks after a memory of the
    rule-blind attempt and 512 plain ones after a memory of their own plan. The start of the test-time rehearsal
    measurement in docs/results.md ("A policy that can act on a memory")."""
    return wire().replace(
        init_from="assets/demo_base_wire",
        wire_act_share=8,
        wire_retry_tasks=2048,
        wire_memory_plain=512,
    )


PRESETS = {"default": default, "tiny": tiny, "deep": deep, "wire": wire, "wire_memory": wire_memory}


def split_shares(
    batch_rows: int, memory_share: float, tank_share: int = 0, wire_act: int = 0, wire_rehearse: int = 0
) -> tuple[dict[str, int], dict[str, int]]:
    """Rows per batch of each group before and after memory rows join (ACT half, REHEARSE half); tank, wire and
    memory rows take their places in the ACT half, which keeps at least one plain demonstration row, and wire
    REHEARSE rows theirs in the REHEARSE half, which keeps at least one of the base corpus."""
    act = batch_rows // 2 + batch_rows % 2
    reh = batch_rows // 2
    mem = int(round(act * memory_share))
    if memory_share > 0 and mem == 0:
        mem = 1
    if act - tank_share - wire_act - mem < 1:
        raise ValueError(
            f"pretrain: {tank_share} tank, {wire_act} wire and {mem} memory rows leave no demonstration row in the "
            f"{act} ACT rows of a {batch_rows}-row batch"
        )
    if reh - wire_rehearse < 1:
        raise ValueError(
            f"pretrain: {wire_rehearse} wire rows fill all {reh} REHEARSE rows of a {batch_rows}-row batch"
        )
    extra = {TANK_GROUP: tank_share} if tank_share else {}
    if wire_act:
        extra[WIRE_ACT_GROUP] = wire_act
    if wire_rehearse:
        extra[WIRE_REHEARSE_GROUP] = wire_rehearse
    rest = act - tank_share - wire_act
    return (
        {ACT: rest, **extra, REHEARSE: reh - wire_rehearse},
        {ACT: rest - mem, **extra, MEMORY_GROUP: mem, REHEARSE: reh - wire_rehearse},
    )
