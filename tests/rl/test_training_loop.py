"""The training-loop skeleton (``rl.training_loop``) on a tiny numpy "step function", no model: hook schedule,
save cadence and the order of a step, a stop raised by a hook, a corrupt newest checkpoint, and in real
subprocesses SIGKILL -> resume and SIGTERM -> save + exit 0. The truth each run is compared with is the
step recurrence computed here by hand: w_k = 0.5 * w_(k-1) + [k, 2k, 3k] (float32), from w_0 = 0."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from envace_jax.checkpoint import Checkpointer, check_manifest
from envace_jax.rl.training_loop import Hook, LoopResult, Progress, run_loop
from tests.helpers_paths import ROOT


def expected_w(steps: int) -> np.ndarray:
    w = np.zeros(3, np.float32)
    for k in range(1, steps + 1):
        w = np.float32(0.5) * w + np.asarray([k, 2 * k, 3 * k], np.float32)
    return w


class Accumulator:
    """The run's whole state: w and the number of steps done; ``step(k)`` runs step k (0-based)."""

    def __init__(self, events: list | None = None):
        self.w = np.zeros(3, np.float32)
        self.done = 0
        self.events = events if events is not None else []

    def step(self, k: int) -> dict[str, float]:
        assert k == self.done, (k, self.done)
        self.w = np.float32(0.5) * self.w + np.asarray([k + 1, 2 * (k + 1), 3 * (k + 1)], np.float32)
        self.done = k + 1
        self.events.append(("step", k))
        return {"w0": float(self.w[0])}

    def state(self) -> dict:
        return {"w": self.w, "done": self.done}

    def load(self, restored) -> None:
        self.w = np.asarray(restored.state["w"], np.float32)
        self.done = int(restored.state["done"])
        assert restored.data_state == {"done": self.done}  # the data position saved beside it

    def data_state(self) -> dict:
        self.events.append(("data_state", self.done))
        return {"done": self.done}


def run(acc: Accumulator, ckdir, total: int, every: int, lines: list[str], **kw) -> LoopResult:
    ck = Checkpointer(str(ckdir), max_to_keep=None, save_interval_steps=every, async_save=True)
    return run_loop(
        total_steps=total,
        step_fn=acc.step,
        checkpointer=ck,
        state=acc.state,
        load=acc.load,
        data_state=acc.data_state,
        log=lines.append,
        **kw,
    )


def committed(ckdir) -> list[int]:
    return sorted(int(n) for n in os.listdir(ckdir) if n.isdigit()) if os.path.isdir(ckdir) else []


def test_hook_schedule():
    every2 = Hook(lambda k, out: None, every=2)
    assert [k for k in range(1, 8) if every2.due(k, 7)] == [2, 4, 6, 7]  # and at the last step
    not_last = Hook(lambda k, out: None, every=2, at_last=False)
    assert [k for k in range(1, 7) if not_last.due(k, 6)] == [2, 4]  # never at the last step
    never = Hook(lambda k, out: None, every=0, at_last=False)
    assert not any(never.due(k, 5) for k in range(1, 6))
    with pytest.raises(ValueError, match="every must be >= 0"):
        Hook(lambda k, out: None, every=-1)


