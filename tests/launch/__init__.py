"""Tests of the launch/ scripts."""
