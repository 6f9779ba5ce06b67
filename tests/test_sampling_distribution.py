"""Speculative sampling must reproduce the target-alone distribution exactly.

For a fixed prompt we compute, from the target's own logits, the exact distribution
of the first two generated tokens (t1, t2) under the sampling settings; then draw
thousands of two-token samples with speculative decoding (a draft that disagrees
with the target, so rejections and residual draws happen) and compare with a
chi-square test.  A plausible-looking but wrong acceptance rule must fail it.
"""
import math

import numpy as np
import pytest

from fastspec import _core

N_SAMPLES = 4000
P_PASS = 1e-4        # the exact rule must not be rejected at this level (fixed seeds)
P_FAIL = 1e-6        # the biased rule must be rejected at this level


def shape(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Reference implementation of fastspec's distribution shaping, in numpy."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    pmax = p.max()
    if 0 < top_k < len(p):
        cut = np.sort(p)[-top_k]
        p = np.where(p >= cut, p, 0.0)
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = int(np.searchsorted(cum, top_p) + 1)
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:keep]] = True
        p = np.where(mask, p, 0.0)
    if min_p > 0:
        p = np.where(p >= min_p * pmax, p, 0.0)
    return p / p.sum()


def exact_joint(model, prompt, params):
    """{(t1, t2): probability} for the target alone."""
    joint = {}
    with _core.Context(model, n_ctx=128) as c:
        c.decode(prompt)
        p1 = shape(c.get_logits(), **params)
        for t1 in np.nonzero(p1)[0]:
            c.remove_from(len(prompt))
            c.decode([int(t1)])
            p2 = shape(c.get_logits(), **params)
            for t2 in np.nonzero(p2)[0]:
                joint[(int(t1), int(t2))] = p1[t1] * p2[t2]
    return joint


def chi_square_pvalue(observed: dict, expected_p: dict, n: int) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled."""
    stat, df, pool_o, pool_e = 0.0, -1, 0, 0.0
    for key, p in expected_p.items():
        e = p * n
        o = observed.get(key, 0)
        if e >= 5:
            stat += (o - e) ** 2 / e
            df += 1
        else:
            pool_o += o
            pool_e += e
    pool_o += sum(o for k, o in observed.items() if k not in expected_p)
    if pool_e >= 5 or pool_o > 0:
        stat += (pool_o - pool_e) ** 2 / max(pool_e, 1e-9)
        df += 1
    # Wilson-Hilferty approximation of the chi-square upper tail
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def sample_counts(target_ctx, draft_ctx, prompt, params, *, lookup=False, biased=False, seed0=0):
    counts = {}
    for i in range(N_SAMPLES):
        g = _core.Generator(target_ctx, draft_ctx, seed=seed0 + i, n_draft=1, adaptive=False,
                            max_tokens=2, lookup=lookup, _biased_rule_for_tests=biased, **params)
        g.start(prompt)
        g.run()
        toks = tuple(g.tokens)
        if len(toks) == 2:
            counts[toks] = counts.get(toks, 0) + 1
        else:
            counts[("eog",)] = counts.get(("eog",), 0) + 1
    return counts


PARAMS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=12),
    dict(temperature=1.3, top_p=0.8, min_p=0.02),
]


@pytest.fixture(scope="module")
def setup(bpe_pair, bpe_tempered_draft):
    tm, dm = _core.Model(str(bpe_pair[0])), _core.Model(str(bpe_tempered_draft))
    tc, dc = _core.Context(tm, n_ctx=128), _core.Context(dm, n_ctx=128)
    yield tm, tc, dc
    tc.close()
    dc.close()


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_speculative_sampling_matches_target(setup, params):
    tm, tc, dc = setup
    prompt = tm.tokenize("once upon a time")
    expected = exact_joint(tm, prompt, params)
    counts = sample_counts(tc, dc, prompt, params)
    p = chi_square_pvalue(counts, expected, N_SAMPLES)
    assert p > P_PASS, f"speculative samples do not follow the target distribution (p={p:.2e})"

def test_draft_is_partially_accepted(setup):
    """Both the acceptance and the residual paths get exercised by these tests."""
    tm, tc, dc = setup
    accepted = drafted = 0
    for seed in range(200):
        g = _core.Generator(tc, dc, seed=seed, n_draft=1, adaptive=False, max_tokens=2, temperature=1.0)
        g.start(tm.tokenize("once upon a time"))
        g.run()
        accepted += g.stats()["n_accepted"]
        drafted += g.stats()["n_drafted"]
    assert drafted > 150
    assert 0.2 < accepted / drafted < 0.95


def test_target_alone_sampling_matches_reference(setup):
    tm, tc, _ = setup
    params = PARAMS[1]
    prompt = tm.tokenize("the lazy dog")
    expected = exact_joint(tm, prompt, params)
    counts = sample_counts(tc, None, prompt, params, seed0=10_000)
    assert chi_square_pvalue(counts, expected, N_SAMPLES) > P_PASS


def test_lookup_sampling_matches_target(setup):
    tm, tc, _ = setup
    params = PARAMS[0]
    prompt = tm.tokenize("a b a b a b a")         # repeats: lookup proposes 'b'-like tokens
    expected = exact_joint(tm, prompt, params)
    counts = sample_counts(tc, None, prompt, params, lookup=True, seed0=20_000)
    assert chi_square_pvalue(counts, expected, N_SAMPLES) > P_PASS


def test_biased_rule_fails_the_same_test(setup):
    tm, tc, dc = setup
    params = PARAMS[0]
    prompt = tm.tokenize("once upon a time")
    expected = exact_joint(tm, prompt, params)
    counts = sample_counts(tc, dc, prompt, params, biased=True)
    p = chi_square_pvalue(counts, expected, N_SAMPLES)
    assert p < P_FAIL, f"the biased rule was not detected (p={p:.2e}); the test has no power"
