"""Target-alone generation (the baseline): greedy, sampling, stops, streaming, bad input."""
import threading

import numpy as np
import pytest

import fastspec
from fastspec import _core

PROMPTS = ["the quick brown fox", "hello world", "once upon a time there was"]


@pytest.fixture(scope="module")
def dec(bpe_pair):
    d = fastspec.SpeculativeDecoder(str(bpe_pair[0]), n_ctx=512, n_threads=2)
    yield d
    d.close()


def _greedy_by_hand(model_path, prompt_tokens, n):
    """Step the model one token at a time from Python, taking the argmax.  Like with like:
    the decoder's settings, and the prompt decoded as Generator.start and the first step
    do (all but its last token in one batch, then that token alone), so that every logit
    is computed by the same kernels on any CPU."""
    m = _core.Model(model_path)
    with _core.Context(m, n_ctx=512, n_threads=2) as c:
        if len(prompt_tokens) > 1:
            c.decode(prompt_tokens[:-1], logits="none")
        c.decode(prompt_tokens[-1:])
        out = []
        for _ in range(n):
            t = int(np.argmax(c.get_logits()))
            if m.is_eog(t):
                break
            out.append(t)
            c.decode([t])
    m.close()
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_stepping_by_hand(dec, bpe_pair, prompt):
    r = dec.generate(prompt, max_tokens=24)
    toks = dec.tokenize(prompt)
    assert r.tokens == _greedy_by_hand(str(bpe_pair[0]), toks, 24)
    assert r.finish_reason in ("length", "stop")
    assert r.text == dec.detokenize(r.tokens)


def test_greedy_is_deterministic(dec):
    a = dec.generate(PROMPTS[0], max_tokens=32)
    b = dec.generate(PROMPTS[0], max_tokens=32)
    assert a.tokens == b.tokens and len(a.tokens) > 0
    assert a.stats.n_generated == len(a.tokens)
    assert a.stats.mean_accepted_length == pytest.approx(1.0)


def test_seeded_sampling_is_reproducible(dec):
    kw = dict(max_tokens=32, temperature=1.0, top_p=0.95, seed=1234)
    a = dec.generate(PROMPTS[1], **kw)
    b = dec.generate(PROMPTS[1], **kw)
    assert a.tokens == b.tokens
    others = {tuple(dec.generate(PROMPTS[1], max_tokens=32, temperature=1.0, seed=s).tokens) for s in range(6)}
    assert len(others) > 1, "different seeds should give different samples"


def test_top_k_one_is_greedy(dec):
    g = dec.generate(PROMPTS[2], max_tokens=20)
    s = dec.generate(PROMPTS[2], max_tokens=20, temperature=0.8, top_k=1, seed=5)
    assert g.tokens == s.tokens


def test_max_tokens(dec):
    full = dec.generate(PROMPTS[0], max_tokens=40)
    assert len(full.tokens) > 5             # this prompt runs on past 5 tokens
    r = dec.generate(PROMPTS[0], max_tokens=5)
    assert r.tokens == full.tokens[:5]
    assert r.finish_reason == "length"


def test_stop_string(dec):
    full = dec.generate(PROMPTS[0], max_tokens=40)
    assert len(full.text) > 6
    stop = full.text[3:6]
    r = dec.generate(PROMPTS[0], max_tokens=40, stop=[stop, "never-there"])
    assert r.finish_reason == "stop"
    assert r.text == full.text[:full.text.index(stop)]


def test_stream_matches_generate(dec):
    full = dec.generate(PROMPTS[1], max_tokens=30)
    pieces = list(dec.stream(PROMPTS[1], max_tokens=30))
    assert "".join(p.text for p in pieces) == full.text
    assert [t for p in pieces for t in p.tokens] == full.tokens
    assert all(s == "target" for p in pieces for s in p.sources)


def test_context_overflow_finishes_with_length(bpe_pair):
    with fastspec.SpeculativeDecoder(str(bpe_pair[0]), n_ctx=64) as d:
        prompt = d.tokenize(PROMPTS[0])
        r = d.generate(prompt, max_tokens=1000)
        assert r.finish_reason == "length"
        # llama.cpp may round n_ctx up; the last token is emitted without entering the cache
        assert len(prompt) + len(r.tokens) <= d.n_ctx + 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-1.0), "min_p"),
    (dict(top_k=-3), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
])
def test_invalid_sampling_values(dec, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dec.generate("hello", **kwargs)


def test_bad_prompts(dec, bpe_pair):
    with pytest.raises(ValueError, match="empty"):
        dec.generate("")
    with pytest.raises(TypeError):
        dec.generate(3.14)
    with fastspec.SpeculativeDecoder(str(bpe_pair[0]), n_ctx=32) as d:
        with pytest.raises(ValueError, match="context"):
            d.generate("hello world " * (d.n_ctx + 10))


def test_closed_decoder(bpe_pair):
    d = fastspec.SpeculativeDecoder(str(bpe_pair[0]), n_ctx=64)
    d.close()
    d.close()
    with pytest.raises(RuntimeError, match="closed"):
        d.generate("hello")


def test_one_decoder_two_threads_is_refused(dec):
    it = dec.stream(PROMPTS[0], max_tokens=50)
    next(it)                                  # generation in progress (holds the decoder)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, dec.generate, "x")))
    t.start()
    t.join()
    assert errors and "another thread" in str(errors[0].value)
    list(it)                                  # finish; the decoder is free again
    assert dec.generate(PROMPTS[0], max_tokens=8).tokens == dec.generate(PROMPTS[0], max_tokens=50).tokens[:8]


def test_model_names_unknown():
    with pytest.raises(FileNotFoundError, match="unknown model"):
        fastspec.generate("hi", target="no-such-model-name")


def test_use_mmap_reaches_both_models_and_changes_no_output(bpe_pair):
    outs = []
    for use_mmap in (True, False, None):
        with fastspec.SpeculativeDecoder(str(bpe_pair[0]), str(bpe_pair[1]), n_ctx=256, n_threads=2,
                                         use_mmap=use_mmap) as d:
            if use_mmap is not None:
                assert d.target_model.use_mmap is use_mmap and d.draft_model.use_mmap is use_mmap
            outs.append(d.generate("hello world", max_tokens=24, n_draft=3).tokens)
    assert outs[0] == outs[1] == outs[2]


def test_decoders_can_share_loaded_models(bpe_pair):
    a = fastspec.SpeculativeDecoder(str(bpe_pair[0]), str(bpe_pair[1]), n_ctx=256, n_threads=2)
    b = fastspec.SpeculativeDecoder(a.target_model, a.draft_model, n_ctx=256, n_threads=2)
    c = fastspec.SpeculativeDecoder(a.target_model, None, n_ctx=256, n_threads=2)
    assert b.target_model is a.target_model and b.draft_model is a.draft_model
    want = a.generate("hello world", max_tokens=24, n_draft=3).tokens
    assert b.generate("hello world", max_tokens=24, n_draft=3).tokens == want
    assert c.generate("hello world", max_tokens=24).tokens == want
    b.close()
    c.close()
    # the borrowers closed their contexts only: the lender's models still work
    assert not a.target_model.closed and not a.draft_model.closed
    assert a.generate("hello world", max_tokens=24, n_draft=3).tokens == want
    a.close()
    assert a.target_model.closed
    with pytest.raises(ValueError, match="closed"):
        fastspec.SpeculativeDecoder(a.target_model, n_ctx=256)
