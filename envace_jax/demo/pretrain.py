"""``make pretrain``: the demo's base model, trained once from scratch and shipped in ``assets/demo_base``.

EnvACE starts RL from a pretrained Qwen3 that can already read a tool schema, copy an argument out of a user
message and a value out of a tool response. A tiny model trained from scratch inside the demo's 25-minute
budget cannot (its typical failure is a wrongly copied entity: a day, an hour, an order id), so RL had nothing
to sharpen. This stage is the demo's stand-in for that pretrained base: a long supervised run, done once
(about two hours on 2 CPU cores) and reproducible by ``make pretrain``, on data that holds no validation or test
task (those splits are disjoint from ``train`` by a hash of the task content, ``data.demo_tasks.split_of``).

The corpus is the setting EnvACE is for:

* **demonstrations**, plentiful on the paths where the tools simply answer and scarce (``push_back_share``, rare
  but present) on the branches where the environment pushes back (a tool error, or a returned value that makes
  the user's condition fail; ``data.demo_tasks.PUSH_BACK``). Both roles' rows: ACT on the contexts the rollout
  engine builds, REHEARSE on the real simulator prompt with the logged response as target;
* **world-model rows**: real executions of varied calls (wrong ones included) on other train worlds, the cheap
  logs of tool behaviour that carry the push-back dynamics the demonstrations rarely show;
* **tank rows** (``tank_share``, the ``deep`` preset): tool-shaped comparison conversations in a water-tank world
  no task uses (``data.tank_tasks``): read a level from a tool response, compare it, act on it;
* **wire rows** (the ``wire`` preset): ACT and REHEARSE rows of ``plain`` tasks of the wire world (task family
  "irreversible") and REHEARSE rows of real single calls there, refusals included (``data.wire_corpus``): the
  world's rules for REHEARSE and its happy path for ACT, never a trap's way out, so that test-time rehearsal has
  something to foresee that the policy does not already do;
* **rows after a wire memory** (the ``wire_memory`` preset, continuing the wire base): ACT rows of trap tasks whose
  system prompt holds a memory of the rule-blind attempt run for real, and of plain tasks whose memory is their own
  plan (``demo.wire_memory``): a trap's way out is shown only after a memory that shows the rule being broken;
* **rehearsal-memory rows** (from ``memory_from`` of the steps on): ACT demonstrations whose system prompt carries
  a rehearsal memory built by the test-time code itself (``TestTimeRehearsal.rehearse`` with the model as it is
  at that step, imagined episodes with no logged result in REHEARSE's prompt), so that at test time a memory is
  a context the policy has seen, not a distraction. The target stays the demonstration.

The ``deep`` preset (``make pretrain-deep``) continues a base instead of starting from scratch: it loads the base
at ``init_from`` with its tokenizer, makes it ``grow_factor`` times deeper with ``models.grow.grow_depth`` (the
same function at step 0) and trains on the same corpus plus tank rows. Trained on tank rows, the 2-layer base
names the fuller of two tanks at chance and a 4-layer copy 94% of the time (docs/results.md, "Depth is what the
comparison lacks").

Batches are a pure function of the step (``IndexedBatches``), so a killed run resumes from its last Orbax
checkpoint exactly. The output directory holds ``model/`` (Hugging Face safetensors), ``tokenizer/``,
``manifest.json`` (the config, data counts, the validation curve, timings) and ``curve.png``. The config and its
presets are in ``demo.pretrain_config``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from envace_jax.data.demo_tasks import BRANCHES, generate_tasks
from envace_jax.demo import data as demo_data
from envace_jax.demo.memory_corpus import memory_rows, reference_memories, rehearsal_memories

# The config and presets live in their own module; outside code reaches them through ``pretrain`` too.
from envace_jax.demo.pretrain_config import (  # noqa: F401
    MEMORY_GROUP,
    PRESETS,
    SHARED_WITH_INIT,
    TANK_GROUP,
    WIRE_ACT_GROUP,
    WIRE_REHEARSE_GROUP,
    PretrainConfig,
    deep,
    default,
    split_shares,
    tiny,
    wire,
    wire_memory,
)
from envace_jax.eval.results import is_success
from envace_jax.rl.types import ACT, REHEARSE, Generation

# The corpus, validation and resume lines of a pretraining run; launch/pretrain.py shows them on stderr.
logger = logging.getLogger(__name__)

# Pretraining tasks come from their own seed stream of the train split (the demo's RL prompts come from
# another one, and the demo removes any task the pretraining corpus used).
PRETRAIN_SEED_OFFSET = 104729
TANK_SEED = 11  # the tank conversations trained on (comparison_probe scores held-out ones of seed 99)
# Rows are padded to a multiple of 64 up to this length: a rehearsal memory adds ~100-200 tokens to an
# ACT prompt (plain rows are at most ~250), and a left-truncated row would lose its system prompt.
MAX_LEN = 512


# ----------------------------------------------------------------------------- corpus


def demonstrations(cfg: PretrainConfig) -> list[dict[str, Any]]:
    return [
        demo_data.normalize_task(t)
        for t in generate_tasks(
            cfg.demonstrations, PRETRAIN_SEED_OFFSET + cfg.seed, "train", push_back_share=cfg.push_back_share
        )
    ]


def corpus_rows(cfg: PretrainConfig, demos: Sequence[Mapping[str, Any]], codec) -> list[Generation]:
    """ACT + REHEARSE rows of the demonstrations and ``world_model_rows`` rows of real executions."""
    return demo_data.sft_rows(demos, codec, cfg.world_model_rows, PRETRAIN_SEED_OFFSET + cfg.seed)


def corpus_uids(rows: Sequence[Generation], demos: Sequence[Mapping[str, Any]]) -> set[str]:
    """Every task the corpus shows (demonstrations and the worlds of world-model rows)."""
    return {r.uid for r in rows} | {t["uid"] for t in demos}


class IndexedBatches:
    """Role-balanced batches as a pure function of the step: ``batch(k)``.

    ``groups`` maps a group name to its rows and ``shares`` to its rows per batch. Group ``g`` reads the
    endless sequence of its rows in fresh permutations (one per pass, seeded by (seed, g, pass)); batch k
    takes positions ``[k * n_g, (k + 1) * n_g)`` of it. So resuming at step k needs nothing but k, and
    the many cheap world-model rows never crowd scarce demonstrations out of a batch.
    """

    def __init__(self, groups: Mapping[str, Sequence[Generation]], shares: Mapping[str, int], seed: int):
        if set(shares) - set(groups):
            raise ValueError(f"IndexedBatches: shares for unknown groups {sorted(set(shares) - set(groups))}")
        empty = [g for g, n in shares.items() if n > 0 and not groups[g]]
        if empty:
            raise ValueError(f"IndexedBatches: groups {empty} have a share but no rows")
        self.groups = {g: list(groups[g]) for g in shares if shares[g] > 0}
        self.shares = {g: int(n) for g, n in shares.items() if n > 0}
        self.seed = seed
        self._perm: dict[tuple[str, int], np.ndarray] = {}

    def _key(self, group: str) -> int:
        return int(hashlib.sha256(group.encode()).hexdigest()[:8], 16)

    def _perm_of(self, group: str, epoch: int) -> np.ndarray:
        k = (group, epoch)
        if k not in self._perm:
            if len(self._perm) > 64:
                self._perm.clear()
            rng = np.random.default_rng([self.seed, self._key(group), epoch])
            self._perm[k] = rng.permutation(len(self.groups[group]))
        return self._perm[k]

    def batch(self, step: int) -> list[Generation]:
        out = []
        for g in sorted(self.shares):
            rows, n = self.groups[g], self.shares[g]
            for p in range(step * n, (step + 1) * n):
                out.append(rows[int(self._perm_of(g, p // len(rows))[p % len(rows)])])
        return out


# ----------------------------------------------------------------------------- the shipped base


@dataclasses.dataclass
class Base:
    """A pretrained base directory (``model/``, ``tokenizer/``, ``manifest.json``) and its corpus."""

    directory: str
    config: PretrainConfig
    manifest: dict[str, Any]
    tokenizer: Any

    def model(self):
        from envace_jax.models import hf_io

        return hf_io.load_hf(os.path.join(self.directory, "model"), dtype="float32")

    def demonstrations(self) -> list[dict[str, Any]]:
        return demonstrations(self.config)

    def corpus_rows(self, demos, codec) -> list[Generation]:
        """Every row the base trained on: the corpus, then its wire rows (if any)."""
        act, reh = wire_rows(self.config, codec, episode0=len(demos) + self.config.world_model_rows)
        return corpus_rows(self.config, demos, codec) + act + reh

    @staticmethod
    def corpus_uids(rows, demos) -> set[str]:
        return corpus_uids(rows, demos)

    def copy_tokenizer(self, out_dir: str) -> None:
        if not os.path.exists(os.path.join(out_dir, "tokenizer.json")):
            shutil.copytree(os.path.join(self.directory, "tokenizer"), out_dir, dirs_exist_ok=True)


def load_base(directory: str) -> Base:
    """Reads a base written by ``run_pretrain``; a missing or incomplete one is an error that says how to
    make it."""
    from envace_jax.chat import load_tokenizer

    need = [os.path.join(directory, p) for p in ("manifest.json", "model/config.json", "tokenizer/tokenizer.json")]
    missing = [p for p in need if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(
            f"demo base {directory!r} is missing {missing}: run `make pretrain` (about two hours "
            "on 2 CPU cores; it resumes if interrupted), or use `--preset=legacy` to train "
            "from scratch"
        )
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    fields = {f.name for f in dataclasses.fields(PretrainConfig)}
    cfg = PretrainConfig(**{k: v for k, v in manifest["config"].items() if k in fields})
    return Base(directory, cfg, manifest, load_tokenizer(os.path.join(directory, "tokenizer")))


# ----------------------------------------------------------------------------- the run


def init_model(cfg: PretrainConfig, out_dir: str, demos: Sequence[Mapping[str, Any]]):
    """``(tokenizer, model, base)`` a run starts from: from scratch (a tokenizer trained on the demonstrations, a
    random model; ``base`` None), or with ``init_from`` the base's tokenizer and its model grown ``grow_factor``
    times deeper. A base whose corpus or shapes differ from ``cfg`` is an error naming the fields."""
    from envace_jax.models.grow import grow_depth

    tok_dir = os.path.join(out_dir, "tokenizer")
    if not cfg.init_from:
        tok_tasks = demos[: cfg.tokenizer_tasks]
        tok = demo_data.build_tokenizer(
            tok_tasks,
            tok_dir,
            cfg.vocab_size,
            extra_texts=reference_memories(tok_tasks, cfg.memory_max_chars) if cfg.memory_step is not None else (),
        )
        # The demo's own model recipe; imported here, as pretrain imports the RL stages only where it uses them.
        from envace_jax.demo.stages import build_model

        return tok, build_model(cfg, len(tok)), None
    base = load_base(cfg.init_from)
    differ = [
        f"{k} (base {getattr(base.config, k)!r}, here {getattr(cfg, k)!r})"
        for k in SHARED_WITH_INIT
        if getattr(base.config, k) != getattr(cfg, k)
    ]
    if base.config.num_layers * cfg.grow_factor != cfg.num_layers:
        differ.append(f"num_layers (base {base.config.num_layers} x grow_factor {cfg.grow_factor} != {cfg.num_layers})")
    if differ:
        raise ValueError(
            f"pretrain init_from={cfg.init_from!r}: the base differs from this config in " + ", ".join(differ)
        )
    base.copy_tokenizer(tok_dir)  # the run's directory holds its tokenizer; the one in memory is the base's
    return base.tokenizer, grow_depth(base.model(), cfg.grow_factor), base


def tank_rows(cfg: PretrainConfig, codec) -> list[Generation]:
    """ACT rows of ``cfg.tank_tasks`` tank conversations (none when ``tank_share`` is 0)."""
    from envace_jax.data.tank_tasks import tank_tasks

    if not cfg.tank_share:
        return []
    return [r for e, t in enumerate(tank_tasks(cfg.tank_tasks, TANK_SEED)) for r in demo_data.act_rows(t, codec, e)]


def wire_rows(cfg: PretrainConfig, codec, episode0: int = 0) -> tuple[list[Generation], list[Generation]]:
    """(ACT rows, REHEARSE rows) of the wire corpus (``data.wire_corpus``): both roles' rows of
    ``wire_demonstrations`` plain wire tasks, and ``wire_world_model_rows`` real single calls on their worlds;
    then the ACT rows after a rehearsal memory (``wire_retry_tasks``, ``wire_memory_plain``; ``demo.wire_memory``).
    Both empty when ``wire_demonstrations`` is 0."""
    from envace_jax.data import wire_corpus

    if not cfg.wire_demonstrations:
        return [], []
    seed = PRETRAIN_SEED_OFFSET + cfg.seed
    demos = [demo_data.normalize_task(t) for t in wire_corpus.plain_demonstrations(cfg.wire_demonstrations, seed)]
    act, reh = [], []
    for e, t in enumerate(demos):
        act += demo_data.act_rows(t, codec, episode0 + e)
        reh += demo_data.rehearse_rows(t, codec, episode0 + e)
    examples = wire_corpus.world_model_examples(cfg.wire_world_model_rows, seed, demos)
    reh += demo_data.rows_of_world_model_examples(examples, codec, episode0 + len(demos))
    if cfg.wire_retry_tasks or cfg.wire_memory_plain:
        from envace_jax.demo import wire_memory

        traps = [demo_data.normalize_task(t) for t in wire_corpus.retry_tasks(cfg.wire_retry_tasks, seed)]
        first = episode0 + len(demos) + len(examples)
        act += wire_memory.rows(traps, demos[: cfg.wire_memory_plain], codec, cfg.memory_max_chars, first)
    return act, reh


def _demo_cfg(cfg: PretrainConfig):
    """The demo settings whose rollout and sampler shapes the pretraining evaluations use."""
    from envace_jax.demo.config import DemoConfig

    return DemoConfig(
        seed=cfg.seed,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        micro_batch_size=cfg.micro_batch_size,
    )


def validate(model, codec, tasks, demo_cfg) -> dict[str, Any]:
    """Greedy real-tool success on validation tasks, overall and per branch kind."""
    from envace_jax.demo import stages

    res = stages.evaluate_real(demo_cfg, model, codec, tasks)
    out = {
        "success": float(np.mean(res.successes)) if res.n else float("nan"),
        "score": float(np.mean(res.scores)) if res.n else float("nan"),
    }
    for b in BRANCHES:
        s = res.by_branch.get(b, [])
        out[f"success_{b}"] = float(np.mean([is_success(x) for x in s])) if s else float("nan")
    return out


class _Batches:
    """Step ``k``'s rows: the plain groups before ``cfg.memory_step``, from it on with rehearsal-memory rows, built
    once at that step from the model as it is then and kept in ``memories.json`` for a resumed run."""

    def __init__(
        self,
        cfg: PretrainConfig,
        groups: dict[str, list[Generation]],
        model,
        codec,
        demos: Sequence[Mapping[str, Any]],
        demo_cfg,
        out_dir: str,
        log: Callable[[str], None],
    ):
        self.cfg, self.groups, self.model, self.codec, self.demo_cfg = cfg, groups, model, codec, demo_cfg
        self.log = log
        self.tasks = demos[: cfg.memory_tasks]
        self.path = os.path.join(out_dir, "memories.json")
        self.before, self.after = split_shares(
            cfg.batch_rows, cfg.memory_share, cfg.tank_share, cfg.wire_act_share, cfg.wire_rehearse_share
        )
        self._batches: IndexedBatches | None = None
        self._phase: bool | None = None

    def reload(self) -> None:
        """A resumed run: the memory rows of the memories its earlier part built (if it got that far)."""
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            memories = json.load(f)
        if memories:
            self.groups[MEMORY_GROUP] = memory_rows(self.tasks, memories, self.codec)

    def __call__(self, k: int) -> list[Generation]:
        in_memory_phase = self.cfg.memory_step is not None and k >= self.cfg.memory_step
        if in_memory_phase and not self.groups[MEMORY_GROUP]:
            t0 = time.perf_counter()
            memories = rehearsal_memories(self.model, self.codec, self.tasks, self.cfg, self.demo_cfg)
            with open(self.path, "w") as f:
                json.dump(memories, f)
            self.groups[MEMORY_GROUP] = memory_rows(self.tasks, memories, self.codec)
            self.log(
                f"pretrain: {len(self.groups[MEMORY_GROUP])} rehearsal-memory ACT rows from {len(memories)} "
                f"tasks at step {k} ({time.perf_counter() - t0:.0f} s)"
            )
        if self._phase != in_memory_phase:
            use = self.after if in_memory_phase and self.groups[MEMORY_GROUP] else self.before
            self._batches, self._phase = IndexedBatches(self.groups, use, self.cfg.seed), in_memory_phase
        return self._batches.batch(k)


class _Curve:
    """The validation curve: its points, each also a line of ``curve.jsonl`` written as it is measured."""

    def __init__(self, path: str):
        self.path = path
        self.points: list[dict[str, Any]] = []

    def reload(self, step: int) -> None:
        """A resumed run: the points up to ``step``; those past the checkpoint are measured again."""
        if os.path.exists(self.path):
            with open(self.path) as f:
                points = [json.loads(line) for line in f if line.strip()]
            self.points = [p for p in points if p["step"] <= step]
            with open(self.path, "w") as f:
                f.writelines(json.dumps(p) + "\n" for p in self.points)

    def add(self, point: dict[str, Any]) -> None:
        self.points.append(point)
        with open(self.path, "a") as f:
            f.write(json.dumps(point) + "\n")


def run_pretrain(
    cfg: PretrainConfig,
    out_dir: str,
    *,
    progress: bool = True,
    log: Callable[[str], None] = logger.info,
) -> dict[str, Any]:
    """Trains the base and writes ``out_dir``; rerunning resumes from ``out_dir/checkpoints``. A SIGTERM saves the
    step it finished and exits 0 (``SystemExit``)."""
    import jax

    from envace_jax.checkpoint import Checkpointer
    from envace_jax.demo import stages
    from envace_jax.models import hf_io
    from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
    from envace_jax.rl.training_loop import Hook, Progress, run_loop

    os.makedirs(out_dir, exist_ok=True)
    t_start = time.perf_counter()
    demo_cfg = _demo_cfg(cfg)
    demos = demonstrations(cfg)
    tok, model, base = init_model(cfg, out_dir, demos)
    codec = demo_data.make_codec(tok, cfg.rehearse_tool_descriptions)
    rows = corpus_rows(cfg, demos, codec)
    wire_act, wire_reh = wire_rows(cfg, codec, episode0=len(demos) + cfg.world_model_rows)
    groups: dict[str, list[Generation]] = {
        ACT: [r for r in rows if r.role == ACT],
        REHEARSE: [r for r in rows if r.role == REHEARSE],
        MEMORY_GROUP: [],
        TANK_GROUP: tank_rows(cfg, codec),
        WIRE_ACT_GROUP: wire_act,
        WIRE_REHEARSE_GROUP: wire_reh,
    }
    val = [
        demo_data.normalize_task(t)
        for t in generate_tasks(
            cfg.validation_tasks, cfg.seed, "validation", push_back_share=cfg.validation_push_back_share
        )
    ]
    log(
        f"pretrain corpus: {len(demos)} demonstrations ({sum(t['branch'] != BRANCHES[0] for t in demos)} push-back), "
        f"{len(groups[ACT])} ACT rows, {len(groups[REHEARSE])} REHEARSE rows ({cfg.world_model_rows} world-model), "
        f"{len(groups[TANK_GROUP])} tank rows, {len(wire_act)} + {len(wire_reh)} wire ACT + REHEARSE rows; "
        f"{time.perf_counter() - t_start:.0f} s"
        + (f"; continuing {cfg.init_from}" if base else "")
        + (f" grown to {model.config.num_layers} layers" if base and cfg.grow_factor > 1 else "")
    )

    optim = OptimConfig(
        lr=cfg.lr,
        schedule=cfg.schedule,
        warmup_steps=cfg.warmup,
        total_steps=cfg.steps,
        weight_decay=0.0,
        grad_clip=1.0,
    )
    # share_prefixes off: the recorded pretraining runs computed every row's tokens (same numbers up to float order)
    trainer = Trainer(
        model, optim, LossConfig(), micro_batch_size=cfg.micro_batch_size, pad_micro_batches=True, share_prefixes=False
    )
    ckpt_dir = os.path.abspath(os.path.join(out_dir, "checkpoints"))
    batches = _Batches(cfg, groups, model, codec, demos, demo_cfg, out_dir, log)
    curve = _Curve(os.path.join(out_dir, "curve.jsonl"))

    def load(restored) -> None:
        trainer.load_state_dict(restored.state)
        batches.reload()
        curve.reload(trainer.step)

    def validation(k: int, _) -> None:
        point = {"step": k, **validate(model, codec, val, demo_cfg)}
        curve.add(point)
        log(f"pretrain validation at step {k}: {json.dumps(point)}")

    def nll(m: Mapping[str, float], role: str) -> str:
        return f"{m.get(f'nll/{role}', 0):.3f}"

    done = run_loop(
        total_steps=cfg.steps,
        checkpointer=Checkpointer(ckpt_dir, max_to_keep=2, save_interval_steps=cfg.checkpoint_every),
        step_fn=lambda k: trainer.update(stages.sft_batch(batches(k), MAX_LEN), kind="sft"),
        state=trainer.state_dict,
        load=load,
        hooks=[Hook(validation, every=cfg.eval_every, at_last=False)],
        progress=Progress(
            "pretrain" if progress else None,
            postfix=lambda m: {"nll_act": nll(m, "act"), "nll_reh": nll(m, "rehearse")},
            line=lambda k, m: (
                f"pretrain step {k}/{cfg.steps}: nll act {nll(m, 'act')} rehearse "
                f"{nll(m, 'rehearse')}, {time.perf_counter() - t_start:.0f} s"
            ),
        ),
        log=log,
        resumed_line="pretrain: resumed at step {step}",
        preempted_line="pretrain: preempted at step {step}; rerun to resume",
    )
    if done.preempted:
        raise SystemExit(0)
    final = {"step": cfg.steps, **validate(model, codec, val, demo_cfg)}
    if not curve.points or curve.points[-1]["step"] != cfg.steps:
        curve.points.append(final)
    hf_io.save_hf(
        model, os.path.join(out_dir, "model"), eos_token_ids=codec.stop_token_ids, pad_token_id=tok.pad_token_id
    )
    manifest = {
        "config": dataclasses.asdict(cfg),
        "params": int(model.config.num_params()),
        "vocab": len(tok),
        "corpus": {
            "demonstrations": len(demos),
            "push_back_demonstrations": sum(t["branch"] != BRANCHES[0] for t in demos),
            "act_rows": len(groups[ACT]),
            "rehearse_rows": len(groups[REHEARSE]),
            "memory_rows": len(groups[MEMORY_GROUP]),
            "tank_rows": len(groups[TANK_GROUP]),
            "wire_act_rows": len(wire_act),
            "wire_rehearse_rows": len(wire_reh),
        },
        "validation": {"tasks": len(val), "push_back_share": cfg.validation_push_back_share, **final},
        "curve": curve.points,
        "wall_s_this_run": round(time.perf_counter() - t_start, 1),
        "jax": jax.__version__,
    }
    if base is not None:  # where it started: the base's own validation (the grown copy computes the same)
        manifest["init"] = {
            "from": cfg.init_from,
            "grow_factor": cfg.grow_factor,
            "num_layers": base.config.num_layers,
            "validation": base.manifest.get("validation"),
        }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    plot_curve(curve.points, os.path.join(out_dir, "curve.png"))
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # the shipped base is model/ + tokenizer/ + manifest
    return manifest


def plot_curve(curve: Sequence[Mapping[str, Any]], out_png: str) -> None:
    if not curve:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [p["step"] for p in curve]
    for key, label in (("success", "all"), ("success_happy", "happy path"), ("success_push_back", "push-back")):
        ax.plot(steps, [p.get(key, float("nan")) for p in curve], marker="o", label=label)
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("greedy real-tool success (validation)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
