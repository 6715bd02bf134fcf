"""A checkpoint step is durable once Orbax commits it: the manifest is written before the commit,
so a kill -9 at any moment never costs a committed step, and pruning never outruns the manifest.
(The RL loop's kill right after a commit is in test_loop_resume.py; the pretraining loop's is here.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from envace_jax.checkpoint import MANIFEST, Checkpointer, check_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(v: float) -> dict:
    return {"w": np.full(3, v, np.float32), "step": int(v)}


class _Recording(Checkpointer):
    """Records what the directory holds at the moment each manifest is written."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: list[tuple[int, list[str], list[str], dict[str, str | None]]] = []

    def _write_manifest_before_commit(self) -> None:
        super()._write_manifest_before_commit()
        names = sorted(os.listdir(self.directory))
        manifested = [n for n in names if (self.directory / n / MANIFEST).exists()]
        good = {n: check_manifest(self.directory / n) for n in names if n.isdigit()}
        self.seen.append((self._writing, names, manifested, good))


def test_manifest_is_written_before_the_step_appears_and_before_pruning(tmp_path):
    for async_save in (True, False):
        d = tmp_path / f"async_{async_save}"
        ck = _Recording(d, max_to_keep=1, async_save=async_save)
        for step in (1, 2, 3):
            ck.save(step, _state(step), {"at": step})
        ck.close()
        assert [s for s, *_ in ck.seen] == [1, 2, 3]
        for step, names, manifested, good in ck.seen:
            # The step is still under Orbax's tmp name, its manifest already inside it.
            assert str(step) not in names, (step, names)
            (tmp,) = [n for n in names if n.startswith(f"{step}.orbax-checkpoint-tmp")]
            assert tmp in manifested
            # max_to_keep=1, yet the previous step is still there, whole, until this one is committed.
            want = {} if step == 1 else {str(step - 1): None}
            assert good == want, (step, good)
        assert sorted(os.listdir(d)) == ["3"] and check_manifest(d / "3") is None


def test_pruning_moves_a_step_out_whole_and_the_next_start_deletes_it(tmp_path):
    ck = Checkpointer(tmp_path, max_to_keep=1)
    ck.save(1, _state(1), {"at": 1})
    ck.save(2, _state(2), {"at": 2})
    ck.wait()
    # Step 1 left the listing in one rename; its files are deleted later, outside the step names.
    assert sorted(os.listdir(tmp_path)) == [".pruned", "2"] and os.listdir(tmp_path / ".pruned") == ["1"]
    assert check_manifest(tmp_path / ".pruned" / "1") is None
    # What a kill during that later deletion leaves: a half-deleted step, not under a step's name.
    victim = max(
        (os.path.join(r, f) for r, _, fs in os.walk(tmp_path / ".pruned" / "1") for f in fs), key=os.path.getsize
    )
    os.remove(victim)
    ck = Checkpointer(tmp_path, max_to_keep=1)
    assert sorted(os.listdir(tmp_path)) == ["2"]
    assert ck.restore_latest_good(_state(0)).step == 2
    ck.save(3, _state(3), {"at": 3})
    ck.close()
    assert sorted(os.listdir(tmp_path)) == ["3"]


def test_a_read_only_reader_beside_a_live_run_leaves_its_writes_alone(tmp_path):
    ck = Checkpointer(tmp_path, max_to_keep=1)
    ck.save(1, _state(1), {"at": 1})
    ck.save(2, _state(2), {"at": 2})
    ck.wait()
    # What a live run holds mid-save: an in-flight tmp dir, and a pruned step not yet deleted.
    in_flight = tmp_path / "3.orbax-checkpoint-tmp-123"
    (in_flight / "state").mkdir(parents=True)
    before = sorted(os.listdir(tmp_path))
    reader = Checkpointer(tmp_path, async_save=False, read_only=True)  # as launch/export_hf.py opens it
    res = reader.restore_latest_good(_state(0))
    assert res.step == 2 and np.array_equal(res.state["w"], _state(2)["w"])
    with pytest.raises(RuntimeError, match="read-only"):
        reader.save(4, _state(4))
    reader.close()
    assert sorted(os.listdir(tmp_path)) == before == [".pruned", "2", in_flight.name]
    # A writer starting there does clear both (the run that owned them is gone by then).
    Checkpointer(tmp_path, max_to_keep=1).close()
    assert sorted(os.listdir(tmp_path)) == ["2"]
    ck.close()


