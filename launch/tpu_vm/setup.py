"""Copy this checkout to every worker of a TPU VM slice and install it with the TPU jaxlib.

python launch/tpu_vm/setup.py --name=envace --zone=us-east5-a [--source=.] [--dry-run]
"""

from __future__ import annotations

import os

if __package__:  # python -m launch.tpu_vm.setup
    from ._common import REPO_DIR, gcloud, main, parser, ssh_all
else:  # python launch/tpu_vm/setup.py: launch/tpu_vm/ is first on sys.path
    from _common import REPO_DIR, gcloud, main, parser, ssh_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--source", default=ROOT, help="local checkout to copy")
    p.add_argument("--python", default="python3.11")
    a = p.parse_args(argv)
    archive = "/tmp/envace-jax.tar.gz"
    pack = ["tar", "--exclude=.venv", "--exclude=runs", "--exclude=.git", "-czf", archive, "-C", a.source, "."]
    copy = gcloud(a, "scp", archive, f"{a.name}:/tmp/envace-jax.tar.gz", "--worker=all")
    install = ssh_all(
        a,
        f"mkdir -p {REPO_DIR} && tar -xzf /tmp/envace-jax.tar.gz -C {REPO_DIR} && cd {REPO_DIR} "
        f"&& {a.python} -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'",
    )
    return [pack, copy, install], a.dry_run


if __name__ == "__main__":
    main(commands)
