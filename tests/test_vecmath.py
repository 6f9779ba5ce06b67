"""The vector loops that shape sampling distributions (src/fastspec/_vecmath.h).

Every loop this machine can run (the scalar one always; AVX2 and AVX-512 where the CPU has
them; NEON is checked under emulation in test_arm_emulated.py) must give the weights
exp(logit / T - max) to float precision, drop exactly those below the floor, and through
shape_probs give the distribution tests/test_sampling_distribution.py's numpy reference
gives, filters and all.  Tolerances are float32's, not one CPU's rounding.
"""
import numpy as np
import pytest

from fastspec import _core
from test_sampling_distribution import shape

FLOOR = 30.0          # _sampling.pxi's EXP_FLOOR
PATHS = _core._vec_paths()[1]


@pytest.fixture(params=PATHS)
def path(request):
    best = _core._vec_paths()[0]
    _core._set_vec_path(request.param)
    yield request.param
    _core._set_vec_path(best)


def llm_like_logits(n, seed):
    """A vocabulary's logits as a language model gives them: a broad mass well below a few
    likely tokens."""
    rng = np.random.default_rng(seed)
    x = rng.normal(-5.0, 2.8, n).astype(np.float32)
    top = rng.choice(n, size=min(n, 12), replace=False)
    x[top] = rng.uniform(8.0, 16.0, len(top)).astype(np.float32)
    return x


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 1000, 151_936])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_weights_match_numpy(path, n, temperature):
    x = llm_like_logits(n, n)
    w, total = _core._exp_weights(x, temperature)
    inv_t = np.float32(1.0) / np.float32(temperature)
    m = np.float32(x.max() * inv_t)
    v = x * inv_t - m                                           # the exponents, as the loops form them
    ref = np.where(v > -FLOOR, np.exp(v.astype(np.float64)), 0.0)
    # (a compiler may fuse the multiply and subtract: the exponent then differs by a
    # rounding of m, which moves a weight by that much relative)
    slack = 2 * float(np.spacing(abs(m)))
    clear = np.abs(v + FLOOR) > 1e-3
    assert np.all(((w > 0) == (v > -FLOOR))[clear])             # the floor
    assert np.all(np.abs(w - ref) <= ref * (4e-7 + slack))
    assert w.max() == pytest.approx(1.0, abs=1e-6 + slack)
    assert total == pytest.approx(ref.sum(), rel=1e-6 + slack)


def test_weights_of_nan_and_infinite_logits(path):
    x = llm_like_logits(100, 3)
    x[[5, 50]] = np.nan
    x[[7, 99]] = -np.inf
    w, total = _core._exp_weights(x)
    assert np.all(np.isfinite(w)) and w[[5, 50, 7, 99]].tolist() == [0.0] * 4
    assert total == pytest.approx(float(w.astype(np.float64).sum()), rel=1e-6)


PARAMS = [
    dict(temperature=0.7),
    dict(temperature=1.0, top_p=0.95),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),      # llama.cpp's defaults
    dict(temperature=0.7, top_k=12),
    dict(temperature=1.3, top_p=0.8, min_p=0.02),
    dict(temperature=1.0, top_k=100_000),                          # more than weigh above the floor
    dict(temperature=1.0, min_p=0.5),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("n", [33, 151_936])
def test_shape_probs_matches_the_reference(path, params, n):
    for seed in range(3):
        x = llm_like_logits(n, 100 + seed)
        p = _core._shape_probs(x, **params)
        ref = shape(x, **params)
        assert p.dtype == np.float32 and float(p.astype(np.float64).sum()) == pytest.approx(1.0, abs=1e-5)
        assert np.abs(p - ref).max() < 1e-6
        # the same tokens kept (those the floor drops weigh under 1e-13 in the reference)
        assert not np.any((p > 0) & (ref == 0))
        assert np.all(p[ref > 1e-12] > 0)


def test_shape_probs_without_finite_logits(path):
    x = np.full(50, -np.inf, dtype=np.float32)
    x[20] = np.nan
    p = _core._shape_probs(x, 0.8, top_p=0.9)
    assert np.all(np.isfinite(p)) and p.sum() == 1.0 and np.count_nonzero(p) == 1


def greedy_reference(x):
    """(the first index of the largest, how far the runner-up is below it) by numpy, NaNs
    passed over."""
    clean = np.where(np.isnan(x), -np.inf, x)
    top2 = np.sort(clean)[-2:]
    return int(np.argmax(clean)), (float(top2[1] - top2[0]) if len(x) > 1 else 0.0)


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 100, 151_936])
def test_greedy_pick_matches_numpy(path, n):
    """argmax and argmax_gap (fs_top2, then fs_find) on every path: lengths around each
    path's lanes and unrolling, ties (the first wins, the gap is 0), NaNs (passed over),
    -inf, and the maximum in a row's tail."""
    rng = np.random.default_rng(n)
    for trial in range(16):
        x = llm_like_logits(n, 1000 * n + trial) if trial % 2 else rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 1 and n > 2:
            x[rng.integers(n)] = x.max()                   # a tie for the maximum
        if trial % 4 == 3 and n > 2:
            x[rng.choice(n, size=2, replace=False)] = x.max() + 1.0   # two equal maxima
        if trial % 3 == 2 and n > 3:
            x[rng.integers(n, size=3)] = np.nan
        if trial % 5 == 4 and n > 3:
            x[rng.integers(n, size=3)] = -np.inf
        if trial == 6:
            x[-1] = np.nanmax(x) + 2.0                    # in the lanes past the last full vector
        a, b, gap = _core._argmax_f32(x)
        want, want_gap = greedy_reference(x)
        assert a == b == want
        assert gap == want_gap


def test_greedy_pick_without_finite_logits(path):
    x = np.full(40, np.nan, dtype=np.float32)
    assert _core._argmax_f32(x) == (0, 0, 0.0)
    x[17] = -np.inf
    assert _core._argmax_f32(x)[:2] == (0, 0)
    x[30] = 3.0
    assert _core._argmax_f32(x)[:2] == (30, 30)


def test_paths_can_be_named_and_refused():
    best, can = _core._vec_paths()
    assert "scalar" in can and best in can
    with pytest.raises(ValueError):
        _core._set_vec_path("sse9")
    for name in {"scalar", "neon", "avx2", "avx512"} - set(can):
        with pytest.raises(ValueError, match="cannot run"):
            _core._set_vec_path(name)
    assert _core._vec_paths()[0] == best
