"""Fields every eval config shares (imported by configs/eval_*.py; not a config file itself)."""

import ml_collections


def base_eval_config(suite: str) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.suite = suite                  # bfcl | tau2 | demo | rehearsal_sweep | fidelity
    c.policy = "oracle"              # oracle (replays ground truth) | model
    c.output_dir = ""                # results.json, results.md, <category>.jsonl go here
    c.seed = 0
    c.write_entries = True           # per-entry <category>.jsonl files

    c.model = ml_collections.ConfigDict()
    c.model.model_path = ""          # local Qwen3 HF checkpoint directory (policy=model)
    c.model.tokenizer_path = ""      # default: model_path (random_tiny: a demo tokenizer built into output_dir)
    c.model.random_tiny = False      # CI: a random 2-layer Qwen3 + the offline demo tokenizer
    c.model.dtype = "float32"
    # random_tiny sizes and its demo tokenizer (corpus "demo" or "demo+bfcl")
    c.model.tiny = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, vocab_size=480,
                        tokenizer_corpus="demo")

    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 0.0     # greedy
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.max_new_tokens = 1024
    c.max_model_len = 32768          # prompt + generated tokens per conversation
    c.enable_thinking = True

    c.rehearsal = ml_collections.ConfigDict()   # test-time private rehearsal (demo suite)
    c.rehearsal.n = 0
    c.rehearsal.mode = "parallel"    # parallel | sequential
    c.rehearsal.memory = "template"  # template | model
    c.rehearsal.max_tokens_per_rehearsal = 2048
    c.rehearsal.max_memory_chars = 1500
    c.rehearsal.sweep_ns = "0,1,2,4"
    c.rehearsal.sweep_modes = "parallel,sequential"
    return c
