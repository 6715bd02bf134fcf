"""Create a TPU VM pod slice.

python launch/tpu_vm/create.py --name=envace --zone=us-east5-a --accelerator=v5p-32 [--spot] [--dry-run]
"""

from __future__ import annotations

if __package__:  # python -m launch.tpu_vm.create
    from ._common import gcloud, main, parser
else:  # python launch/tpu_vm/create.py: launch/tpu_vm/ is first on sys.path
    from _common import gcloud, main, parser


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = parser(__doc__)
    p.add_argument("--accelerator", required=True, help="e.g. v4-32, v5p-32, v6e-16")
    p.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM software version")
    p.add_argument("--spot", action="store_true", help="preemptible capacity (train.py saves on SIGTERM)")
    a = p.parse_args(argv)
    cmd = gcloud(a, "create", a.name, f"--accelerator-type={a.accelerator}", f"--version={a.version}")
    if a.spot:
        cmd.append("--spot")
    return [cmd], a.dry_run


if __name__ == "__main__":
    main(commands)
