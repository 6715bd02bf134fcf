"""Benchmark evaluation from an ml-collections config file.

    python launch/eval.py --config=configs/eval_bfcl.py --config.output_dir=/tmp/bfcl
    python launch/eval.py --config=configs/eval_tau2.py --config.policy=model --config.model.model_path=... \
        --config.output_dir=/tmp/tau2
    python launch/eval.py --config=configs/eval_rehearsal_sweep.py --config.model.model_path=... \
        --config.output_dir=/tmp/sweep
    python launch/eval.py --config=configs/eval_fidelity.py --config.fidelity.rehearser=constant \
        --config.output_dir=/tmp/fidelity

Writes DIR/results.json (per category: count, valid, accuracy, its 95% interval, failure counts) and
DIR/results.md (the fidelity suite also writes DIR/fidelity.md and DIR/fidelity.json: the split by kind of
call and the hallucination rates). Benchmark packages come from `make eval-deps`.
"""

from __future__ import annotations

import os
import sys

from absl import app
from ml_collections import config_flags

from envace_jax.cli.entrypoint import run

_CONFIG = config_flags.DEFINE_config_file("config", None, "eval config file (configs/eval_*.py)", lock_config=True)


def main(argv):
    del argv
    if _CONFIG.value is None:
        raise app.UsageError("--config=configs/eval_<suite>.py is required")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from envace_jax.eval.results import to_markdown
    from envace_jax.eval.runner import run_eval

    res = run_eval(_CONFIG.value)  # bad settings (ValueError) and missing packages exit 2 (entrypoint.guard)
    print(to_markdown(res), flush=True)
    print(f"wrote {os.path.join(_CONFIG.value.output_dir, 'results.json')}", file=sys.stderr)


def cli() -> None:
    """``envace-eval`` and ``launch/eval.py``."""
    run(main)
