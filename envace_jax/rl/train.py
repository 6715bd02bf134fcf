"""An RL training run: builds it from an ``ExperimentConfig`` and runs it to ``total_steps``.

Used by ``launch/train.py`` (and ``launch/export_hf.py``). Everything here is host-side wiring: mesh,
tokenizer, model(s), data iterator, judge, sampler client, rollout engine, trainer(s), checkpointer,
metrics. One iteration of the loop is ``envace_jax.rl.step.RLStep``; the loop around it (resume, checkpoint
cadence, preemption, progress) is ``envace_jax.rl.training_loop.run_loop``, shared with the demo's pretraining.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from typing import Any

import jax
import numpy as np

from envace_jax import config as config_lib
from envace_jax import sharding as shd
from envace_jax.checkpoint import Checkpointer, RestoreResult
from envace_jax.metrics import MetricsWriter
from envace_jax.models import qwen3
from envace_jax.rl import judge_outage, rollout_weights
from envace_jax.rl.async_pipeline import AsyncPipeline
from envace_jax.rl.plots import plot_run
from envace_jax.rl.rollout import TRAINED_ROLES
from envace_jax.rl.run_model import build_model, model_config  # noqa: F401  (re-exported)
from envace_jax.rl.rollout_weights import rollout_config, rollout_copy, rollout_mesh  # noqa: F401  (re-exported)
from envace_jax.rl.step import RLStep, StepResult, build_rl_step
from envace_jax.rl.trainer import Trainer
from envace_jax.rl.training_loop import Hook, Progress, run_loop
from envace_jax.rl.types import REHEARSE


# ----------------------------------------------------------------------------- distributed


def init_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """``jax.distributed.initialize`` from flags, else from the environment (JAX_COORDINATOR_ADDRESS,
    JAX_NUM_PROCESSES, JAX_PROCESS_ID); on TPU pods and SLURM jax finds everything by itself."""
    coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    if coordinator is None and num_processes is None:
        if os.environ.get("ENVACE_AUTO_DISTRIBUTED") == "1":  # TPU VM pods: every worker runs this
            jax.distributed.initialize()
        return
    if coordinator is None or num_processes is None or process_id is None:
        raise ValueError(
            "multi-process launch needs --coordinator, --num_processes and --process_id "
            f"(got {coordinator!r}, {num_processes!r}, {process_id!r})"
        )
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


# ----------------------------------------------------------------------------- tokenizer


def build_tokenizer(cfg: config_lib.ExperimentConfig):
    """The configured tokenizer; without a path, the offline demo tokenizer (built once per run dir)."""
    from envace_jax.chat import build_demo_tokenizer, load_tokenizer
    from envace_jax.data.demo_tasks import demo_corpus

    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path)
    out = os.path.join(cfg.run_dir, "tokenizer")
    if os.path.exists(os.path.join(out, "tokenizer.json")):
        return load_tokenizer(out)
    if jax.process_index() == 0:
        tmp = f"{out}.tmp{os.getpid()}"
        build_demo_tokenizer(demo_corpus(48), tmp, vocab_size=cfg.tokenizer.demo_vocab_size)
        os.replace(tmp, out)
    else:
        deadline = time.time() + 600
        while not os.path.exists(os.path.join(out, "tokenizer.json")):
            if time.time() > deadline:
                raise TimeoutError(f"process {jax.process_index()}: no demo tokenizer appeared in {out}")
            time.sleep(0.5)
    return load_tokenizer(out)


# ----------------------------------------------------------------------------- sampler client


def make_client(
    model,
    codec,
    mesh,
    rollout: config_lib.RolloutConfig | None = None,
    *,
    share_prompts: bool = False,
    programs_of=None,
):
    """``SamplerClient`` (one sampler call per engine step, KV-cache continuation across turns), or with
    ``rollout.rolling`` a ``RollingSamplerClient`` of ``rollout.rolling_slots`` rows.

    The lockstep cache is sized per call (``cache_size=None``): a row that would not fit falls back to a
    fresh prefill of the whole call, never to a truncated prompt. The rolling state lives across calls,
    so its capacity is fixed: the caller's context limit plus the longest generation. ``RLStep`` resets
    the client after every update, since cached keys/values were computed with the old weights.
    ``programs_of``: a ``Sampler`` whose compiled programs this client's sampler runs (``Sampler(programs_of=)``).
    """
    from envace_jax.rl.policy_client import SamplerClient
    from envace_jax.rl.rolling_client import RollingSamplerClient
    from envace_jax.sampling import Sampler

    if rollout is not None and rollout.rolling:
        size = rollout.max_model_len + max(rollout.act.max_new_tokens, rollout.rehearse.max_new_tokens)
        return RollingSamplerClient(
            Sampler(model, mesh=mesh, cache_size=size, share_prompts=share_prompts, programs_of=programs_of),
            codec.stop_token_ids,
            slots=rollout.rolling_slots,
            eager_refill=rollout.rolling_eager_refill,
        )
    return SamplerClient(
        Sampler(model, mesh=mesh, share_prompts=share_prompts, programs_of=programs_of), codec.stop_token_ids
    )


def vllm_rollouts(cfg: config_lib.ExperimentConfig, rollout: config_lib.RolloutConfig, codec, unsupported: bool):
    """(the RL section with the engine's off-policy correction, a client factory) for ``rollout.engine="vllm"``:
    each model gets a ``VllmClient`` over an engine of its own, which follows its weights (rl/vllm_client.py)."""
    from envace_jax.rl.vllm_client import build_vllm_client, with_engine_correction

    if unsupported or jax.process_count() > 1:
        raise ValueError(
            "rollout.engine='vllm' runs one engine beside a one-process synchronous run: it needs rl.max_staleness=0, "
            "mesh.rollout_chips_per_host=0 and one process (got "
            f"{cfg.rl.max_staleness}, {cfg.mesh.rollout_chips_per_host}, {jax.process_count()})"
        )
    logs = os.path.join(cfg.run_dir, "vllm")
    os.makedirs(logs, exist_ok=True)
    made = itertools.count()  # one log per engine: worker0.log, worker1.log (a simulator's) ...
    return with_engine_correction(cfg.rl), lambda model, programs_of=None: build_vllm_client(
        model, codec.stop_token_ids, rollout, log_path=os.path.join(logs, f"worker{next(made)}.log")
    )


# ----------------------------------------------------------------------------- data and judge


def load_task_records(cfg: config_lib.ExperimentConfig) -> Any:
    """A random-access source of task records for the configured split."""
    d = cfg.data
    if d.source == "demo":
        from envace_jax.data.demo_tasks import generate_tasks

        return generate_tasks(d.num_demo_tasks, d.seed, d.split), None
    if d.source in ("jsonl", "parquet"):
        from envace_jax.data.records import load_records

        return load_records(d.path), None
    from envace_jax.data.tfds_builder import decode_example, read_split

    return read_split(d.path, d.tfds_name, d.split, decode=False), decode_example


def build_data(cfg: config_lib.ExperimentConfig, codec):
    from envace_jax.data.pipeline import PipelineConfig, PromptIterator
    from envace_jax.data.records import prompt_length_filter, reference_prompt_limit

    source, decode = load_task_records(cfg)
    if decode is None:  # in-memory records: the reference's prompt-length filter
        limit = reference_prompt_limit(cfg.data.max_prompt_length)
        if limit > 0:
            source = prompt_length_filter(source, lambda r: len(codec.caller_prompt(r["messages"], r["tools"])), limit)
        if not source:
            raise ValueError(f"config.data: no task records left after the prompt-length filter ({limit} tokens)")
    # Each process reads its own disjoint shard of the prompts.
    pcfg = PipelineConfig(
        batch_size=cfg.data.prompts_per_step,
        seed=cfg.data.seed,
        shuffle=cfg.data.shuffle,
        num_epochs=cfg.data.num_epochs or None,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
        read_threads=0,
        prefetch=0,
    )
    return PromptIterator(source, pcfg, decode=decode)


def build_judge(cfg: config_lib.ExperimentConfig):
    from envace_jax.rl.judges import HttpJudge, RuleJudge
    from envace_jax.rl.reward import ChecklistTurnJudge

    kind = cfg.judge.kind
    if kind == "rule":
        return ChecklistTurnJudge(RuleJudge())
    if kind.endswith("local"):  # a judge model in-process (rl/local_judge.py)
        from envace_jax.rl.local_judge import build_local_judge

        model_judge = build_local_judge(cfg.judge.local)
    else:
        model_judge = HttpJudge(cfg.judge.http)
    return ChecklistTurnJudge(RuleJudge(fallback=model_judge) if kind.startswith("rule_then") else model_judge)


def resolve_judge_streaming(cfg: config_lib.ExperimentConfig) -> str:
    """``rollout.judge_streaming`` with "auto" resolved: "on" for an asynchronous run whose judge answers over
    HTTP (a served model takes seconds per verdict), "off" otherwise (the synchronous loop stays the
    reference's; the rule judge answers at once, so streaming would only delay its verdicts)."""
    mode = cfg.rollout.judge_streaming
    if mode != "auto":
        return mode
    return "on" if cfg.rl.max_staleness >= 1 and cfg.judge.kind != "rule" else "off"


def build_make_env(cfg: config_lib.ExperimentConfig):
    if cfg.rollout.mode != "real":
        return None
    from envace_jax.envs import demo_worlds

    return demo_worlds.make_env


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Run:
    cfg: config_lib.ExperimentConfig
    trainers: dict[str, Trainer]  # one per trained role (same object in shared modes)
    step_fn: RLStep
    data: Any
    ckpt: Checkpointer
    writer: MetricsWriter
    iteration: int = 0
    pipeline: AsyncPipeline | None = None  # rl.max_staleness >= 1

    def distinct_trainers(self) -> dict[str, Trainer]:
        out: dict[str, Trainer] = {}
        for role, t in self.trainers.items():
            if all(t is not o for o in out.values()):
                out[role] = t
        return out

    def state(self) -> dict[str, Any]:
        out = {
            "iteration": self.iteration,
            "trainers": {r: t.state_dict() for r, t in self.distinct_trainers().items()},
        }
        if self.pipeline is not None:  # the weights versions of the rollouts in flight
            out["async"] = self.pipeline.state()
        return out

    def load(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        for r, t in self.distinct_trainers().items():
            t.load_state_dict(state["trainers"][r])
        if self.pipeline is not None:
            self.pipeline.load(state["async"], self.iteration)

    def params(self) -> dict[str, np.ndarray]:
        """Flat host copies of every trainer's parameters (``<role>/<path>``); a collective with
        several processes (every process must call it)."""
        out = {}
        for r, t in self.distinct_trainers().items():
            params = t.params
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                params = multihost_utils.process_allgather(params, tiled=True)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
                out[f"{r}{jax.tree_util.keystr(path)}"] = np.asarray(jax.device_get(leaf))
        return out


def build_policies(cfg: config_lib.ExperimentConfig, mesh):
    """(tokenizer, codec, trainers by trained role, policy model, simulator model or None)."""
    from envace_jax.chat import Qwen3ChatCodec

    tok = build_tokenizer(cfg)
    codec = Qwen3ChatCodec(
        tok, enable_thinking=cfg.tokenizer.enable_thinking, simulator_thinking=cfg.tokenizer.simulator_thinking
    )
    vocab = len(tok)
    mode = cfg.rollout.mode
    policy = with_lora(build_model(cfg.model, vocab, mesh), cfg.model, mesh)
    optim = cfg.run_optim()
    mk_trainer = lambda model: Trainer(
        model,
        optim,
        cfg.loss,
        micro_batch_size=cfg.rl.micro_batch_size,
        mesh=mesh,
        share_prefixes=cfg.rl.share_prompt_prefixes,
    )
    trainer = mk_trainer(policy)
    sim_model = None
    if mode in ("simulator", "noshare"):
        # The REHEARSE model starts from the simulator checkpoint (tiny configs: the same init as ACT).
        sim_model = build_model(cfg.model, vocab, mesh, path=cfg.model.simulator_hf_path or cfg.model.hf_path)
    trainers: dict[str, Trainer] = {r: trainer for r in TRAINED_ROLES[mode]}
    if mode == "noshare":
        trainers[REHEARSE] = mk_trainer(with_lora(sim_model, cfg.model, mesh))
    return tok, codec, trainers, policy, sim_model


def with_lora(model: qwen3.Qwen3, m: config_lib.ModelSection, mesh) -> qwen3.Qwen3:
    """``model`` with the LoRA adapters ``model.lora_*`` asks for (fresh, or read from ``model.lora_adapter``),
    laid out on ``mesh``; ``model`` itself without LoRA."""
    if not m.lora:
        return model
    from envace_jax.models import lora, peft_io

    if m.lora_adapter:
        peft_io.load_adapter(model, m.lora_adapter, seed=m.init_seed)
        rank = lora.adapter_arrays(model)[next(iter(lora.adapter_arrays(model)))].shape[-1]
        if m.lora_rank and m.lora_rank != rank:
            raise config_lib.ConfigError(
                f"config.model.lora_rank={m.lora_rank} but the adapter {m.lora_adapter!r} has rank {rank} "
                "(leave lora_rank at 0 to take the adapter's)"
            )
    else:
        lora.add_adapters(model, m.lora_rank, m.lora_alpha, m.lora_targets, seed=m.init_seed, rslora=m.lora_rslora)
    if mesh is not None:
        qwen3.place(model, mesh, model.rules or shd.TRAIN_RULES)
    return model


def meshes(cfg: config_lib.ExperimentConfig, model_cfg: qwen3.Qwen3Config | None = None) -> tuple[Any, Any]:
    """(training mesh, this process's rollout mesh or None). The rollout mesh is None where rollouts sample
    from the trained weights themselves (one process, colocated); otherwise the copies they sample from live
    on it: each host's own chips (several processes), or the chips ``mesh.rollout_chips_per_host`` keeps for
    rollouts (disaggregated). ``model_cfg`` (the policy's architecture) places the rollout mesh's tensor
    axis; without it the mesh is one ``fsdp`` axis over the rollout chips."""
    m = cfg.mesh
    if m.rollout_chips_per_host:
        train_devices, local = rollout_weights.split_devices(jax.devices(), m.rollout_chips_per_host)
        mesh = shd.make_mesh(m.data, m.fsdp, m.tensor, devices=train_devices)
    else:
        mesh, local = shd.make_mesh(m.data, m.fsdp, m.tensor), jax.local_devices()
        if jax.process_count() == 1:
            return mesh, None
    if model_cfg is None:
        return mesh, shd.make_mesh(1, len(local), 1, devices=local)
    return mesh, rollout_mesh(model_cfg, local)


def build_run(cfg: config_lib.ExperimentConfig) -> Run:
    config_lib.check_runnable(cfg)
    mesh, _ = meshes(cfg)
    tok, codec, trainers, policy, sim_model = build_policies(cfg, mesh)
    _, rollout_on = meshes(cfg, policy.config)
    sample_mesh, refreshers = mesh, []
    asynchronous = cfg.rl.max_staleness >= 1
    if rollout_on is not None:
        sample_mesh = rollout_on
        if not asynchronous:  # one copy, refreshed after every update (the pipeline keeps one per rollout)
            policy, refresh = rollout_copy(policy, sample_mesh)
            refreshers.append(refresh)
            if sim_model is not None:
                sim_model, refresh = rollout_copy(sim_model, sample_mesh)
                refreshers.append(refresh)
    # rl.share_prompt_prefixes: each group's prompt runs once in the rollouts' prefill too (one device only).
    share = cfg.rl.share_prompt_prefixes
    rollout = dataclasses.replace(cfg.rollout, judge_streaming=resolve_judge_streaming(cfg))
    client = lambda model, programs_of=None: make_client(
        model, codec, sample_mesh, rollout, share_prompts=share, programs_of=programs_of
    )
    rl = cfg.rl
    if rollout.engine == "vllm":  # a vLLM engine per policy, fed the weights after every update
        rl, client = vllm_rollouts(cfg, rollout, codec, asynchronous or rollout_on is not None)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    data = build_data(cfg, codec)
    step_fn = build_rl_step(
        rl,
        rollout,
        codec,
        client(policy),
        build_judge(cfg),
        trainers,
        simulator=None if sim_model is None else client(sim_model),
        make_env=build_make_env(cfg),
        pad_id=int(pad),
        seed=cfg.seed,
        after_update=(lambda: [f() for f in refreshers]) if refreshers else None,
        next_records=lambda: next(data),  # rl.dynamic_sampling's extra batches
    )
    pipeline = None
    if asynchronous:
        pipeline = AsyncPipeline(
            step_fn,
            max_staleness=cfg.rl.max_staleness,
            next_records=lambda: next(data),
            make_client=client,
            sample_mesh=rollout_on,
            total_steps=cfg.total_steps,
            data_state=data.get_state,
        )
    ckpt = Checkpointer(
        os.path.join(cfg.run_dir, "checkpoints"),
        max_to_keep=cfg.checkpoint.keep,
        save_interval_steps=cfg.checkpoint.every,
        async_save=cfg.checkpoint.async_save,
        hash_files=cfg.checkpoint.hash_files,
    )
    writer = MetricsWriter(cfg.run_dir, tensorboard=cfg.log.tensorboard, enabled=jax.process_index() == 0)
    return Run(cfg, trainers, step_fn, data, ckpt, writer, pipeline=pipeline)


def gather_json(obj: Any) -> list[Any]:
    """Every process's JSON-serialisable ``obj``, in process order (a collective)."""
    import json

    from jax.experimental import multihost_utils

    blob = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray(len(blob), np.int64))).reshape(-1)
    padded = np.zeros((int(sizes.max()),), np.uint8)
    padded[: len(blob)] = blob
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(bytes(r[:n]).decode()) for r, n in zip(rows, sizes)]


