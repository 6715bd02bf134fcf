"""Helpers for the eval tests: load a configs/eval_*.py file as launch/eval.py would."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str):
    path = os.path.join(ROOT, "configs", name)
    spec = importlib.util.spec_from_file_location(f"envace_eval_config_{name[:-3]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()