class _ManifestFails(Checkpointer):
    def _write_manifest_before_commit(self) -> None:
        if self._writing == 2:
            raise OSError("no space left on device (simulated)")
        super()._write_manifest_before_commit()


def test_a_failed_manifest_write_stops_the_commit_and_is_raised(tmp_path):
    ck = _ManifestFails(tmp_path)
    ck.save(1, _state(1), {"at": 1})
    ck.save(2, _state(2), {"at": 2})
    with pytest.raises(OSError, match="no space left"):
        ck.wait()
    # Step 2 never became a step: only Orbax's tmp dir is left, which the next start clears.
    names = sorted(os.listdir(tmp_path))
    assert names[0] == "1" and len(names) == 2 and names[1].startswith("2.orbax-checkpoint-tmp"), names
    ck = Checkpointer(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["1"]
    assert ck.restore_latest_good(_state(0)).step == 1
    ck.close()


KILL_BEFORE_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from envace_jax.checkpoint import Checkpointer

    class KilledBeforeCommit(Checkpointer):
        def _write_manifest_before_commit(self):
            super()._write_manifest_before_commit()
            if self._writing == 3:  # the manifest is on disk, Orbax has not renamed the step yet
                os.kill(os.getpid(), signal.SIGKILL)

    ck = KilledBeforeCommit(sys.argv[1], max_to_keep=1)
    for step in (1, 2, 3):
        ck.save(step, {"w": np.full(3, step, np.float32), "step": step}, {"at": step})
    ck.wait()
    sys.exit(3)  # not reached
""")


def test_kill_between_manifest_and_commit_resumes_previous_step(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_BEFORE_COMMIT)
    d = tmp_path / "ck"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script), str(d)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    names = sorted(os.listdir(d))
    # Step 1 was pruned once step 2 was committed; step 2 survives because step 3 never was.
    assert names[0] == "2" and len(names) == 2 and names[1].startswith("3.orbax-checkpoint-tmp"), names
    assert check_manifest(d / "2") is None
    ck = Checkpointer(d, max_to_keep=1)
    res = ck.restore_latest_good(_state(0))
    assert res.step == 2 and res.skipped == [] and res.data_state == {"at": 2}
    np.testing.assert_array_equal(res.state["w"], np.full(3, 2, np.float32))
    assert sorted(os.listdir(d)) == ["2"]  # the uncommitted write is cleared
    assert ck.save(3, _state(3), {"at": 3})
    ck.close()
    assert sorted(os.listdir(d)) == ["3"] and check_manifest(d / "3") is None


def _committed(ckdir) -> list[int]:
    return sorted(int(n) for n in os.listdir(ckdir) if n.isdigit()) if os.path.isdir(ckdir) else []


def _safetensors(model_dir) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(model_dir, f)))
    return out


@pytest.mark.slow
def test_pretrain_killed_right_after_a_save_resumes_from_it(tmp_path):
    """launch/pretrain.py --preset=tiny (checkpoint every 2 of 6 steps): SIGKILL the moment step 2 is
    committed, while step 3 builds its rehearsal memories. The rerun must resume from the newest committed
    step and end with the parameters of an uninterrupted run."""
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        TOKENIZERS_PARALLELISM="false",
        ENVACE_JAX_CACHE=str(tmp_path / "jax_cache"),
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )

    def cmd(out):
        return [
            sys.executable,
            os.path.join(ROOT, "launch", "pretrain.py"),
            "--preset=tiny",
            f"--out={out}",
            "--no_progress",
        ]

    ref, run = tmp_path / "ref", tmp_path / "run"
    r = subprocess.run(cmd(ref), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]

    proc = subprocess.Popen(cmd(run), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while 2 not in _committed(run / "checkpoints"):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    newest = _committed(run / "checkpoints")[-1]
    assert check_manifest(run / "checkpoints" / str(newest)) is None

    r = subprocess.run(cmd(run), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"pretrain: resumed at step {newest}\n" in r.stderr, r.stderr[-3000:]
    a, b = _safetensors(ref / "model"), _safetensors(run / "model")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