def test_saves_every_n_steps_and_at_the_end_with_hooks_in_order(tmp_path):
    events: list = []
    acc = Accumulator(events)
    hooks = [
        Hook(lambda k, out: events.append(("a", k, out["w0"])), every=2),
        Hook(lambda k, out: events.append(("b", k)), every=3, at_last=False),
    ]
    lines: list[str] = []
    res = run(
        acc, tmp_path, total=7, every=3, lines=lines, hooks=hooks, progress=Progress(line=lambda k, out: f"line {k}")
    )
    assert res == LoopResult(step=7, resumed_from=None, preempted=False)
    # Each step: the step, then the hooks in their order, then (when due) the data position for the save.
    w0 = [float(expected_w(k)[0]) for k in range(8)]
    assert events == [
        ("step", 0),
        ("step", 1),
        ("a", 2, w0[2]),
        ("step", 2),
        ("b", 3),
        ("data_state", 3),
        ("step", 3),
        ("a", 4, w0[4]),
        ("step", 4),
        ("step", 5),
        ("a", 6, w0[6]),
        ("b", 6),
        ("data_state", 6),
        ("step", 6),
        ("a", 7, w0[7]),
        ("data_state", 7),
    ]
    assert committed(tmp_path) == [3, 6, 7]  # every 3 steps and the last
    assert all(check_manifest(tmp_path / str(s)) is None for s in (3, 6, 7))
    assert lines == ["line 3", "line 6", "line 7"]  # no bar: one line per checkpoint
    # A rerun of a finished run restores the last step and runs nothing.
    again = Accumulator()
    res = run(again, tmp_path, total=7, every=3, lines=lines)
    assert res == LoopResult(step=7, resumed_from=7, preempted=False) and again.events == []
    np.testing.assert_array_equal(again.w, expected_w(7))
    assert lines[-1] == "resumed from checkpoint step 7"


def test_a_hook_that_raises_stops_without_saving_that_step_and_the_rerun_resumes(tmp_path):
    class Outage(Exception):
        pass

    def stop_at_5(k, out):
        if k == 5:
            raise Outage(f"stopped at {k}")

    ck = Checkpointer(str(tmp_path), max_to_keep=None, save_interval_steps=2, async_save=True)
    acc = Accumulator()
    with pytest.raises(Outage, match="stopped at 5"):
        run_loop(
            total_steps=8,
            step_fn=acc.step,
            checkpointer=ck,
            state=acc.state,
            load=acc.load,
            data_state=acc.data_state,
            hooks=[Hook(stop_at_5)],
            log=lambda s: None,
        )
    assert committed(tmp_path) == [2, 4]  # step 5 was not saved
    lines: list[str] = []
    acc = Accumulator()
    res = run(acc, tmp_path, total=8, every=2, lines=lines)
    assert res == LoopResult(step=8, resumed_from=4, preempted=False)
    assert lines == ["resumed from checkpoint step 4"]
    assert [e for e in acc.events if e[0] == "step"] == [("step", k) for k in range(4, 8)]
    np.testing.assert_array_equal(acc.w, expected_w(8))


def test_a_corrupt_newest_checkpoint_is_reported_and_skipped(tmp_path):
    run(Accumulator(), tmp_path, total=4, every=2, lines=[])
    state_dir = tmp_path / "4" / "state"  # cut step 4's largest file in half
    victim = max((os.path.join(dp, f) for dp, _, fs in os.walk(state_dir) for f in fs), key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    lines: list[str] = []
    acc = Accumulator()
    res = run(acc, tmp_path, total=6, every=2, lines=lines, resumed_line="custom: resumed at {step}")
    assert res.resumed_from == 2
    assert lines[0].startswith("checkpoint step 4 is unusable (") and lines[0].endswith("); fell back to step 2")
    assert lines[1] == "custom: resumed at 2"
    np.testing.assert_array_equal(acc.w, expected_w(6))


def test_by_default_the_loop_reports_through_its_module_logger(tmp_path, caplog):
    # No ``log`` given: the lines are INFO records of envace_jax.rl.training_loop (the launch commands show
    # them on stderr, envace_jax/cli/entrypoint.py); nothing is printed.
    with caplog.at_level(logging.INFO, logger="envace_jax"):
        for total in (4, 6):
            acc = Accumulator()
            run_loop(
                total_steps=total,
                step_fn=acc.step,
                checkpointer=Checkpointer(str(tmp_path), max_to_keep=None, save_interval_steps=2, async_save=True),
                state=acc.state,
                load=acc.load,
                data_state=acc.data_state,
                progress=Progress(line=lambda k, out: f"at {k}"),
            )
    ours = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("envace_jax.rl")]
    info = lambda m: ("envace_jax.rl.training_loop", logging.INFO, m)
    assert ours == [info("at 2"), info("at 4"), info("resumed from checkpoint step 4"), info("at 6")]
    np.testing.assert_array_equal(acc.w, expected_w(6))


