"""Start the same training command on every worker of a TPU VM slice (jax.distributed finds the pod).

    python launch/tpu_vm/run.py --name=envace --zone=us-east5-a --config=configs/envace_qwen3_8b.py \
        -- --config.model.hf_path=/mnt/Qwen3-8B --config.data.path=gs://bucket/cm2.jsonl [--dry-run]

Everything after ``--`` is passed to launch/train.py. A rerun resumes from the newest good checkpoint.
"""

from __future__ import annotations

import shlex
import sys

from _common import REPO_DIR, execute, parser, ssh_all


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--script", default="launch/train.py")
    p.add_argument("--log", default="train.log")
    p.add_argument("--foreground", action="store_true", help="stream output instead of nohup")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    a = p.parse_args(argv)
    train = shlex.join([".venv/bin/python", a.script, f"--config={a.config}", *extra])
    remote = f"cd {REPO_DIR} && ENVACE_AUTO_DISTRIBUTED=1 "
    remote += train if a.foreground else f"nohup {train} > {a.log} 2>&1 &"
    return [ssh_all(a, remote)], a.dry_run


if __name__ == "__main__":
    cmds, dry = commands()
    sys.exit(execute(cmds, dry))
