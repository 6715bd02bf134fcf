"""Tests of envace_jax.demo."""
