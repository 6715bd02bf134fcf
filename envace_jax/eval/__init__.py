"""Evaluation: benchmark harnesses and the rehearsal-fidelity metric (``fidelity``)."""
