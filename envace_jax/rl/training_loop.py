"""One training loop, shared by RL training (``rl.train.train``) and pretraining (``demo.pretrain.run_pretrain``).

What every run needs is written here once: resume from the newest good checkpoint (saying which newer ones
were unusable), run the steps, run the hooks, save every ``checkpointer.save_interval_steps`` steps and at
the last step, turn SIGTERM into a saved step and a clean stop, and show progress. What a step *is* stays
with the caller: ``step_fn(k)`` runs step ``k`` (0-based: ``k + 1`` steps are done when it returns) and
returns whatever the hooks and the progress display read.

One step, in this order (with several JAX processes every process runs it in lockstep, so each collective
in ``step_fn``, in a hook, in the preemption check and in a save happens at the same place on all of them):

    out = step_fn(k); k += 1 -> progress bar -> hooks, in order -> guard.check() -> save if due -> stop if
    preempted

A hook that raises ends the run there, without saving step ``k`` (RL's judge-outage stop): the checkpointer
is closed and the progress bar shut before the exception leaves ``run_loop``, so a rerun resumes from the
last step saved.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envace_jax import jit_maps
from envace_jax.checkpoint import Checkpointer, PreemptionGuard, RestoreResult


# The lines a run reports (a resume, an unusable checkpoint, a preemption, progress without a bar) are INFO
# records of this logger; the launch commands show them on stderr as bare lines (envace_jax/cli/entrypoint.py).
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(step, out)`` after every ``every``-th step (``every=0``: never), where ``step`` counts the steps
    done and ``out`` is what ``step_fn`` returned. At the last step ``at_last`` decides alone: True runs it
    whatever ``every`` says (a metrics line for the final step), False never does (an evaluation the caller
    runs itself once the loop is over)."""

    fn: Callable[[int, Any], None]
    every: int = 1
    at_last: bool = True

    def __post_init__(self):
        if self.every < 0:
            raise ValueError(f"Hook.every must be >= 0 (0: never), got {self.every}")

    def due(self, step: int, total_steps: int) -> bool:
        if step == total_steps:
            return self.at_last
        return self.every > 0 and step % self.every == 0


@dataclasses.dataclass(frozen=True)
class Progress:
    """How a run shows its progress: a tqdm bar labelled ``label`` (None: no bar) with ``postfix(out)`` as its
    postfix; with no bar, ``line(step, out)`` (if given) is logged at each checkpoint, so a log file still
    shows how far the run got."""

    label: str | None = None
    postfix: Callable[[Any], Mapping[str, str]] | None = None
    line: Callable[[int, Any], str] | None = None


@dataclasses.dataclass(frozen=True)
class LoopResult:
    step: int  # steps done when the loop ended
    resumed_from: int | None  # the checkpoint step the run started from; None: a fresh start
    preempted: bool  # stopped by SIGTERM (step ``step`` is saved)


def resume(
    checkpointer: Checkpointer,
    state: Any,
    load: Callable[[RestoreResult], None],
    *,
    log: Callable[[str], None] = logger.info,
) -> int | None:
    """Restores the newest good checkpoint into ``state``'s structure and hands it to ``load``; returns its
    step (None: nothing saved yet, a fresh start). Each newer step it had to skip is logged with its reason."""
    restored = checkpointer.restore_latest_good(state)
    if restored is None:
        return None
    for bad, reason in restored.skipped:
        log(f"checkpoint step {bad} is unusable ({reason}); fell back to step {restored.step}")
    load(restored)
    return restored.step


def run_loop(
    *,
    total_steps: int,
    step_fn: Callable[[int], Any],
    checkpointer: Checkpointer,
    state: Callable[[], Any],
    load: Callable[[RestoreResult], None],
    data_state: Callable[[], Any] = lambda: None,
    hooks: Sequence[Hook] = (),
    progress: Progress = Progress(),
    log: Callable[[str], None] = logger.info,
    resumed_line: str = "resumed from checkpoint step {step}",
    preempted_line: str = "preempted (signal {signal}): saved step {step}",
) -> LoopResult:
    """Runs (or resumes) a run to ``total_steps`` steps; see the module docstring for the order of a step.

    ``state()`` is what a checkpoint holds (and the structure a restore fills); ``data_state()`` the data
    position saved beside it (JSON; called only when saving, on every process); ``load(restored)`` puts a
    restored checkpoint back into the run. ``resumed_line`` and ``preempted_line`` are logged (``{step}``,
    ``{signal}`` filled in) after a resume and on a SIGTERM stop. The loop owns ``checkpointer``: it is
    closed when the loop ends, however it ends.
    """
    if total_steps < 0:
        raise ValueError(f"run_loop: total_steps must be >= 0, got {total_steps}")
    try:
        # Installed before the restore, so a SIGTERM that arrives while a large checkpoint loads is kept.
        with PreemptionGuard() as guard:
            resumed = resume(checkpointer, state(), load, log=log)
            if resumed is not None:
                log(resumed_line.format(step=resumed))
            step = 0 if resumed is None else resumed
            bar = _bar(progress.label, total_steps, step)
            try:
                while step < total_steps:
                    out = step_fn(step)
                    step += 1
                    jit_maps.release_if_near_limit()  # many compiled shapes would hit vm.max_map_count
                    if bar is not None:
                        bar.update(1)
                        if progress.postfix is not None:
                            bar.set_postfix(**progress.postfix(out))
                    for hook in hooks:
                        if hook.due(step, total_steps):
                            hook.fn(step, out)
                    stop = guard.check()  # once per step on every process: it is a collective
                    final = stop or step == total_steps
                    if final or step % checkpointer.save_interval_steps == 0:
                        checkpointer.save(step, state(), data_state())
                        if final:  # the last write must be committed before the process may exit
                            checkpointer.wait()
                        if bar is None and progress.line is not None:
                            log(progress.line(step, out))
                    if stop:
                        log(preempted_line.format(signal=guard.signal_received, step=step))
                        return LoopResult(step, resumed, preempted=True)
            finally:
                if bar is not None:
                    bar.close()
    finally:
        checkpointer.close()
    return LoopResult(step, resumed, preempted=False)


def _bar(label: str | None, total: int, initial: int):
    if label is None:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=label, dynamic_ncols=True, file=sys.stderr)
