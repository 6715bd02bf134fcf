"""Tests of envace_jax.sampling."""
