"""fastspec._core.Context: batched decode, logits, KV-cache tail removal, bad input."""
import numpy as np
import pytest

from fastspec import _core
from greedy_check import CPU_LAYERS, TINY_NEAR_TIE


@pytest.fixture(scope="module")
def model(bpe_pair):
    m = _core.Model(str(bpe_pair[0]), n_gpu_layers=CPU_LAYERS)
    yield m
    m.close()


@pytest.fixture
def ctx(model):
    c = _core.Context(model, n_ctx=256, n_threads=2)
    yield c
    c.close()


def _tokens(model, text="the quick brown fox jumps over the lazy dog"):
    return model.tokenize(text, add_special=False)


def test_batch_equals_single_decodes(model, ctx):
    toks = _tokens(model)
    ctx.decode(toks, logits="all")
    batch = [ctx.get_logits(i) for i in range(len(toks))]
    ctx.clear()
    single = []
    for t in toks:
        ctx.decode([t])
        single.append(ctx.get_logits())
    assert ctx.n_past == len(toks)
    # ggml's batched kernels sum in another order than single-token ones, so the
    # logits agree to a kernel drift (0.002 measured on AMD Zen 3; tests/greedy_check.py),
    # not bit for bit, and their argmax may differ at a near-tie.  A wrong row would be off
    # by about the logits' spread (std ~4).
    for b, s in zip(batch, single):
        assert np.isfinite(b).all()
        np.testing.assert_allclose(b, s, rtol=0, atol=TINY_NEAR_TIE)


def test_remove_tail_and_redecode(model, ctx):
    toks = _tokens(model)
    ctx.decode(toks[:4])
    ctx.decode([toks[4]])              # token 4 alone, as it is decoded again below
    ref = ctx.get_logits()
    ctx.decode(toks[5:])               # more tokens after
    assert ctx.n_past == len(toks)
    ctx.remove_from(4)                 # drop positions 4.. and decode token 4 again
    assert ctx.n_past == 4
    ctx.decode([toks[4]])
    np.testing.assert_allclose(ctx.get_logits(), ref, rtol=1e-5, atol=1e-5)


def test_keep_prefix(model, ctx):
    """keep_prefix keeps the KV of the longest common prefix with what was decoded and
    drops the rest; decoding on from there gives what decoding on after those tokens gives."""
    toks = _tokens(model)
    ctx.decode(toks[:4])
    ctx.decode([toks[4]])
    ref = ctx.get_logits()
    ctx.decode(toks[5:])
    other = list(toks[:4]) + [toks[6], toks[7]]
    assert ctx.keep_prefix(other) == 4 and ctx.n_past == 4
    ctx.decode([toks[4]])
    np.testing.assert_allclose(ctx.get_logits(), ref, rtol=1e-5, atol=1e-5)
    assert ctx.keep_prefix(toks[:5] + [toks[0]]) == 5          # all it holds matches: kept whole
    assert ctx.keep_prefix([toks[1]] + toks) == 0 and ctx.n_past == 0
    ctx.decode(toks[:3])
    assert ctx.keep_prefix([]) == 0 and ctx.n_past == 0
    ctx.decode(toks[:3])
    ctx.remove_from(1)                                           # only what is still held counts
    assert ctx.keep_prefix(toks[:3]) == 1


def test_logits_rows(model, ctx):
    toks = _tokens(model)
    ctx.decode(toks, logits="last")
    last = ctx.get_logits(-1)
    assert last.shape == (model.n_vocab,) and last.dtype == np.float32
    with pytest.raises(IndexError):
        ctx.get_logits(1)
    ctx.decode([toks[0]], logits="none")
    with pytest.raises(IndexError):
        ctx.get_logits()


def test_long_prompt_in_chunks(model):
    with _core.Context(model, n_ctx=256, n_batch=16) as c:
        toks = (_tokens(model) * 10)[:100]
        c.decode(toks)                  # split into 16-token chunks
        chunked = c.get_logits()
    with _core.Context(model, n_ctx=256, n_batch=128) as c:
        c.decode(toks)
        whole = c.get_logits()
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=TINY_NEAR_TIE)


def test_bad_input(model, ctx):
    with pytest.raises(ValueError, match="at least one token"):
        ctx.decode([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ctx.decode([model.n_vocab + 5])
    with pytest.raises(ValueError, match="do not fit the context"):
        ctx.decode([1] * 300)
    with pytest.raises(ValueError, match="logits must be"):
        ctx.decode([1], logits="some")
    with pytest.raises(ValueError, match="n_ctx"):
        _core.Context(model, n_ctx=2)
    with pytest.raises(ValueError, match="n_threads"):
        _core.Context(model, n_threads=0)


def test_closed_context(model):
    c = _core.Context(model, n_ctx=64)
    c.close()
    assert c.closed
    with pytest.raises(RuntimeError, match="closed"):
        c.decode([1])
    with pytest.raises(RuntimeError, match="closed"):
        c.get_logits()


def test_skip_to_reads_on_as_if_the_stretch_were_not_there(model, ctx):
    """skip_to leaves a stretch of the sequence out of the cache (a draft model catching up
    with only the last tokens of a long stretch): what follows is read exactly as if the
    stretch were not in the text; removal inside it goes back to where it began; a second
    skip widens it; keep_prefix keeps nothing past its start."""
    toks = _tokens(model) * 2
    ref = _core.Context(model, n_ctx=256, n_threads=2)
    try:
        ref.decode(toks[:3])
        ref.decode(toks[6:8])
        want = ref.get_logits()
        ref.clear()
        ref.decode(toks[:3])
        ref.decode([toks[11]])
        want_wide = ref.get_logits()
    finally:
        ref.close()
    ctx.decode(toks[:3])
    assert ctx.skipped is None
    ctx.skip_to(6)
    assert ctx.skipped == (3, 3) and ctx.n_past == 6
    ctx.decode(toks[6:8])
    assert ctx.n_past == 8
    np.testing.assert_allclose(ctx.get_logits(), want, rtol=1e-5, atol=1e-5)
    ctx.remove_from(7)                   # after the stretch: an ordinary trim
    assert ctx.n_past == 7 and ctx.skipped == (3, 3)
    ctx.decode([toks[7]])
    np.testing.assert_allclose(ctx.get_logits(), want, rtol=1e-5, atol=1e-5)
    ctx.remove_from(5)                   # inside it: back to where it began
    assert ctx.n_past == 3 and ctx.skipped is None
    ctx.skip_to(5)
    ctx.decode(toks[5:7])
    ctx.skip_to(11)                      # a second stretch: what was read after the first goes
    assert ctx.skipped == (3, 8) and ctx.n_past == 11
    ctx.decode([toks[11]])
    np.testing.assert_allclose(ctx.get_logits(), want_wide, rtol=1e-5, atol=1e-5)
    assert ctx.keep_prefix(toks) == 3 and ctx.n_past == 3 and ctx.skipped is None
    with pytest.raises(ValueError, match="pos must be in"):
        ctx.skip_to(2)
    with pytest.raises(ValueError, match="pos must be in"):
        ctx.skip_to(ctx.n_ctx + 1)
    ctx.skip_to(3)                       # nowhere to skip: nothing changes
    assert ctx.skipped is None and ctx.n_past == 3
