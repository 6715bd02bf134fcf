"""Split prefill (``Sampler(split_prefill=True)``): a chunk whose rows write very different lengths runs as
sub-batch calls on the rows that write. The tokens and log-probs must be those of the one-call prefill."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from envace_jax.models import qwen3
from envace_jax.sampling import Sampler, SamplingParams


@pytest.fixture(scope="module")
def model():
    return qwen3.Qwen3(qwen3.Qwen3Config.tiny(512), rngs=nnx.Rngs(3))


def _prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 512, size=n).tolist() for n in lengths]


def _rolling_calls(sampler, params):
    """A rolling batch's pattern: six rows generate; then they continue (one pending token each: they
    finished, so their last token was not fed) while two fresh long prompts join, and one more call
    continues everything with short appended suffixes."""
    first = sampler.generate(_prompts([3, 5, 90, 4, 7, 120]), params, return_state=True)
    second = sampler.continue_(
        first.state, [[]] * 6 + _prompts([150, 70], seed=1), params, rows=[0, 1, 2, 3, 4, 5, -1, -1], return_state=True
    )
    third = sampler.continue_(second.state, _prompts([2, 3, 1, 2, 4, 1, 2, 3], seed=2), params)
    return [first, second, third]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_split_prefill_gives_the_one_call_tokens_with_fewer_slots(model, temperature):
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=11)
    runs = {}
    for split in (False, True):
        s = Sampler(model, cache_size=512, split_prefill=split, split_min_rows=1)
        runs[split] = (_rolling_calls(s, params), s.stats.prefill_slots, s.stats.prefill_tokens)
    (whole, slots_whole, tokens_whole), (split, slots_split, tokens_split) = runs[False], runs[True]
    for a, b in zip(whole, split):
        assert a.tokens == b.tokens and a.finish_reasons == b.finish_reasons
        for x, y in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(a.prefill_logits), np.asarray(b.prefill_logits), atol=1e-5)
    assert tokens_whole == tokens_split
    assert slots_split < 0.6 * slots_whole, (slots_split, slots_whole)


def test_split_prefill_over_several_chunks(model):
    # max_chunk 64: the 200-token prompt is written in four chunks while the other rows write one token
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    out = {}
    for split in (False, True):
        s = Sampler(model, cache_size=512, max_chunk=64, split_prefill=split, split_min_rows=1)
        first = s.generate(_prompts([4, 6, 5, 3, 9, 2, 7]), params, return_state=True)
        slots = s.stats.prefill_slots
        second = s.continue_(first.state, [[]] * 7 + _prompts([200], seed=4), params, rows=list(range(7)) + [-1])
        out[split] = (first.tokens, second.tokens, second.logprobs, s.stats.prefill_slots - slots)
    assert out[False][:2] == out[True][:2]
    # chunks of 64, 64, 64 and 8 tokens; split: the seven one-token rows once (8 x 16), then the prompt alone
    assert out[True][3] == 8 * 16 + 3 * 64 + 16 and out[False][3] == 3 * 8 * 64 + 8 * 16
    for x, y in zip(out[False][2], out[True][2]):
        np.testing.assert_allclose(x, y, atol=1e-5)
