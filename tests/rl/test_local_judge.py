"""The ``local`` judge kind on a real (tiny, random) Qwen3-MoE checkpoint: the judge prompt goes through the
checkpoint's chat template and our sampler, whose completion equals transformers' generate on the same prompt; a
completion that is no verdict is asked again and then counts as a failure, as the HTTP judge's does."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from envace_jax.config import LocalJudgeConfig, load_config
from envace_jax.models import hf_io, qwen3
from envace_jax.models.qwen3_moe_config import Qwen3MoeConfig
from envace_jax.rl import train as rl_train
from envace_jax.rl.judges import LocalModelJudge
from envace_jax.rl.local_judge import build_local_judge
from tests import helpers_loop as h
from tests.rl.test_judges_local import request


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("moe_judge"))
    cfg = Qwen3MoeConfig.tiny(512, num_layers=2, num_experts=4, mlp_only_layers=(0,))
    hf_io.save_hf(qwen3.init_model(cfg, seed=3), d)
    for f in os.listdir(h.tokenizer_dir()):
        shutil.copy(os.path.join(h.tokenizer_dir(), f), d)
    return d


def _cfg(d, **kw):
    return LocalJudgeConfig(hf_path=d, dtype="float32", temperature=0.0, max_tokens=12, max_model_len=4096, **kw)


def test_completions_equal_transformers_generate_on_the_rendered_prompt(judge_dir):
    from transformers import AutoModelForCausalLM

    judge = build_local_judge(_cfg(judge_dir), sampler_kwargs={"max_chunk": 256})
    texts = judge.generate_texts
    msgs = [[{"role": "user", "content": request(w, "a reply", i).prompt()}] for i, w in enumerate(("alpha", "beta"))]
    out = texts(msgs)
    hf = AutoModelForCausalLM.from_pretrained(judge_dir, torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    hf.generation_config.eos_token_id = list(texts.renderer.stop_token_ids)
    for m, text in zip(msgs, out):
        ids = texts.renderer.render_messages(m, add_generation_prompt=True)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, pad_token_id=0)[0, len(ids) :]
        assert text == texts.renderer.decode(ref.tolist())
    assert not texts.sampler.record_routing  # the judge is never trained: nothing recorded


def test_a_random_judge_model_is_asked_again_then_fails(judge_dir):
    judge = build_local_judge(_cfg(judge_dir, max_attempts=2), sampler_kwargs={"max_chunk": 256})
    verdicts = judge.judge_many([request("alpha", "a reply", 0)])
    v = verdicts[0]  # a random model writes no verdict JSON
    assert v.api_failed and not v.passed and v.attempts == 2 and "no JSON" in v.raw
    assert judge.generate_texts._calls == 2


def test_run_config_builds_it_and_refuses_what_it_cannot_read(judge_dir):
    cfg = load_config({"judge": {"kind": "rule_then_local", "local": {"hf_path": judge_dir, "dtype": "float32"}}})
    built = rl_train.build_judge(cfg)
    assert isinstance(built.judge.fallback, LocalModelJudge)
    with pytest.raises(ValueError, match="never read"):
        load_config({"judge": {"kind": "rule", "local": {"hf_path": judge_dir}}})
    with pytest.raises(ValueError, match="hf_path"):
        rl_train.build_judge(load_config({"judge": {"kind": "local"}}))