# --------------------------------------------------------------------------- real processes

# The Accumulator's step and state, as a script: w_k = 0.5 * w_(k-1) + [k, 2k, 3k], a line "DONE k" after each step.
SCRIPT = textwrap.dedent("""
    import json, logging, sys, time
    import numpy as np
    from envace_jax.checkpoint import Checkpointer
    from envace_jax.rl.training_loop import Hook, run_loop

    # The loop's lines, shown the way a library user would (force: importing orbax already gave root a handler).
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    ckdir, total, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run = {"w": np.zeros(3, np.float32), "done": 0}

    def step(k):
        time.sleep(0.2)   # room for the test to signal between steps
        run["w"] = np.float32(0.5) * run["w"] + np.asarray([k + 1, 2 * (k + 1), 3 * (k + 1)], np.float32)
        run["done"] = k + 1

    res = run_loop(total_steps=total, step_fn=step,
                   checkpointer=Checkpointer(ckdir, max_to_keep=None, save_interval_steps=every),
                   state=lambda: dict(run), load=lambda restored: run.update(restored.state),
                   data_state=lambda: {"done": run["done"]},
                   hooks=[Hook(lambda k, out: print(f"DONE {k}", flush=True))])
    print(json.dumps({"step": res.step, "preempted": res.preempted, "w": np.asarray(run["w"]).tolist()}), flush=True)
""")


def _start(tmp_path, ckdir, total: int, every: int) -> subprocess.Popen:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, str(script), str(ckdir), str(total), str(every)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _wait_for_line(proc: subprocess.Popen, prefix: str) -> str:
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line: {proc.stderr.read()[-3000:]}")


def test_sigkill_after_a_commit_then_resume_ends_with_the_uninterrupted_state(tmp_path):
    ckdir = tmp_path / "ck"
    proc = _start(tmp_path, ckdir, total=12, every=2)
    try:
        deadline = time.monotonic() + 600
        while not committed(ckdir):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint committed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    newest = committed(ckdir)[-1]
    assert newest < 12 and check_manifest(ckdir / str(newest)) is None
    lines: list[str] = []
    acc = Accumulator()
    res = run(acc, ckdir, total=12, every=2, lines=lines)
    assert res.resumed_from == newest and lines == [f"resumed from checkpoint step {newest}"]
    assert [e for e in acc.events if e[0] == "step"] == [("step", k) for k in range(newest, 12)]
    np.testing.assert_array_equal(acc.w, expected_w(12))


def test_sigterm_saves_the_step_it_finished_and_exits_zero(tmp_path):
    ckdir = tmp_path / "ck"
    proc = _start(tmp_path, ckdir, total=1000, every=1000)
    try:
        _wait_for_line(proc, "DONE 2")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    saved = report["step"]
    assert report["preempted"] and 2 <= saved < 1000
    assert f"preempted (signal {int(signal.SIGTERM)}): saved step {saved}\n" in err, err[-3000:]
    assert committed(ckdir) == [saved] and check_manifest(ckdir / str(saved)) is None  # off-cadence, forced
    np.testing.assert_array_equal(np.asarray(report["w"], np.float32), expected_w(saved))
    acc = Accumulator()
    res = run(acc, ckdir, total=saved + 3, every=1000, lines=[])
    assert res == LoopResult(step=saved + 3, resumed_from=saved, preempted=False)
    np.testing.assert_array_equal(acc.w, expected_w(saved + 3))


def test_a_bar_shows_the_postfix_and_replaces_the_checkpoint_lines(tmp_path, capsys):
    lines: list[str] = []
    run(
        Accumulator(),
        tmp_path,
        total=4,
        every=2,
        lines=lines,
        progress=Progress("demo-bar", postfix=lambda out: {"w0": f"{out['w0']:.2f}"}, line=lambda k, out: "no"),
    )
    err = capsys.readouterr().err
    assert "demo-bar" in err and "4/4" in err and f"w0={float(expected_w(4)[0]):.2f}" in err, err
    assert lines == []  # the bar shows progress; no checkpoint lines
