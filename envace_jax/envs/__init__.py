"""Executable tool environments.

The benchmark adapters (``envace_jax.envs.bfcl``, ``envace_jax.envs.tau2``) import their
benchmark packages lazily, so this package imports without them; using an adapter without
its package raises ImportError pointing at ``make eval-deps``.
"""

from envace_jax.envs.base import NoToolEnvironment, ToolEnvironment, ToolResult

__all__ = ["NoToolEnvironment", "ToolEnvironment", "ToolResult"]
