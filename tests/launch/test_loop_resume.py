"""launch/train.py end to end on CPU: SIGKILL right after a checkpoint is committed + resume from that
step, SIGTERM checkpoint, and a corrupted latest checkpoint falling back, all ending bit-identical to
one uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

from tests import helpers_loop as h
from envace_jax.checkpoint import check_manifest

STEPS = 5


_lines = h.metrics_lines  # read while a run appends: a torn last line is left out


def _run(run_dir: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(h.train_cmd(run_dir, STEPS, *flags), env=h.env(), capture_output=True, text=True, timeout=900)


def _committed_steps(run_dir: str) -> list[int]:
    """Steps Orbax has committed (renamed from its tmp name), whatever their manifests say."""
    ck = os.path.join(run_dir, "checkpoints")
    return sorted(int(n) for n in os.listdir(ck) if n.isdigit()) if os.path.isdir(ck) else []


def _start_and_signal(run_dir: str, sig: int, after_lines: int = 0, after_commit: int | None = None) -> tuple[int, str]:
    """Starts a run, sends ``sig`` once metrics.jsonl has ``after_lines`` lines (or, with
    ``after_commit``, the moment checkpoint step ``after_commit`` is committed); returns (rc, stderr)."""
    proc = subprocess.Popen(
        h.train_cmd(run_dir, STEPS), env=h.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )

    def ready() -> bool:
        if after_commit is not None:
            return after_commit in _committed_steps(run_dir)
        return len(_lines(run_dir)) >= after_lines

    try:
        deadline = time.time() + 900
        while not ready():
            if proc.poll() is not None:
                raise AssertionError(f"run ended before the signal was due: {proc.stderr.read()[-3000:]}")
            assert time.time() < deadline, "timed out waiting for metrics"
            time.sleep(0.005)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _params(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_sigkill_sigterm_corrupt_checkpoint_resume_bit_identical(tmp_path):
    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    r = _run(ref_dir, f"--dump_params={tmp_path}/ref.npz")
    assert r.returncode == 0, r.stderr[-3000:]
    ref_lines = _lines(ref_dir)
    assert [x["step"] for x in ref_lines] == list(range(1, STEPS + 1))
    # The task's checklist is passable by chance, so updates carry real advantages (not all zero).
    assert any(x["adv/act/nonzero_frac"] > 0 for x in ref_lines)
    assert all(x["update/grad_norm"] > 0 for x in ref_lines if x["adv/act/nonzero_frac"] > 0)

    # 1) SIGKILL the moment a checkpoint step is committed (the save has finished; the next one may
    # have started too). The newest committed step at death is what the next run must resume from.
    kill_at = random.Random().randint(1, 2)
    rc, err = _start_and_signal(run_dir, signal.SIGKILL, after_commit=kill_at)
    assert rc == -signal.SIGKILL, err[-2000:]
    newest = _committed_steps(run_dir)[-1]
    assert newest >= kill_at
    assert check_manifest(os.path.join(run_dir, "checkpoints", str(newest))) is None

    # 2) SIGTERM after two more steps: resumes from that step, exits 0 having saved the step it finished.
    n_before = len(_lines(run_dir))
    rc, err = _start_and_signal(run_dir, signal.SIGTERM, n_before + 2)
    assert rc == 0, err[-3000:]
    assert f"resumed from checkpoint step {newest}\n" in err, err[-2000:]
    assert err.count("resumed from checkpoint step") == 1, err[-2000:]  # once: not again through absl's handler
    assert "unusable" not in err, err[-2000:]
    assert "preempted (signal 15): saved step" in err, err[-2000:]
    saved = int(err.split("saved step ")[1].split()[0])
    assert saved >= 2
    ck = os.path.join(run_dir, "checkpoints")
    assert os.path.exists(os.path.join(ck, str(saved), "envace_manifest.json"))

    # 3) Corrupt the SIGTERM checkpoint: the next run must say so and fall back to the step before it.
    state_dir = os.path.join(ck, str(saved), "state")
    victim = max((os.path.join(dp, f) for dp, _, fs in os.walk(state_dir) for f in fs), key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(max(0, os.path.getsize(victim) // 2))
    r = _run(run_dir, f"--dump_params={tmp_path}/run.npz")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint step {saved} is unusable" in r.stderr, r.stderr[-3000:]
    assert f"fell back to step {saved - 1}" in r.stderr

    # 4) Same parameters, bit for bit, and the same metrics for every step.
    ref, got = _params(f"{tmp_path}/ref.npz"), _params(f"{tmp_path}/run.npz")
    assert sorted(ref) == sorted(got)
    for k in ref:
        assert np.array_equal(ref[k], got[k]), f"parameter {k} differs after resume"
    last = {x["step"]: x for x in _lines(run_dir)}
    for x in ref_lines:
        for key in ("act/reward_mean", "update/grad_norm", "update/loss"):
            assert last[x["step"]][key] == x[key], (x["step"], key)


def test_first_save_killed_before_completion_starts_fresh(tmp_path):
    """A SIGKILL during the very first save leaves a step without its manifest and nothing older: the
    rerun starts from scratch (moving the step aside) instead of refusing to start."""
    import jax.numpy as jnp

    from envace_jax.checkpoint import MANIFEST, Checkpointer

    state = {"w": jnp.arange(4.0)}
    with Checkpointer(str(tmp_path), async_save=False) as ck:
        ck.save(1, state, {"at": 1})
    os.remove(os.path.join(tmp_path, "1", MANIFEST))
    ck = Checkpointer(str(tmp_path), async_save=False)
    assert ck.restore_latest_good(state) is None
    assert os.path.isdir(tmp_path / "1.corrupt") and ck.all_steps() == []
    assert ck.save(1, state, {"at": 1})
    ck.close()
