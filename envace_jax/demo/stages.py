"""Demo stages on one live model: SFT warm start, RL iterations, real-tool evaluation, REHEARSE fidelity.

Every stage works on the same ``qwen3.Qwen3`` module; the trainer updates it in place and the sampler
reads its current parameters, so nothing is copied between training and sampling. ``snapshot`` and
``restore`` move parameters to and from host memory to branch runs (RL vs. more SFT from one start).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from envace_jax.demo.config import DemoConfig
from envace_jax.data.demo_tasks import PUSH_BACK
from envace_jax.demo.data import make_real_env, silent_push_back
from envace_jax.eval.results import is_success
from envace_jax.models import qwen3
from envace_jax.rl.batch import TrainBatch, build_batch
from envace_jax.rl.judges import RuleJudge
from envace_jax.rl.policy_client import SamplerClient
from envace_jax.rl.reward import ChecklistTurnJudge
from envace_jax.rl.rolling_client import RollingSamplerClient
from envace_jax.rl.rollout import RoleSampling, RolloutConfig, RolloutEngine
from envace_jax.rl.trainer import LossConfig, OptimConfig, Trainer
from envace_jax.rl.types import Generation
from envace_jax.sampling import Sampler

# Demo rows are ~100-250 tokens with the demo tokenizer: batches are padded to a multiple of 64 and
# capped at TRAIN_LEN (longer prompts are left-truncated), which gives a few update programs; the
# sampler rounds batch, chunk and window sizes to a few fixed buckets. On a 2-core CPU each compiled
# program costs seconds, more than the padding it saves.
TRAIN_LEN = 384  # DemoConfig.train_len's default
LENGTH_MULTIPLE = 64
# Batch sizes 8 and 16 too: the rolling batch's later calls hold few rows (episodes end at different steps)
SAMPLER_BUCKETS = dict(
    batch_buckets=(8, 16, 32, 128, 512), length_buckets=(32, 128, 256), window_buckets=(256, 512, 1024)
)


class Clock:
    """Wall and process-CPU seconds of a block (CPU time counts every thread of the process)."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": round(self.wall, 2), "cpu_s": round(self.cpu, 2)}


def build_model(cfg: DemoConfig, vocab: int) -> qwen3.Qwen3:
    """The demo's random tied-embedding Qwen3 of ``vocab`` tokens, sized and seeded by ``cfg``: a
    ``DemoConfig``, or any config with the same size fields and ``seed`` (``pretrain.PretrainConfig``)."""
    mc = qwen3.Qwen3Config.tiny(
        vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        tie_word_embeddings=True,
    )
    return qwen3.init_model(mc, seed=cfg.seed)


def snapshot(model: nnx.Module) -> Any:
    return jax.tree.map(lambda x: np.array(x), nnx.state(model, nnx.Param))


def restore(model: nnx.Module, snap: Any) -> None:
    nnx.update(model, jax.tree.map(jnp.asarray, snap))


def host_copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: np.array(x) if isinstance(x, (jax.Array, np.ndarray)) else x, tree)


def rl_recipe(cfg: DemoConfig):
    """The ``loss`` and ``rl`` overrides of the demo's ``rl_algorithm`` (``rl.recipes``) for its role budgets."""
    from envace_jax.rl.recipes import recipe

    return recipe(cfg.rl_algorithm, cfg.act_max_new_tokens, cfg.rehearse_max_new_tokens)


def make_trainer(model, cfg: DemoConfig, lr: float, warmup: int, *, rl: bool = False) -> Trainer:
    """A Trainer whose short last micro-batch is padded (zero-weight rows), so a varying number of RL rows
    never compiles a new program. ``rl``: its loss is ``cfg.rl_algorithm``'s (SFT batches ignore the loss's
    knobs, so the RL trainer's replay batches are the same under every algorithm)."""
    optim = OptimConfig(lr=lr, schedule="constant", warmup_steps=warmup, weight_decay=0.0, grad_clip=1.0)
    loss = LossConfig(**rl_recipe(cfg).loss) if rl else LossConfig()
    # share_prefixes off, as the demo's recorded runs were made (a shared prefix changes float32 summation order)
    return Trainer(
        model, optim, loss, micro_batch_size=cfg.micro_batch_size, pad_micro_batches=True, share_prefixes=False
    )


