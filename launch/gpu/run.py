"""Start the same training command on every GPU host, one JAX process per host.

    python launch/gpu/run.py --hosts=gpu-0,gpu-1 --config=configs/envace_qwen3_8b.py \
        [--dry-run] -- --config.model.hf_path=/data/Qwen3-8B

Process i gets ``--coordinator=<host 0>:<port> --num_processes=<hosts> --process_id=i``; everything
after ``--`` goes to launch/train.py, except ``--dry-run`` (this script's wherever it stands: print the commands,
run nothing). ``--hosts=localhost,localhost`` runs two processes on this machine.
"""

from __future__ import annotations

import os
import shlex
import sys

if __package__:  # python -m launch.gpu.run
    from .hosts import LOCAL, REPO_DIR, host_list, main, on_host, parser, split_passthrough
else:  # python launch/gpu/run.py: launch/gpu/ is first on sys.path
    from hosts import LOCAL, REPO_DIR, host_list, main, on_host, parser, split_passthrough

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, default=8476)
    p.add_argument("--script", default="launch/train.py")
    p.add_argument("--log_prefix", default="train")
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    a = p.parse_args(argv)
    hosts = host_list(a.hosts)
    coord = f"{'127.0.0.1' if hosts[0] in LOCAL else hosts[0]}:{a.port}"
    out = []
    for i, host in enumerate(hosts):
        repo = ROOT if host in LOCAL else REPO_DIR
        train = shlex.join(
            [
                ".venv/bin/python",
                a.script,
                f"--config={a.config}",
                f"--coordinator={coord}",
                f"--num_processes={len(hosts)}",
                f"--process_id={i}",
                *extra,
            ]
        )
        out.append(on_host(host, f"cd {repo} && nohup {train} > {a.log_prefix}_{i}.log 2>&1 &"))
    return out, a.dry_run


if __name__ == "__main__":
    main(commands)
