"""prediction= and the decoder's suffix corpus through the public API (tiny models):
outputs stay the target's own (like with like, tests/greedy_check.py), the proposers'
tokens are used, the corpus learns each generation, and bad input raises clearly."""
import pytest

import fastspec
from fastspec import SuffixCorpus
from greedy_check import assert_tiny_same_or_near_tie as same_or_near_tie

PROMPT = "once upon a time there was"


@pytest.fixture(scope="module")
def alone(bpe_target):
    with fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=512) as d:
        yield d


def test_prediction_of_the_output_is_accepted(alone):
    base = alone.generate(PROMPT, max_tokens=48, speculative=False)
    r = alone.generate(PROMPT, max_tokens=48, prediction=base.tokens, n_draft=16)
    same_or_near_tie(alone, PROMPT, r, base)
    assert r.stats.accepted_by_source["prediction"] > 0
    assert "prediction" in r.sources
    # the same prediction as text works too (tokenized with the target's vocabulary)
    r2 = alone.generate(PROMPT, max_tokens=48, prediction=base.text, n_draft=16)
    same_or_near_tie(alone, PROMPT, r2, base)


def test_prediction_in_stream_and_config(alone):
    base = alone.generate(PROMPT, max_tokens=32, speculative=False)
    pieces = list(alone.stream(PROMPT, max_tokens=32, prediction=base.tokens, n_draft=8))
    toks = [t for p in pieces for t in p.tokens]
    assert toks == alone.last_result.tokens
    same_or_near_tie(alone, PROMPT, alone.last_result, base)
    assert any("prediction" in p.sources for p in pieces)


def test_speculative_false_ignores_the_prediction(alone):
    base = alone.generate(PROMPT, max_tokens=24, speculative=False)
    r = alone.generate(PROMPT, max_tokens=24, speculative=False, prediction=base.tokens)
    assert r.tokens == base.tokens and r.stats.n_drafted == 0


@pytest.mark.parametrize("bad, exc, words", [
    ("", ValueError, "empty"),
    ([], ValueError, "empty"),
    (b"bytes", TypeError, "bytes"),
    (3.5, TypeError, "prediction"),
    ([1, "x"], TypeError, "integers"),
    ([10 ** 9], ValueError, "vocabulary"),
])
def test_bad_predictions_raise_clearly(alone, bad, exc, words):
    with pytest.raises(exc, match=words):
        alone.generate(PROMPT, max_tokens=4, prediction=bad)
    with pytest.raises(exc, match=words):
        alone.stream(PROMPT, max_tokens=4, prediction=bad)
    # the decoder is still usable
    assert alone.generate(PROMPT, max_tokens=2, speculative=False).tokens


def test_corpus_learns_each_generation_and_proposes(bpe_target, tmp_path):
    with fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=512, corpus=True) as d:
        assert isinstance(d.corpus, SuffixCorpus) and len(d.corpus) == 0
        base = d.generate(PROMPT, max_tokens=40, speculative=False)
        assert len(d.corpus) == 1
        assert d.corpus.n_tokens == len(d.tokenize(PROMPT)) + len(base.tokens)
        again = d.generate(PROMPT, max_tokens=40, n_draft=16)
        same_or_near_tie(d, PROMPT, again, base)
        assert again.stats.accepted_by_source["suffix"] > 0
        off = d.generate(PROMPT, max_tokens=40, n_draft=16, suffix=False)
        assert off.stats.drafted_by_source["suffix"] == 0
        path = tmp_path / "c.fsc"
        d.corpus.save(path)
        n_docs = len(d.corpus)
    with fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=512, corpus=str(path)) as d2:
        assert len(d2.corpus) == n_docs
        r = d2.generate(PROMPT, max_tokens=40, n_draft=16)
        assert r.stats.accepted_by_source["suffix"] > 0


def test_corpus_bad_file_and_type(bpe_target, tmp_path):
    bad = tmp_path / "bad.fsc"
    bad.write_bytes(b"not a corpus")
    with pytest.raises(ValueError):
        fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=512, corpus=str(bad))
    with pytest.raises(TypeError, match="corpus"):
        fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=512, corpus=42)
