"""Tests of envace_jax.rl."""
