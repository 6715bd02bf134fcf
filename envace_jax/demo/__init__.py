"""The embedded demo (``make demo``): data + tokenizer, SFT warm start, world-rehearsal RL, real-tool
evaluation before/after with CIs, rehearsal fidelity, an equal-compute more-SFT baseline, report files."""
