"""Tests of the benchmarks/ scripts."""
