"""Statistical tests of the sort-free sampler kernel against a full-sort reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envace_jax.sampling.ops import greedy_tokens, inverse_cdf, sample_tokens
from tests.helpers_sampling import chi_square_z, reference_distribution

V = 256
ROWS = 6000
# (name, logits scale, temperature, top_k, top_p). With k_max=8 below these exercise every path:
# candidates (top_k <= 8, nucleus inside 8), whole-vocabulary rejection, the k-th-largest bisection
# (top_k > 8) and the exact-nucleus fallback (tiny top_p on a flat distribution).
CASES = [
    ("temperature", 1.0, 0.7, 0, 1.0),
    ("top_k_candidates", 1.0, 1.0, 5, 1.0),
    ("top_p_candidates", 3.0, 1.0, 0, 0.6),
    ("top_p_full_vocab", 1.0, 1.3, 0, 0.9),
    ("top_k_bisection_top_p", 1.0, 0.9, 40, 0.7),
    ("top_p_exact_fallback", 0.05, 1.0, 0, 0.1),
]


@pytest.fixture(scope="module")
def drawn():
    rng = np.random.RandomState(0)
    base = {name: rng.randn(V).astype(np.float32) * scale for name, scale, *_ in CASES}
    logits = np.concatenate([np.tile(base[c[0]], (ROWS, 1)) for c in CASES])
    n = len(logits)
    temp = np.repeat([c[2] for c in CASES], ROWS).astype(np.float32)
    top_k = np.repeat([c[3] for c in CASES], ROWS).astype(np.int32)
    top_p = np.repeat([c[4] for c in CASES], ROWS).astype(np.float32)
    keys = np.stack([np.full(n, 7, np.uint32), np.arange(n, dtype=np.uint32)], axis=1)
    fn = jax.jit(lambda *a: sample_tokens(*a, k_max=8))
    tok, lp = fn(
        jnp.asarray(logits),
        jnp.asarray(keys),
        jnp.zeros(n, jnp.int32),
        jnp.asarray(temp),
        jnp.asarray(top_p),
        jnp.asarray(top_k),
    )
    return base, np.asarray(tok).reshape(len(CASES), ROWS), np.asarray(lp).reshape(len(CASES), ROWS)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_frequencies_match_sorted_reference(drawn, case):
    name, _, temp, top_k, top_p = case
    base, tok, _ = drawn
    i = [c[0] for c in CASES].index(name)
    ref = reference_distribution(base[name], temp, top_k, top_p)
    counts = np.bincount(tok[i], minlength=V)
    outside = counts[ref == 0].sum()
    assert outside == 0, f"{name}: {outside} draws outside the kept set"
    assert chi_square_z(counts, ref) < 4.0, name


def test_cases_cover_both_paths(drawn):
    # The fast path must really be skipped for the whole-vocabulary cases: their kept sets are
    # larger than the 8 candidates.
    base, _, _ = drawn
    sizes = {c[0]: int((reference_distribution(base[c[0]], c[2], c[3], c[4]) > 0).sum()) for c in CASES}
    assert sizes["top_k_candidates"] <= 8 and sizes["top_p_candidates"] <= 8
    assert sizes["top_p_full_vocab"] > 8 and sizes["top_k_bisection_top_p"] > 8
    assert sizes["top_p_exact_fallback"] > 8


def test_logprob_is_full_tempered_distribution(drawn):
    base, tok, lp = drawn
    for i, (name, _, temp, _, _) in enumerate(CASES):
        z = base[name].astype(np.float64) / temp
        full = z - z.max() - np.log(np.exp(z - z.max()).sum())
        np.testing.assert_allclose(lp[i], full[tok[i]], atol=2e-5, err_msg=name)


def test_greedy_rows_ignore_truncation_and_use_unit_temperature():
    rng = np.random.RandomState(1)
    logits = rng.randn(3, V).astype(np.float32)
    logits[2, [10, 20]] = 9.0  # a tie: argmax picks the first index
    tok, lp = jax.jit(sample_tokens)(
        jnp.asarray(logits),
        jnp.zeros((3, 2), jnp.uint32),
        jnp.zeros(3, jnp.int32),
        jnp.zeros(3),
        jnp.asarray([0.1, 1.0, 0.5]),
        jnp.asarray([1, 0, 3]),
    )
    np.testing.assert_array_equal(np.asarray(tok), [logits[0].argmax(), logits[1].argmax(), 10])
    ref = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(lp), ref[np.arange(3), np.asarray(tok)], atol=1e-5)


def test_inverse_cdf_never_picks_zero_weight():
    q = np.zeros((4, 600), np.float32)
    q[0, [3, 599]] = [1.0, 1.0]
    q[1, 300] = 2.0
    q[2, 256:512] = 1.0
    q[3, :] = 1.0
    r = np.asarray([1.999999, 0.0, 255.99, 599.5], np.float32)
    idx = np.asarray(jax.jit(inverse_cdf)(jnp.asarray(q), jnp.asarray(r)))
    np.testing.assert_array_equal(idx, [599, 300, 511, 599])
    assert (q[np.arange(4), idx] > 0).all()


def test_mixed_batch_greedy_rows_argmax_and_sampled_rows_unchanged():
    # The all-greedy shortcut (a lax.cond) must not touch a batch with any sampled row: its sampled
    # rows draw exactly what they draw in an all-sampled batch, its greedy rows take the argmax.
    rng = np.random.RandomState(2)
    logits = jnp.asarray(rng.randn(4, V).astype(np.float32) * 3)
    keys = jnp.asarray(rng.randint(0, 2**31, (4, 2)), jnp.uint32)
    ctr = jnp.arange(4, dtype=jnp.int32)
    top_p, top_k = jnp.asarray([1.0, 0.9, 1.0, 0.8]), jnp.asarray([0, 0, 5, 0])
    f = jax.jit(sample_tokens)
    mixed, _ = f(logits, keys, ctr, jnp.asarray([0.0, 1.0, 0.0, 0.7]), top_p, top_k)
    sampled, _ = f(logits, keys, ctr, jnp.asarray([0.5, 1.0, 0.5, 0.7]), top_p, top_k)
    mixed, sampled = np.asarray(mixed), np.asarray(sampled)
    np.testing.assert_array_equal(mixed[[0, 2]], np.asarray(logits)[[0, 2]].argmax(-1))
    np.testing.assert_array_equal(mixed[[1, 3]], sampled[[1, 3]])


@pytest.mark.parametrize("vocab", [384, 300, 64])
def test_greedy_tokens_take_the_first_maximum_across_blocks(vocab):
    # 128-entry blocks: 384 is three whole blocks, 300 and 64 end in a padded one.
    rng = np.random.RandomState(3)
    logits = rng.randn(5, vocab).astype(np.float32)
    logits[0, vocab - 1] = 50.0  # the maximum in the last entry (the padded block when there is one)
    logits[1, [5, vocab - 2]] = 50.0  # a tie across blocks: the first
    logits[2, [vocab // 2, vocab // 2 + 1, vocab - 3]] = 50.0  # a tie inside a block and with a later one
    logits[3] = 1.0  # all equal: index 0
    tok, lp = jax.jit(greedy_tokens)(jnp.asarray(logits))
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))  # numpy, like torch, takes the first
    ref = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(lp), ref[np.arange(5), logits.argmax(-1)], atol=1e-5)
