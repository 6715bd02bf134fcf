"""Tests of envace_jax.data."""
