"""Copy this checkout to every GPU host and install it with the CUDA jaxlib.

python launch/gpu/setup.py --hosts=gpu-0,gpu-1 [--dry-run]
"""

from __future__ import annotations

import os

if __package__:  # python -m launch.gpu.setup
    from .hosts import LOCAL, REPO_DIR, host_list, main, on_host, parser
else:  # python launch/gpu/setup.py: launch/gpu/ is first on sys.path
    from hosts import LOCAL, REPO_DIR, host_list, main, on_host, parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--source", default=ROOT)
    p.add_argument("--python", default="python3.11")
    a = p.parse_args(argv)
    out = []
    for host in host_list(a.hosts):
        if host not in LOCAL:
            out.append(
                [
                    "rsync",
                    "-az",
                    "--delete",
                    "--exclude=.venv",
                    "--exclude=runs",
                    "--exclude=.git",
                    a.source.rstrip("/") + "/",
                    f"{host}:{REPO_DIR}/",
                ]
            )
        repo = a.source if host in LOCAL else REPO_DIR
        out.append(on_host(host, f"cd {repo} && {a.python} -m venv .venv && .venv/bin/pip install -q -e '.[gpu]'"))
    return out, a.dry_run


if __name__ == "__main__":
    main(commands)
