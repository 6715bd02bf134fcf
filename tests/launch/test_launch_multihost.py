"""A real 2-process run of launch/train.py on localhost (jax.distributed over 127.0.0.1, 2 fake CPU devices
per process): both processes finish, take the same optimizer steps and hold identical parameters, and the checkpoints
and metrics are written once, not once per process."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import numpy as np
import pytest

from tests import helpers_loop as h

STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _launch(run_dir: str, steps: int, dump: str, **overrides) -> list[str]:
    """Starts launch/train.py as processes 0 and 1 of one JAX job; returns their stderr once both exit 0."""
    port = _free_port()
    env = dict(h.env(), XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = []
    for pid in range(2):
        cmd = h.train_cmd(
            run_dir,
            steps,
            f"--coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={pid}",
            f"--dump_params={dump}",
            **overrides,
        )
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=900)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for pid, (p, err) in enumerate(zip(procs, errs)):
        assert p.returncode == 0, f"process {pid}:\n{err[-4000:]}"
        assert f"done: {{'iteration': {steps}" in err, err[-2000:]
    return errs


def _same_params(prefix: str) -> dict[str, np.ndarray]:
    p0, p1 = _params(f"{prefix}_0.npz"), _params(f"{prefix}_1.npz")
    assert sorted(p0) == sorted(p1) and p0
    for k in p0:
        assert np.array_equal(p0[k], p1[k]), f"parameter {k} differs between processes"
    return p0


@pytest.mark.slow
def test_two_process_train_same_params_one_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    _launch(run_dir, STEPS, f"{tmp_path}/a_{{process}}.npz")
    # Identical parameters on both processes.
    first = _same_params(f"{tmp_path}/a")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    # Metrics written by process 0 only: one line per step.
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1))
    assert all(x["update/optimizer_steps"] == 1 for x in lines)
    assert all(x["update/grad_norm"] > 0 for x in lines if x.get("adv/act/nonzero_frac", 0) > 0)
    # Metrics are global: each process trains on its own 2 prompts x 4 rollouts (one ACT row each).
    assert all(x["update/rows"] == 16 and x["episode/count"] == 16 for x in lines)

    # One checkpoint per saved step (keep=2), each with one manifest, no leftovers of a second writer.
    ck = os.path.join(run_dir, "checkpoints")
    entries = sorted(os.listdir(ck))
    assert entries == [str(s) for s in range(1, STEPS + 1)], entries
    for s in entries:
        assert os.path.exists(os.path.join(ck, s, "envace_manifest.json"))

    # A second launch with one more step resumes both processes from the shared checkpoint (each with its
    # own data position) and they still end identical, with weights that moved.
    errs = _launch(run_dir, STEPS + 1, f"{tmp_path}/b_{{process}}.npz")
    assert all(f"resumed from checkpoint step {STEPS}" in e for e in errs), errs[0][-2000:]
    second = _same_params(f"{tmp_path}/b")
    assert any(not np.array_equal(first[k], second[k]) for k in first)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        assert [json.loads(x)["step"] for x in f if x.strip()] == list(range(1, STEPS + 2))


@pytest.mark.slow
def test_two_process_lagged_run_resumes_bit_identical(tmp_path):
    """rl.max_staleness = 1 on two processes: each samples its own prompts from its own copy of the lagged
    weights (refreshed by a collective after every update), and a run stopped after 2 steps and resumed ends
    where an uninterrupted 3-step run ends."""
    lag = {"rl.max_staleness": 1}
    _launch(str(tmp_path / "ref"), STEPS + 1, f"{tmp_path}/ref_{{process}}.npz", **lag)
    ref = _same_params(f"{tmp_path}/ref")
    run_dir = str(tmp_path / "run")
    _launch(run_dir, STEPS, f"{tmp_path}/a_{{process}}.npz", **lag)
    errs = _launch(run_dir, STEPS + 1, f"{tmp_path}/b_{{process}}.npz", **lag)
    assert all(f"resumed from checkpoint step {STEPS}" in e for e in errs), errs[0][-2000:]
    got = _same_params(f"{tmp_path}/b")
    assert sorted(ref) == sorted(got)
    for k in ref:
        assert np.array_equal(ref[k], got[k]), f"parameter {k} differs after the resume"
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    assert [x["async/staleness_max"] for x in lines] == [0.0, 1.0, 1.0]
    assert all(x["episode/count"] == 16 for x in lines)
