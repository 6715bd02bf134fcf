"""Create GPU VMs (one per host) on Google Cloud.

    python launch/gpu/create.py --name=envace --zone=us-central1-a --count=2 \
        [--machine_type=a3-highgpu-8g --accelerator=nvidia-h100-80gb --gpus=8] [--spot] [--dry-run]
"""

from __future__ import annotations

import argparse

# main: the print-then-run helper shared by the cluster scripts
if __package__:  # python -m launch.gpu.create
    from .hosts import main
else:  # python launch/gpu/create.py: launch/gpu/ is first on sys.path
    from hosts import main


def commands(argv=None) -> tuple[list[list[str]], bool]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default=None)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--machine_type", default="a3-highgpu-8g")
    p.add_argument("--accelerator", default="nvidia-h100-80gb")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--image_family", default="common-cu124-ubuntu-2204")
    p.add_argument("--image_project", default="deeplearning-platform-release")
    p.add_argument("--spot", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on failure (or ENVACE_DEBUG=1)")
    a = p.parse_args(argv)
    if a.count < 1:
        raise SystemExit("--count must be >= 1")
    out = []
    for i in range(a.count):
        cmd = [
            "gcloud",
            "compute",
            "instances",
            "create",
            f"{a.name}-{i}",
            f"--zone={a.zone}",
            f"--machine-type={a.machine_type}",
            f"--accelerator=type={a.accelerator},count={a.gpus}",
            f"--image-family={a.image_family}",
            f"--image-project={a.image_project}",
            "--maintenance-policy=TERMINATE",
            "--metadata=install-nvidia-driver=True",
        ]
        if a.project:
            cmd.append(f"--project={a.project}")
        if a.spot:
            cmd.append("--provisioning-model=SPOT")
        out.append(cmd)
    return out, a.dry_run


if __name__ == "__main__":
    main(commands)
