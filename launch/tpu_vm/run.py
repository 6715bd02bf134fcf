"""Start the same training command on every worker of a TPU VM slice (jax.distributed finds the pod).

    python launch/tpu_vm/run.py --name=envace --zone=us-east5-a --config=configs/envace_qwen3_8b.py \
        [--dry-run] -- --config.model.hf_path=/mnt/Qwen3-8B --config.data.path=gs://bucket/cm2.jsonl

Everything after ``--`` is passed to launch/train.py, except ``--dry-run``: it is this script's wherever it
stands (print the commands, run nothing). A rerun resumes from the newest good checkpoint.
"""

from __future__ import annotations

import shlex
import sys

if __package__:  # python -m launch.tpu_vm.run
    from ._common import REPO_DIR, main, parser, split_passthrough, ssh_all
else:  # python launch/tpu_vm/run.py: launch/tpu_vm/ is first on sys.path
    from _common import REPO_DIR, main, parser, split_passthrough, ssh_all


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--script", default="launch/train.py")
    p.add_argument("--log", default="train.log")
    p.add_argument("--foreground", action="store_true", help="stream output instead of nohup")
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    a = p.parse_args(argv)
    train = shlex.join([".venv/bin/python", a.script, f"--config={a.config}", *extra])
    remote = f"cd {REPO_DIR} && ENVACE_AUTO_DISTRIBUTED=1 "
    remote += train if a.foreground else f"nohup {train} > {a.log} 2>&1 &"
    return [ssh_all(a, remote)], a.dry_run


if __name__ == "__main__":
    main(commands)
