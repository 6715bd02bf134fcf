"""Tests of envace_jax/cli/."""
