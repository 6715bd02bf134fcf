"""Tests of envace_jax.envs."""
