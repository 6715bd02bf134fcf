"""Tests of envace_jax.aot."""
