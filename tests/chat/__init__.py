"""Tests of envace_jax.chat."""
