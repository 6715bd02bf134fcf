"""Tests of envace_jax.eval."""