# ----------------------------------------------------------------------------- SFT


def _epochs(items: Sequence[Generation], rng: np.random.Generator):
    """Endless stream of ``items``, each pass a fresh permutation."""
    while True:
        for i in rng.permutation(len(items)):
            yield items[int(i)]


def sft_batches(rows: Sequence[Generation], batch_rows: int, seed: int):
    """Endless batches of ``batch_rows`` rows, half of each role (ACT, REHEARSE) when both exist.

    Each role cycles through its own rows in fresh permutations, so the many cheap world-model rows
    never crowd the scarce ACT demonstrations out of a batch.
    """
    rng = np.random.default_rng([seed, 7])
    by_role: dict[str, list[Generation]] = {}
    for r in rows:
        by_role.setdefault(r.role, []).append(r)
    roles = sorted(by_role)
    if not roles:
        raise ValueError("sft_batches: no rows")
    streams = {role: _epochs(by_role[role], rng) for role in roles}
    shares = [batch_rows // len(roles) + (k < batch_rows % len(roles)) for k in range(len(roles))]
    while True:
        yield [next(streams[role]) for role, n in zip(roles, shares) for _ in range(n)]


def sft_batch(rows: Sequence[Generation], max_len: int) -> TrainBatch:
    n = len(rows)
    return build_batch(
        rows, np.zeros(n, np.float32), np.zeros(n, np.int32), max_len=max_len, pad_id=0, length_multiple=LENGTH_MULTIPLE
    )


def run_sft(
    trainer: Trainer,
    batches,
    max_len: int,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    on_step: Callable[[int, dict], None] | None = None,
) -> list[dict[str, float]]:
    """SFT for ``steps`` optimizer steps, or until ``seconds`` of wall time have passed."""
    if (steps is None) == (seconds is None):
        raise ValueError("run_sft needs exactly one of steps= or seconds=")
    out, t0, k = [], time.perf_counter(), 0
    while (steps is not None and k < steps) or (seconds is not None and time.perf_counter() - t0 < seconds):
        m = trainer.update(sft_batch(next(batches), max_len), kind="sft")
        out.append(m)
        k += 1
        if on_step:
            on_step(k, m)
    return out


# ----------------------------------------------------------------------------- rollouts


def rollout_config(cfg: DemoConfig, mode: str, greedy: bool) -> RolloutConfig:
    t = 0.0 if greedy else cfg.temperature
    return RolloutConfig(
        mode=mode,
        max_steps=cfg.max_steps,
        max_assistant_turns=6,
        max_user_turns=2,
        max_model_len=cfg.max_model_len,
        act=RoleSampling(temperature=t, max_new_tokens=cfg.act_max_new_tokens),
        rehearse=RoleSampling(temperature=t, max_new_tokens=cfg.rehearse_max_new_tokens),
        sequential_simulation=False,
        rolling=cfg.rolling,
        seed=cfg.seed,
    )


def make_client(model, codec, cfg: DemoConfig | None = None, slots: int | None = None, programs_of=None):
    """The sampler client of the demo's rollouts: a rolling batch of ``slots`` rows (default
    ``cfg.rolling_slots``) when ``cfg.rolling``, else one lockstep call per micro-step. ``programs_of``: a
    ``Sampler`` whose compiled programs this one runs (``Sampler(programs_of=)``)."""
    if cfg is not None and cfg.rollout_engine == "vllm":
        return vllm_client(model, codec, cfg)
    if cfg is not None and cfg.rolling:
        # The rolling state lives across calls, so its capacity is fixed: the caller's context limit
        # plus a generation (REHEARSE prompts stay below it); windows are still sized per call.
        sampler = Sampler(
            model,
            cache_size=cfg.max_model_len + max(cfg.act_max_new_tokens, cfg.rehearse_max_new_tokens),
            programs_of=programs_of,
            share_prompts=False,  # as the demo's recorded runs were made
            **SAMPLER_BUCKETS,
        )
        return RollingSamplerClient(
            sampler, codec.stop_token_ids, slots=slots or cfg.rolling_slots, eager_refill=cfg.rolling_eager_refill
        )
    sampler = Sampler(model, programs_of=programs_of, share_prompts=False, **SAMPLER_BUCKETS)
    return SamplerClient(sampler, stop_token_ids=codec.stop_token_ids)


_VLLM_CLIENTS: dict[int, Any] = {}


def vllm_client(model, codec, cfg: DemoConfig):
    """The vLLM client of ``model`` (``rollout_engine="vllm"``): one engine per model object for the whole demo,
    stopped when the model is collected. A client made again for the same model is the same one, marked stale, so
    its next call sends the model's weights as they are now (after RL steps, replay batches, a restore)."""
    import weakref

    from envace_jax.config import RolloutConfig, VllmSettings
    from envace_jax.rl.vllm_client import build_vllm_client

    client = _VLLM_CLIENTS.get(id(model))
    context = cfg.max_model_len + max(cfg.act_max_new_tokens, cfg.rehearse_max_new_tokens)
    if client is not None and client.model is model and client.engine.alive:
        if client.engine.max_model_len >= min(context, model.config.max_position_embeddings):
            client.reset()
            return client
        client.close()  # a longer context than this engine was made for
    rollout = RolloutConfig(
        max_model_len=cfg.max_model_len,
        act=RoleSampling(max_new_tokens=cfg.act_max_new_tokens),
        rehearse=RoleSampling(max_new_tokens=cfg.rehearse_max_new_tokens),
        seed=cfg.seed,
        engine="vllm",
        vllm=VllmSettings(enforce_eager=cfg.vllm_enforce_eager, kv_cache_gib=1),  # the demo's rows: a few MiB
    )
    client = build_vllm_client(model, codec.stop_token_ids, rollout)
    _VLLM_CLIENTS[id(model)] = client
    weakref.finalize(model, client.close)
    return client


def make_engine(cfg: DemoConfig, mode: str, codec, client, *, greedy: bool, simulator=None) -> RolloutEngine:
    return RolloutEngine(
        rollout_config(cfg, mode, greedy),
        codec,
        client,
        ChecklistTurnJudge(RuleJudge()),
        simulator=simulator,
        make_env=make_real_env if mode == "real" else None,
    )


@dataclasses.dataclass
class EvalResult:
    scores: list[float]
    successes: list[bool]
    by_world: dict[str, list[float]]
    by_branch: dict[str, list[float]]  # branch kind (data.demo_tasks.BRANCHES) -> scores
    by_type: dict[str, list[float]]  # task type ("bank/overdraw") -> scores
    terminations: dict[str, int]
    tool_calls_mean: float
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # a few transcripts, for diagnosis
    # push-back tasks by whether a tool error announces the push-back ("announced") or only the values
    # read back do ("silent": a condition fails; demo.data.silent_push_back) -> scores
    by_push_back_kind: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    uids: list[str] = dataclasses.field(default_factory=list)  # the task of each score, in order

    @property
    def n(self) -> int:
        return len(self.scores)


def evaluate_real(
    cfg: DemoConfig,
    model,
    codec,
    tasks: Sequence[Mapping[str, Any]],
    progress: Callable[[int], None] | None = None,
    *,
    greedy: bool = True,
) -> EvalResult:
    """Episodes of ``tasks`` against the REAL tools (nothing rehearsed), greedy unless ``greedy=False``
    (then at the training temperature with ``cfg.seed``); success = every checklist item of every turn passed."""
    client = make_client(model, codec, cfg, slots=cfg.eval_batch)
    engine = make_engine(cfg, "real", codec, client, greedy=greedy)
    scores, calls, terms, by_world, samples, uids = [], [], {}, {}, [], []
    by_branch: dict[str, list[float]] = {}
    by_type: dict[str, list[float]] = {}
    by_kind: dict[str, list[float]] = {}
    # Lockstep plays eval_batch episodes at a time; the rolling batch plays them all through eval_batch
    # slots, a finished episode's slot going to the next task at once.
    group = len(tasks) if engine.rolling else cfg.eval_batch
    for s in range(0, len(tasks), group):
        chunk = list(tasks[s : s + group])
        eps = engine.run(chunk, [t["uid"] for t in chunk])
        client.reset()
        for t, e in zip(chunk, eps):
            uids.append(t["uid"])
            scores.append(float(e.score))
            calls.append(e.tool_calls())
            terms[e.termination] = terms.get(e.termination, 0) + 1
            by_world.setdefault(t["env"]["name"], []).append(float(e.score))
            by_branch.setdefault(t.get("branch", "unlabelled"), []).append(float(e.score))
            by_type.setdefault(t.get("task_type", "unlabelled"), []).append(float(e.score))
            if t.get("branch") == PUSH_BACK:
                by_kind.setdefault("silent" if silent_push_back(t) else "announced", []).append(float(e.score))
            if len(samples) < 8:
                samples.append(
                    {
                        "uid": t["uid"],
                        "score": float(e.score),
                        "termination": e.termination,
                        "messages": e.messages[len(t["messages"]) - 1 :],
                    }
                )
        if progress:
            progress(len(chunk))
    return EvalResult(
        scores,
        [is_success(s) for s in scores],
        by_world,
        by_branch,
        by_type,
        terms,
        float(np.mean(calls)) if calls else 0.0,
        samples,
        by_kind,
        uids,
    )


def evaluate_fidelity(cfg: DemoConfig, model, codec, tasks: Sequence[Mapping[str, Any]]):
    """Teacher-forced REHEARSE on the held-out tasks' logged calls (greedy)."""
    from envace_jax.eval import fidelity

    cases = fidelity.demo_cases(list(tasks))
    client = make_client(model, codec, cfg, slots=cfg.eval_batch)
    rehearser = fidelity.PolicyRehearser(
        codec,
        client,
        RoleSampling(temperature=0.0, max_new_tokens=cfg.rehearse_max_new_tokens),
        batch_size=cfg.eval_batch,
    )
    return fidelity.evaluate_fidelity(cases, rehearser)


# ----------------------------------------------------------------------------- RL


def make_rl_step(
    cfg: DemoConfig, mode: str, model, codec, trainer: Trainer | Mapping[str, Trainer], simulator_model=None
):
    """The demo's RL step in ``mode``: ``trainer`` is one Trainer (a shared policy), or one per trained role
    (``noshare``: ACT's on ``model``, REHEARSE's on ``simulator_model``)."""
    from envace_jax.config import RLSection
    from envace_jax.rl.step import build_rl_step

    client = make_client(model, codec, cfg)
    sim_client = make_client(simulator_model, codec, cfg) if simulator_model is not None else None
    # The reference's step (row-mean baseline, 0.1 empty-output penalty, recomputed old log-probs, one
    # optimizer step) on the demo's short rows, with the update's exact shortcuts unless turned off.
    rl = RLSection(
        n_rollouts=cfg.n_rollouts,
        micro_batch_size=cfg.micro_batch_size,
        max_row_length=cfg.train_len,
        length_multiple=LENGTH_MULTIPLE,
        old_logprobs_from_update=cfg.rl_update_shortcuts,
        skip_zero_advantage_rows=cfg.rl_update_shortcuts,
        max_staleness=cfg.rl_max_staleness,
        behaviour_is=cfg.rl_behaviour_is,
        behaviour_is_cap=cfg.rl_behaviour_is_cap,
        **rl_recipe(cfg).rl,
    )
    if cfg.rollout_engine == "vllm":  # the engine's log-probs are the behaviour policy's (rl/vllm_client.py)
        from envace_jax.rl.vllm_client import with_engine_correction

        rl = with_engine_correction(rl)
    step = build_rl_step(
        rl,
        rollout_config(cfg, mode, greedy=False),
        codec,
        client,
        ChecklistTurnJudge(RuleJudge()),
        trainer,
        simulator=sim_client,
        make_env=make_real_env if mode == "real" else None,
        pad_id=0,
        seed=cfg.seed,
    )
    return step, client
