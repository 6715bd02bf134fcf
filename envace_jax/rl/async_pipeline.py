"""Asynchronous agentic RL with a fixed lag: later steps' rollouts run while earlier steps are judged and trained.

``rl.max_staleness = s``. Weights version ``v`` is the parameters after ``v`` updates. The rollouts of step ``k``
are sampled from version ``max(0, k - s)``, so they start as soon as update ``k - s - 1`` is done and ``s + 1``
steps' rollouts are in flight at once: while step ``k`` waits for its judge and trains, steps ``k + 1 ... k + s``
generate. The rows trained at step ``k`` are ``min(k, s)`` updates old (``async/staleness_*``); the update
corrects for it (``rl.behaviour_is``, decoupled PPO: ``rl.loss.behaviour_weights``).

    step k:   [rollout from v(k-s) .................. judge ..]  wait  [update k -> v(k+1)] prepare + launch k+s+1
    step k+1:        [rollout from v(k+1-s) ..................... judge ..]   wait  [update k+1] ...

Each rollout in flight has a slot of its own: copies of the trained models' weights at its version, in the
compute dtype (``rl.rollout_weights``), its own sampler clients (sharing one set of compiled programs) and episode
engine, and a thread. Step ``j`` uses slot ``j mod (s + 1)``, which the rollout of step ``j - s - 1`` has left by
the time update ``j - s - 1`` (the one that makes version ``j - s``) is done. The update runs on the caller's
thread: JAX's dispatch is asynchronous and compiled programs release the GIL, so on one host the update, the
rollouts' sampler calls and the judge's and tools' threads overlap. With several processes every collective
(the update, refreshing the copies) stays on the caller's thread, where all processes meet it in the same order;
rollouts are per process. The slots share the step's judge and environments' factory, so a judge is called from
several threads at once (and from ``rl.judge_stream``'s pool): it must be thread-safe, as ``RuleJudge`` and
``HttpJudge`` are; a ``LocalModelJudge`` over a sampler of its own needs a lock around its ``generate_texts``.

Determinism. A step's episodes are a function of its records, its seed (``RLStep.rollout``) and its weights
version, which the step index fixes: no wall-clock decides a version, judge verdicts take effect at fixed points
(``rl.judge_stream``) and each slot's sampler calls depend only on its own episodes. So a run repeats bit for
bit for a seed and a lag, whatever the threads' timing and the judge's latency (given a judge that answers a
request the same way each time).

Durability. After ``K`` steps the checkpoint holds, beside the trainer state (version ``K``), the weights of the
``s`` steps in flight that sample from older versions (steps ``K ... K + s - 1``; versions ``max(0, K - s) ...
K - 1``) and the data position before step ``K``'s records were drawn. A resumed run puts those versions back in
their slots, draws the same records again and regenerates steps ``K ... K + s``: the rollouts that were in
flight are redone, not saved, and come out the same. So a kill -9 or a SIGTERM at any moment resumes to the
parameters of an uninterrupted run (``tests/rl/test_async_durable.py``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
from flax import nnx

from envace_jax.rl import rollout_weights
from envace_jax.rl.rollout import TRAINED_ROLES, RolloutCancelled, RolloutEngine
from envace_jax.rl.step import RLStep, StepResult


@dataclasses.dataclass
class Slot:
    """What one rollout in flight samples with."""

    index: int
    copies: dict[str, Any]  # "policy" / "simulator" -> this slot's weight copy of a trained model
    engine: RolloutEngine
    clients: list[Any]
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    version: int = 0  # the weights version its copies hold


@dataclasses.dataclass
class _Launch:
    step: int
    version: int
    slot: Slot
    thread: threading.Thread | None = None
    episodes: list | None = None
    error: BaseException | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    started: float = 0.0
    ended: float = 0.0
    timing: dict[str, float] = dataclasses.field(default_factory=dict)


def trained_models(step: RLStep) -> dict[str, Any]:
    """The models the update changes, by the client that samples from them ("policy", and "simulator" in
    ``noshare``)."""
    out: dict[str, Any] = {}
    for role, which in TRAINED_ROLES[step.engine.cfg.mode].items():
        out.setdefault(which, step.trainers[role].model)
    return out


class AsyncPipeline:
    """Runs RL steps with a fixed lag (see the module docstring); ``pipeline(k)`` runs step ``k``.

    ``step``: the ``RLStep`` whose update runs here and whose engine is the template of the slots' engines
    (codec, judge, environments, config). ``next_records()``: the next step's prompt records (drawn when the step
    is launched, in step order). ``make_client(model, programs_of)``: a sampler client over ``model``, running the
    compiled programs of ``programs_of`` (a ``Sampler``) when given. ``sample_mesh``: where the weight copies
    live (None: where the trained models are; else this process's rollout mesh: several processes, or the
    disaggregated layout). ``total_steps``: no step at or past it is launched. ``data_state()``: the data
    position (so a checkpoint can say where step ``K``'s records start). ``after_update(k)``: runs after step
    ``k``'s update, before the new weights are copied out (the demo's replay batches); returns metrics.
    ``record_timeline``: keep every phase's span in ``timeline`` (the benchmark's plot).
    """

    def __init__(
        self,
        step: RLStep,
        *,
        max_staleness: int,
        next_records: Callable[[], Sequence[Mapping[str, Any]]],
        make_client: Callable[[Any, Any], Any],
        sample_mesh: Any = None,
        total_steps: int | None = None,
        data_state: Callable[[], Any] | None = None,
        after_update: Callable[[int], Mapping[str, float]] | None = None,
        record_timeline: bool = False,
    ):
        if max_staleness < 1:
            raise ValueError(f"AsyncPipeline(max_staleness={max_staleness}): the pipeline is for a lag >= 1")
        self.step, self.s = step, int(max_staleness)
        self.next_records, self.get_data_state = next_records, data_state
        self.total_steps, self.after_update = total_steps, after_update
        self.trained = trained_models(step)
        self.timeline: list[dict[str, Any]] | None = [] if record_timeline else None
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        template = step.engine
        frozen = template.simulator if template.cfg.mode == "simulator" else None
        shared: dict[str, Any] = {}  # client name -> the Sampler whose programs the other slots run
        self.slots = []
        for i in range(self.s + 1):
            copies = {name: rollout_weights.weights_copy(m, sample_mesh) for name, m in self.trained.items()}
            clients = {}
            for name, model in list(copies.items()) + ([("simulator", frozen.sampler.model)] if frozen else []):
                clients[name] = make_client(model, shared.get(name))
                shared.setdefault(name, clients[name].sampler)
            engine = RolloutEngine(
                template.cfg,
                template.codec,
                clients["policy"],
                template.judge,
                simulator=clients.get("simulator"),
                make_env=template.make_env,
            )
            self.slots.append(Slot(i, copies, engine, list(clients.values())))
        self.version = 0  # updates done (= steps done)
        self._next = 0  # the next step to launch
        self._prepared = {j: 0 for j in range(self.s + 1)}  # step -> the version its slot holds for it
        # With several processes a slot's copies are this process's own arrays, which a checkpoint cannot save:
        # the versions of the steps in flight are also kept as global arrays in the trained layout (a shard of
        # each per chip), for the checkpoint.
        self._global = jax.process_count() > 1
        self._snapshots: dict[int, dict[str, Any]] = {}  # step -> {client name: snapshot of its version}
        if self._global:
            for j in range(self.s + 1):
                self._snapshots[j] = {n: rollout_weights.snapshot(m) for n, m in self.trained.items()}
        self._data_before: dict[int, Any] = {}  # step -> the data position before its records were drawn
        self._launches: dict[int, _Launch] = {}

    # ------------------------------------------------------------------ schedule
    def weights_version(self, k: int) -> int:
        """The weights version the rollouts of step ``k`` sample from."""
        return max(0, k - self.s)

    def slot_of(self, k: int) -> Slot:
        return self.slots[k % (self.s + 1)]

    def _prepare(self, k: int) -> None:
        """Copies the trainer's weights (version ``self.version``, the one step ``k`` samples from) into step
        ``k``'s slot. A collective with several processes."""
        if self.weights_version(k) != self.version:
            raise RuntimeError(f"step {k} samples from version {self.weights_version(k)}, not {self.version}")
        slot = self.slot_of(k)
        busy = [j for j, launch in self._launches.items() if launch.slot is slot and not launch.done.is_set()]
        if busy:
            raise RuntimeError(f"slot {slot.index} is still sampling step {busy[0]}")
        for name, copy in slot.copies.items():
            rollout_weights.load_weights(copy, self.trained[name])
        if self._global:
            self._snapshots[k] = {n: rollout_weights.snapshot(m) for n, m in self.trained.items()}
        slot.version = self.version
        self._prepared[k] = self.version

    def _launch_ready(self) -> None:
        """Starts the rollouts of every step whose weights are ready (up to ``s`` steps ahead)."""
        while (
            (self.total_steps is None or self._next < self.total_steps)
            and self._next in self._prepared
            and self._next <= self.version + self.s
        ):
            k = self._next
            if self.get_data_state is not None:
                self._data_before[k] = self.get_data_state()
            records = list(self.next_records())
            launch = _Launch(k, self._prepared.pop(k), self.slot_of(k))
            launch.thread = threading.Thread(
                target=self._rollout, args=(launch, records), name=f"rollout-step{k}", daemon=True
            )
            self._launches[k] = launch
            self._next += 1
            launch.thread.start()

    def _rollout(self, launch: _Launch, records: list) -> None:
        slot = launch.slot
        engine = slot.engine
        engine.cancel = slot.cancel
        lane = f"rollout {slot.index}"
        if self.timeline is not None:
            engine.on_interval = lambda kind, a, b: self._mark(lane, kind, a, b, launch.step)
        launch.started = time.perf_counter()
        try:
            launch.episodes = self.step.rollout(records, launch.step, engine=engine)
            launch.timing = dict(engine.timing)
        except BaseException as e:  # handed to the caller's thread, which raises it
            launch.error = e
        finally:
            for client in slot.clients:
                try:  # this version's cached rows and prepared weights are of no use to the slot's next step
                    client.reset()
                    if hasattr(client, "release_weights"):
                        client.release_weights()
                except RuntimeError:  # requests left open by a cancelled rollout: the slot is not reused
                    pass
            launch.ended = time.perf_counter()
            if self.timeline is not None:
                self._mark(lane, "rollout", launch.started, launch.ended, launch.step)
            launch.done.set()

    def _mark(self, lane: str, kind: str, t0: float, t1: float, step: int) -> None:
        with self._lock:
            self.timeline.append({"lane": lane, "kind": kind, "step": step, "t0": t0 - self._t0, "t1": t1 - self._t0})

    # ------------------------------------------------------------------ one step
    def __call__(self, k: int) -> StepResult:
        """Runs step ``k``: waits for its rollouts, updates, copies the new weights out to the step ``s`` ahead
        and launches it. Steps run in order from the last one restored (or 0)."""
        if k != self.version:
            raise RuntimeError(f"AsyncPipeline: step {k} asked for after {self.version} steps")
        self._launch_ready()
        launch = self._launches.pop(k)
        t0 = time.perf_counter()
        launch.done.wait()
        t1 = time.perf_counter()
        if launch.error is not None:
            raise launch.error
        result = self.step.update(launch.episodes, k, notify=False)
        extra = dict(self.after_update(k)) if self.after_update is not None else {}
        t2 = time.perf_counter()
        if self.timeline is not None:
            self._mark("update", "idle", t0, t1, k)
            self._mark("update", "update", t1, t2, k)
        self.version += 1
        self._prepare(self.version + self.s)
        self._launch_ready()
        self._data_before.pop(k, None)
        self._snapshots.pop(k, None)
        stale = k - launch.version
        result.metrics.update(extra)
        result.metrics.update(
            {
                "async/staleness_mean": float(stale),
                "async/staleness_max": float(stale),
                "async/weights_version": float(launch.version),
                "async/in_flight": float(len(self._launches)),
                "async/rollout_s": launch.ended - launch.started,
                "async/generate_s": launch.timing.get("generate_s", 0.0),
                "async/judge_wait_s": launch.timing.get("judge_wait_s", 0.0),
                "async/idle_s": t1 - t0,
                "async/update_s": t2 - t1,
            }
        )
        return result

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What a checkpoint after ``self.version`` steps needs beside the trainer: the weights of steps
        ``version ... version + s - 1``, one entry each (their models' parameters by client name)."""
        out = []
        for k in range(self.version, self.version + self.s):
            if self._global:
                out.append(self._snapshots[k])
            else:
                out.append({name: nnx.state(copy, nnx.Param) for name, copy in self.slot_of(k).copies.items()})
        return {"versions": out}

    def data_state(self) -> Any:
        """The data position a checkpoint after ``self.version`` steps records: before that step's records."""
        if self.version in self._data_before:
            return self._data_before[self.version]
        return self.get_data_state() if self.get_data_state is not None else None

    def load(self, state: Mapping[str, Any], steps_done: int) -> None:
        """Puts a checkpoint's versions back (the trainers are restored first): steps ``steps_done ...
        steps_done + s - 1`` sample from them, step ``steps_done + s`` from the trainer's weights."""
        if self._launches:
            raise RuntimeError("AsyncPipeline.load with rollouts in flight")
        versions = list(state["versions"])
        if len(versions) != self.s:
            raise ValueError(
                f"checkpoint holds {len(versions)} weights versions, rl.max_staleness={self.s} needs {self.s}"
            )
        self.version = self._next = int(steps_done)
        self._prepared, self._data_before = {}, {}
        self._snapshots = {}
        for i, k in enumerate(range(self.version, self.version + self.s)):
            slot = self.slot_of(k)
            for name, copy in slot.copies.items():
                if self._global:  # global arrays: each process takes its own copy (a collective)
                    rollout_weights.load_weights(copy, versions[i][name])
                else:
                    nnx.update(copy, versions[i][name])
            if self._global:
                self._snapshots[k] = dict(versions[i])
            slot.version = self.weights_version(k)
            self._prepared[k] = slot.version
        self._prepare(self.version + self.s)

    def close(self) -> None:
        """Stops the rollouts in flight (a finished or interrupted run); their episodes are dropped."""
        for slot in self.slots:
            slot.cancel.set()
        for launch in self._launches.values():
            if launch.thread is not None:
                launch.thread.join(timeout=120)
        self._launches = {}


__all__ = ["AsyncPipeline", "RolloutCancelled", "Slot", "trained_models"]
