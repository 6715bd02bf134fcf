"""A checkpoint step is durable once Orbax commits it: the manifest is written before the commit,
so a kill -9 at any moment never costs a committed step, and pruning never outruns the manifest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

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