def data_state(run: "Run") -> Any:
    """The data position to checkpoint. Several processes read disjoint shards, each with its own
    position, and the checkpoint's JSON is written by process 0: it holds all of them."""
    own = run.pipeline.data_state() if run.pipeline is not None else run.data.get_state()
    if jax.process_count() == 1:
        return own
    return {"per_process": gather_json(own)}


def _own_data_state(state: Any) -> Any:
    if isinstance(state, dict) and "per_process" in state:
        states = state["per_process"]
        if len(states) != jax.process_count():
            raise ValueError(
                f"checkpoint holds data positions of {len(states)} processes; this run has "
                f"{jax.process_count()} (resume with the same process count)"
            )
        return states[jax.process_index()]
    return state


_SUMMED = (
    "/rows",
    "episode/count",
    "/overlong_rows_dropped",
    "/truncated_prompt_rows",
    "judge/lost_episodes",
    "judge/masked_episodes",
    "judge/masked_rows",
    "judge/dropped_groups",
    "judge/failed_verdicts",
)


def global_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Several processes: each metric over all processes (a collective). Counts (row counts, episode
    counts) are summed; everything else is averaged over the processes that report it. The trainer's
    metrics are already global (its sums run over the global batch), so averaging leaves them as
    they are."""
    if jax.process_count() == 1:
        return metrics
    each = gather_json(metrics)
    out = {}
    for k in sorted({k for m in each for k in m}):
        vals = [float(m[k]) for m in each if k in m]
        out[k] = float(np.sum(vals)) if k.endswith(_SUMMED) else float(np.mean(vals))
    return out


def load_checkpoint(run: Run, restored: RestoreResult) -> None:
    """Puts a restored checkpoint back into ``run``: params, optimizer, step, rng, data position."""
    run.load(restored.state)
    run.data.set_state(_own_data_state(restored.data_state))
    run.step_fn.weights_changed()


def judge_monitor(cfg: config_lib.ExperimentConfig, run: Run) -> judge_outage.JudgeOutageMonitor:
    """Warns about steps whose episodes lost their judge and stops a run in a judge outage."""
    judge = run.step_fn.engine.judge
    name = judge.describe() if hasattr(judge, "describe") else type(judge).__name__
    return judge_outage.JudgeOutageMonitor(
        name,
        cfg.judge.outage_share,
        cfg.judge.outage_steps,
        masked=cfg.rl.mask_judge_failures,
        warn=jax.process_index() == 0,
    )


def train(cfg: config_lib.ExperimentConfig, *, dump_params: str | None = None) -> dict[str, Any]:
    """Runs (or resumes) a training run to ``cfg.total_steps``. Returns a small summary."""
    os.makedirs(cfg.run_dir, exist_ok=True)
    run = build_run(cfg)
    if jax.process_index() == 0:
        with open(os.path.join(cfg.run_dir, "config.json"), "w") as f:
            import json

            json.dump(config_lib.as_dict(cfg), f, indent=1, sort_keys=True, default=str)
    monitor = judge_monitor(cfg, run)

    def step(k: int) -> StepResult:
        t0 = time.time()
        if run.pipeline is not None:  # rollouts of the next steps already run; this waits for step k's
            result = run.pipeline(k)
        else:
            records = next(run.data)
            t0 = time.time()
            result = run.step_fn(records, k)
        run.iteration = k + 1
        metrics = global_metrics(dict(result.metrics, **{"time/step_s": time.time() - t0}))
        return dataclasses.replace(result, metrics=metrics)

    def stop_on_outage(k: int, out: StepResult) -> None:
        # Counts are global (summed over processes), so every process stops at the same step.
        outage = monitor.observe(k, out.metrics, judge_outage.example_error(out.episodes))
        if outage is not None:
            raise outage  # no checkpoint of this step: a rerun resumes from the last one saved

    bar = cfg.name if cfg.log.progress_bar and jax.process_index() == 0 else None
    try:
        done = run_loop(
            total_steps=cfg.total_steps,
            step_fn=step,
            checkpointer=run.ckpt,
            state=run.state,
            load=lambda restored: load_checkpoint(run, restored),
            data_state=lambda: data_state(run),
            hooks=[Hook(lambda k, out: run.writer.write(k, out.metrics), every=cfg.log.every), Hook(stop_on_outage)],
            progress=Progress(
                bar,
                postfix=lambda out: {
                    "act": f"{out.metrics.get('act/reward_mean', 0):.3f}",
                    "reh": f"{out.metrics.get('rehearse/reward_mean', 0):.3f}",
                },
            ),
        )
    finally:
        run.writer.close()
        if run.pipeline is not None:
            run.pipeline.close()
    preempted = done.preempted
    if not preempted and cfg.log.plot and jax.process_index() == 0 and os.path.exists(run.writer.path):
        plot_run(cfg.run_dir, title=cfg.name)  # training.png (reward, success, loss, KL) and rewards.png
    if dump_params:
        params = run.params()  # a collective: every process gathers
        # "{process}" in the path: every process writes its own copy (tests compare them).
        if "{process}" in dump_params or jax.process_index() == 0:
            np.savez(dump_params.replace("{process}", str(jax.process_index())), **params)
    return {"iteration": run.iteration, "resumed_from": done.resumed_from, "preempted": preempted}
