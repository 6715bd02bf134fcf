"""Sampler end to end on a tiny random Qwen3: parity with transformers, log-probs, continuation,
compile counts and finish reasons."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers_models import make_tiny_hf_qwen3
from envace_jax.models import hf_io
from envace_jax.sampling import Sampler, SamplerState, SamplingParams
from tests.helpers_sampling import chi_square_z, reference_distribution

V = 256
NEW = 40


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("sampling_hf")
    hf = make_tiny_hf_qwen3(d, vocab_size=V)
    return hf, hf_io.load_hf(str(d))


@pytest.fixture(scope="module")
def sampler(models):
    # Fixed window and batch buckets keep every test in this module on the same few programs.
    return Sampler(
        models[1], cache_size=128, max_chunk=64, length_buckets=(32, 64), window_buckets=(192,), batch_buckets=(4,)
    )


def _prompts(seed: int, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, V, n).tolist() for n in lengths]


def _hf_greedy(hf, prompts, new: int):
    T = max(map(len, prompts))
    ids = np.zeros((len(prompts), T), np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, T - len(p) :] = p
        mask[b, T - len(p) :] = 1
    hf.generation_config.eos_token_id = None  # no early stop: compare all `new` tokens
    with torch.no_grad():
        out = hf.generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False, max_new_tokens=new, pad_token_id=0
        )
    return out[:, T:].numpy()


def _teacher_forced_logprobs(hf, prompt, gen, temperature):
    """log_softmax(logits / T) of the generated ids, recomputed by one forward over the sequence."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + gen])).logits[0].double().numpy()
    z = logits / (temperature if temperature > 0 else 1.0)
    logp = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    pos = np.arange(len(prompt) - 1, len(prompt) + len(gen) - 1)
    return logp[pos, gen]


def test_greedy_matches_transformers_generate(models, sampler):
    hf, _ = models
    prompts = _prompts(0, [5, 17, 9, 30])
    out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    ref = _hf_greedy(hf, prompts, NEW)
    for b in range(len(prompts)):
        assert out.tokens[b] == ref[b].tolist(), f"row {b}"
    assert out.finish_reasons == ["length"] * 4 and out.lengths == [NEW] * 4


def test_logprobs_equal_teacher_forced_recomputation(models, sampler):
    hf, _ = models
    prompts = _prompts(1, [7, 20, 12, 3])
    ps = [
        SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=NEW, seed=3),
        SamplingParams(temperature=0.6, top_k=10, max_new_tokens=NEW, seed=4),
        SamplingParams(temperature=0.0, max_new_tokens=NEW),
        SamplingParams(temperature=1.3, max_new_tokens=NEW - 9, seed=5),
    ]
    out = sampler.generate(prompts, ps)
    for b, p in enumerate(ps):
        assert out.lengths[b] == p.max_new_tokens
        ref = _teacher_forced_logprobs(hf, prompts[b], out.tokens[b], p.temperature)
        np.testing.assert_allclose(out.logprobs[b], ref, atol=1e-5, err_msg=f"row {b}")


def test_continuation_equals_fresh_prefill(models, sampler):
    prompts = _prompts(2, [6, 15, 9])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    first = sampler.generate(prompts, greedy, return_state=True)
    assert isinstance(first.state, SamplerState)
    appended = _prompts(3, [5, 11])
    fresh_prompt = _prompts(4, [8])[0]
    # Rows reordered and one dropped; a fresh prompt takes the third slot.
    rows = [2, 0, -1]
    cont = sampler.continue_(
        first.state, appended + [fresh_prompt], SamplingParams(temperature=0.0, max_new_tokens=NEW), rows=rows
    )
    full = [prompts[2] + first.tokens[2] + appended[0], prompts[0] + first.tokens[0] + appended[1], fresh_prompt]
    ref = sampler.generate(full, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    np.testing.assert_allclose(np.asarray(cont.prefill_logits), np.asarray(ref.prefill_logits), atol=1e-4)
    assert cont.tokens == ref.tokens
    np.testing.assert_allclose(np.concatenate(cont.logprobs), np.concatenate(ref.logprobs), atol=1e-4)
    with pytest.raises(ValueError, match="already consumed"):
        sampler.continue_(first.state, appended + [fresh_prompt], greedy, rows=rows)


def test_multi_turn_continuation_matches_transformers(models, sampler):
    # Three turns through continue_ (with long appends split over max_chunk=64) against HF greedy on
    # the whole conversation: the cache path must not drift across turns.
    hf, _ = models
    prompts = _prompts(5, [10, 4])
    p = SamplingParams(temperature=0.0, max_new_tokens=8)
    out = sampler.generate(prompts, p, return_state=True)
    convo = [prompts[b] + out.tokens[b] for b in range(2)]
    for turn, lens in enumerate([[3, 70], [9, 2]]):
        app = _prompts(10 + turn, lens)
        out = sampler.continue_(out.state, app, p, return_state=True)
        ref = _hf_greedy(hf, [convo[b] + app[b] for b in range(2)], 8)
        for b in range(2):
            assert out.tokens[b] == ref[b].tolist(), f"turn {turn} row {b}"
            convo[b] += app[b] + out.tokens[b]
    np.testing.assert_array_equal(out.state.total_lengths(), [len(c) for c in convo])


def test_mixed_rows_do_not_recompile(sampler):
    prompts = _prompts(6, [5, 9, 14, 3])
    sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    before = sampler.num_compilations
    rng = np.random.RandomState(7)
    for call in range(10):
        ps = [
            SamplingParams(
                temperature=float(rng.choice([0.0, 0.6, 1.0, 1.7])),
                top_p=float(rng.uniform(0.3, 1.0)),
                top_k=int(rng.choice([0, 1, 5, 100])),
                max_new_tokens=int(rng.randint(33, NEW + 1)),
                stop_token_ids=tuple(rng.randint(3, V, rng.randint(0, 4)).tolist()),
                seed=call * 10 + b,
            )
            for b in range(int(rng.randint(2, 5)))
        ]
        out = sampler.generate(_prompts(100 + call, rng.randint(1, 17, len(ps))), ps)
        assert len(out.tokens) == len(ps)
    assert sampler.num_compilations == before


def test_finish_reasons(sampler):
    prompts = _prompts(8, [6, 11, 100])
    base = sampler.generate(prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=NEW)).tokens
    stop_tok = base[0][3]
    first = base[0].index(stop_tok)
    # Row 3: 100 prompt tokens in a 128-token cache leave room for 28 generated tokens.
    ps = [
        SamplingParams(temperature=0.0, max_new_tokens=NEW, stop_token_ids=(stop_tok,)),
        SamplingParams(temperature=0.0, max_new_tokens=5),
        SamplingParams(temperature=0.0, max_new_tokens=NEW),
    ]
    out = sampler.generate(prompts, ps, return_state=True)
    assert out.finish_reasons == ["stop", "length", "cache_full"]
    assert out.tokens[0] == base[0][: first + 1] and out.tokens[1] == base[1][:5]
    assert out.lengths[2] == 28
    np.testing.assert_array_equal(out.state.total_lengths(), [6 + first + 1, 16, 128])
    # Appending more than fits ends the row at once and writes nothing; the other row goes on.
    out = sampler.continue_(
        out.state, [[5], [7, 8]], SamplingParams(temperature=0.0, max_new_tokens=NEW), rows=[2, 1], return_state=True
    )
    assert out.finish_reasons == ["cache_full", "length"] and out.lengths == [0, NEW] and out.tokens[0] == []
    np.testing.assert_array_equal(out.state.total_lengths(), [128, 16 + 2 + NEW])
    # A prompt longer than the cache is refused the same way.
    out = sampler.generate([list(range(3, 140))], SamplingParams(max_new_tokens=NEW))
    assert out.finish_reasons == ["cache_full"] and out.lengths == [0]


