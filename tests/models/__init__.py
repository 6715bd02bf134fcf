"""Tests of envace_jax.models."""
