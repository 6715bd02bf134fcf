"""Fields every eval config shares (imported by configs/eval_*.py; not a config file itself).

Every field and its default is defined once, in ``envace_jax/eval/config.py`` (``EvalConfig``); the
suite files below change only what differs. List fields are comma-separated strings.
"""

import ml_collections

from envace_jax.eval.config import eval_config_dict


def base_eval_config(suite: str) -> ml_collections.ConfigDict:
    # suite: bfcl | tau2 | demo | rehearsal_sweep | fidelity; policy: oracle (replays ground truth) | model
    return eval_config_dict(suite)
