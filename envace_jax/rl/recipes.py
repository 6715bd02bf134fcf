"""The RL objectives by name: which ``loss`` and ``rl`` knobs each one sets, on top of the run's own.

====================  ==========================================================================================
``grpo``              the reference's role-wise GRPO (nothing changed: clip 0.2/0.2, dual clip 3, per-row mean)
``gspo``              GSPO (Zheng et al. 2025, arXiv 2507.18071): the sequence ratio (``loss.ratio_level``),
                      the paper's clips 3e-4 / 4e-4, no dual clip
``dapo``              DAPO (Yu et al. 2025, arXiv 2503.14476): clip-higher 0.2 / 0.28, token-level loss
                      (``token_mean``), dynamic sampling, the soft overlong penalty with a buffer of a fifth of
                      the generation budget (the paper's 4096 of 20480)
``dr_grpo``           Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): no std division of advantages (already the
                      default), each row's token sum divided by the constant generation budget
====================  ==========================================================================================

Each recipe is a pair of field overrides, applied by ``apply_to_config`` (a run's ``ConfigDict``: ``configs/``
and ``--config.*``) or read by code that builds ``LossConfig`` / ``RLSection`` itself (the demo). Knobs a recipe
does not name keep the run's values; a recipe's knobs can still be overridden after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ALGORITHMS = ("grpo", "gspo", "dapo", "dr_grpo")


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    loss: dict[str, Any]
    rl: dict[str, Any]


def recipe(name: str, *budgets: int) -> Recipe:
    """The overrides of algorithm ``name`` for the roles' generation budgets ``budgets`` (``max_new_tokens`` of
    each role, in tokens): DAPO's overlong buffer is a fifth of the shortest (it must fit in every budget),
    Dr. GRPO's constant the longest."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}: one of {ALGORITHMS}")
    if not budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in budgets):
        raise ValueError(f"recipe {name!r}: the generation budgets must be ints >= 1, got {budgets!r}")
    if name == "grpo":
        return Recipe(name, {}, {})
    if name == "gspo":
        return Recipe(name, dict(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, dual_clip=None), {})
    if name == "dapo":
        return Recipe(
            name,
            dict(clip_low=0.2, clip_high=0.28, agg="token_mean", kl_coef=0.0),
            dict(dynamic_sampling=True, overlong_buffer=max(1, min(budgets) // 5), overlong_penalty=1.0),
        )
    return Recipe(name, dict(agg="seq_mean_token_sum_norm", agg_norm=float(max(budgets))), dict(normalize_std=False))


def apply_to_config(config, name: str):
    """Sets algorithm ``name``'s knobs on a run's ``ConfigDict`` (``config.loss``, ``config.rl``), with the lengths
    taken from ``config.rollout``'s role budgets. Returns ``config``."""
    r = recipe(name, int(config.rollout.act.max_new_tokens), int(config.rollout.rehearse.max_new_tokens))
    for section, values in (("loss", r.loss), ("rl", r.rl)):
        for key, value in values.items():
            setattr(getattr(config, section), key, value)
    return config
