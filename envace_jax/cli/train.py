"""Train EnvACE from an ml-collections config file.

    python launch/train.py --config=configs/demo_cpu.py --config.run_dir=/tmp/demo
    python launch/train.py --config=configs/envace_qwen3_8b.py --config.model.hf_path=... --config.data.path=...

Multi-process (one machine or many): every process runs the same command plus
``--coordinator=host:port --num_processes=N --process_id=i`` (or the JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID environment variables). A rerun of the same command resumes from
the newest good checkpoint in ``<run_dir>/checkpoints``; SIGTERM saves a checkpoint and exits 0.

A failure you can fix (a config error or unknown field, a missing file, a full disk, a corrupt weights file,
a checkpoint of another shape) ends in two lines and exit 2 (bad input) or 1; ``--verbose`` or
``ENVACE_DEBUG=1`` shows the traceback (envace_jax/cli/entrypoint.py, shared by every launch/ command). A run whose
judge keeps failing (``judge.outage_share`` of a step's episodes for ``judge.outage_steps`` steps) stops with
one line and exit 3; a rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from envace_jax.cli.entrypoint import run

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file", lock_config=True)
_COORD = flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-process runs)")
_NPROC = flags.DEFINE_integer("num_processes", None, "number of JAX processes")
_PID = flags.DEFINE_integer("process_id", None, "this process's index")
_DUMP = flags.DEFINE_string(
    "dump_params",
    None,
    "write the final parameters to this .npz (tests, debugging); "
    '"{process}" in it is replaced by the process index and every process writes',
)


def main(argv):
    del argv
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every file it writes at INFO
    from envace_jax.rl import train as rl_train
    from envace_jax.config import load_config

    if _CONFIG.value is None:
        raise app.UsageError("--config=configs/<name>.py is required")
    cfg = load_config(_CONFIG.value)  # a ConfigError exits 2 with one line (entrypoint.guard)
    from envace_jax.rl.judge_outage import JudgeOutageError

    rl_train.init_distributed(_COORD.value, _NPROC.value, _PID.value)
    try:
        summary = rl_train.train(cfg, dump_params=_DUMP.value)
    except JudgeOutageError as e:
        print(str(e), file=sys.stderr, flush=True)
        sys.exit(3)
    print(f"done: {summary}", file=sys.stderr, flush=True)


def cli() -> None:
    """``envace-train`` and ``launch/train.py``."""
    run(main)