def test_first_token_frequencies_match_model_distribution(models):
    hf, model = models
    prompt = _prompts(9, [7])[0]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, -1].double().numpy()
    n = 3000
    s = Sampler(model, batch_buckets=(n,))
    cases = [(0.7, 0, 1.0), (1.0, 0, 0.8), (1.0, 12, 1.0)]
    ps = [
        SamplingParams(temperature=t, top_k=k, top_p=p, max_new_tokens=1, seed=11)
        for (t, k, p) in cases
        for _ in range(n // len(cases))
    ]
    out = s.generate([prompt] * n, ps)
    tok = np.asarray([t[0] for t in out.tokens]).reshape(len(cases), -1)
    for i, (t, k, p) in enumerate(cases):
        ref = reference_distribution(logits, t, k, p)
        counts = np.bincount(tok[i], minlength=V)
        assert counts[ref == 0].sum() == 0, cases[i]
        assert chi_square_z(counts, ref) < 4.0, cases[i]


def test_bad_input_is_named(sampler):
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        sampler.generate([[3], []], SamplingParams())
    with pytest.raises(ValueError, match=r"prompts\[0\] has token ids outside"):
        sampler.generate([[V + 1]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="2 SamplingParams for 1 rows"):
        sampler.generate([[3]], [SamplingParams(), SamplingParams()])


def test_fresh_row_that_does_not_fit_starts_empty(sampler):
    # Regression: a fresh prompt (rows=-1) too long for the cache used to inherit the pending token of
    # row 0 of the previous state, so its next turn began with another episode's token.
    prompts = _prompts(12, [6, 9])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    first = sampler.generate(prompts, greedy, return_state=True)
    assert (first.state.pending >= 0).all()  # row 0 holds a pending token that must not leak
    out = sampler.continue_(first.state, [[5], list(range(3, 140))], greedy, rows=[1, -1], return_state=True)
    assert out.finish_reasons == ["length", "cache_full"] and out.lengths[1] == 0
    assert out.state.pending[1] == -1
    np.testing.assert_array_equal(out.state.total_lengths(), [9 + 4 + 1 + 4, 0])


def test_compiler_options_reach_the_programs_and_keep_greedy_equal_to_transformers(models):
    hf, model = models
    opts = {"xla_cpu_enable_concurrency_optimized_scheduler": False}
    s = Sampler(
        model,
        cache_size=128,
        max_chunk=64,
        length_buckets=(32, 64),
        window_buckets=(192,),
        batch_buckets=(4,),
        compiler_options=opts,
    )
    assert s.compiler_options == opts
    prompts = _prompts(3, [7, 12, 4, 20])
    out = s.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    assert [list(t) for t in out.tokens] == _hf_greedy(hf, prompts, NEW).tolist()
    # an option XLA does not know is refused when the first program compiles, by name
    bad = Sampler(
        model,
        cache_size=128,
        max_chunk=64,
        length_buckets=(32,),
        window_buckets=(192,),
        batch_buckets=(4,),
        compiler_options={"xla_cpu_no_such_option": 1},
    )
    with pytest.raises(Exception, match="xla_cpu_no_such_option"):
        bad.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=2))
