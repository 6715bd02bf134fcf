"""metrics.jsonl survives a process killed mid-append: the torn last line is cut by the next writer and
skipped by readers; a bad line anywhere else is still an error naming it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from envace_jax.metrics import MetricsWriter, read_jsonl


def test_writer_cuts_a_torn_tail_and_the_step_is_written_again(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(1, {"a": 1.0})
    w.write(2, {"a": 2.0})
    with open(w.path, "ab") as f:  # what a kill -9 during step 3's write leaves
        f.write(b'{"a": 3.0, "st')
    assert [r["step"] for r in read_jsonl(w.path)] == [1, 2]  # readers skip it
    w2 = MetricsWriter(str(tmp_path), tensorboard=False)  # the resumed run
    with open(w2.path, "rb") as f:
        assert f.read().endswith(b'"step": 2}\n')
    w2.write(3, {"a": 3.5})
    lines = open(w2.path).read().splitlines()
    assert [json.loads(x) for x in lines] == [{"a": 1.0, "step": 1}, {"a": 2.0, "step": 2}, {"a": 3.5, "step": 3}]


def test_a_torn_file_without_any_newline_is_emptied(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a"')
    MetricsWriter(str(tmp_path), tensorboard=False)
    assert path.read_bytes() == b""


def test_a_bad_line_in_the_middle_is_an_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        read_jsonl(str(path))


def test_a_writer_killed_mid_line_leaves_a_file_the_next_run_continues(tmp_path):
    # A real process writes long lines in a loop and is killed with SIGKILL; whatever it left, a new
    # writer makes the file whole lines again and every line parses.
    code = (
        "import sys\n"
        "from envace_jax.metrics import MetricsWriter\n"
        "w = MetricsWriter(sys.argv[1], tensorboard=False)\n"
        "k = 0\n"
        "while True:\n"
        "    k += 1\n"
        "    w.write(k, {f'key/{i}': i * 0.5 for i in range(4000)})\n"
        "    if k == 3: print('ready', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(read_jsonl(os.path.join(tmp_path, "metrics.jsonl")))
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write(10_000, {"x": 1.0})
    lines = open(w.path).read().splitlines()
    recs = [json.loads(x) for x in lines]  # every line whole
    assert recs[-1] == {"step": 10_000, "x": 1.0}
    assert len(recs) == n_before + 1 >= 4
