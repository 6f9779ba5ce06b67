"""The suffix index, its proposer and SuffixCorpus (documents, bounds, files)."""
from __future__ import annotations

import random

import pytest

from fastspec import _core
from fastspec.corpus import SuffixCorpus


def occurrences(docs, pat):
    n = len(pat)
    return sum(1 for d in docs for i in range(len(d) - n + 1) if d[i:i + n] == pat)


def longest_suffix_in(docs, seq, cap):
    best = 0
    for n in range(1, min(len(seq), cap) + 1):
        if occurrences(docs, seq[len(seq) - n:]):
            best = n
        else:
            break
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_and_matches_agree_with_brute_force(seed):
    rng = random.Random(seed)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    ix = _core.SuffixIndex(8)
    for d in docs:
        ix.add(d)
    assert ix.n_docs == 6 and ix.n_tokens == sum(map(len, docs))
    for _ in range(300):
        pat = [rng.randrange(5) for _ in range(rng.randrange(1, 7))]
        assert ix.count(pat) == occurrences(docs, pat), pat
    for _ in range(100):
        seq = [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
        cap = rng.randrange(1, 8)
        assert ix.match_length(seq, cap) == longest_suffix_in(docs, seq, cap)


def test_no_match_across_document_boundaries():
    ix = _core.SuffixIndex(10)
    ix.add_many([[1, 2, 3], [4, 5]])
    assert ix.count([3, 4]) == 0
    assert ix.count([2, 3]) == 1
    assert ix.match_length([3, 4]) == 1


def test_proposes_the_most_frequent_continuation():
    ix = _core.SuffixIndex(20)
    ix.add_many([[1, 2, 3, 4, 9], [1, 2, 3, 5, 6], [7, 2, 3, 5, 6], [8, 8, 8]])
    p = _core.SuffixProposer(ix, 32, 2)
    assert p.source == _core.SOURCE_NAMES.index("suffix")
    p.py_begin([0, 2, 3], 3)
    toks, conf, key = p.py_propose([0, 2, 3], 8)
    assert toks == [5, 6]
    # count(child) / (count(node) + 2 / matched length)
    assert conf[0] == pytest.approx(2 / (3 + 2 / 2)) and conf[1] == pytest.approx(2 / (2 + 2 / 3))
    assert 0 <= key < 16
    # a longer match is more specific: after 1 2 3 the counts are 1:1
    p.py_extend([0, 1, 2, 3])          # the sequence shrank and changed: it re-matches
    p.py_begin([1, 2, 3], 3)
    assert p.match_length == 3
    toks, conf, _ = p.py_propose([1, 2, 3], 8)
    assert toks[0] in (4, 5) and conf[0] == pytest.approx(1 / (2 + 2 / 3))
    # too short a match: nothing
    p.py_begin([9, 9, 3], 3)
    assert p.py_propose([9, 9, 3], 8) == ([], [], 0)


def test_suffix_key_marks_an_opening_matched_on_the_prompts_end():
    # an earlier conversation: a question (50), the header (90 91 92), its answer 1 2 3 4 5;
    # another document has 3 4 as well
    ix = _core.SuffixIndex(100)
    ix.add_many([[50, 90, 91, 92, 1, 2, 3, 4, 5], [8, 8, 3, 4, 7]])
    p = _core.SuffixProposer(ix, 32, 2)
    opening = _core.SUFFIX_OPENING_KEY
    prompt = [60, 90, 91, 92]                      # a new question, the same header
    p.py_begin(prompt, len(prompt))
    toks, _, key = p.py_propose(prompt, 8)
    assert toks == [1, 2, 3, 4, 5] and key == opening      # matched: the header alone
    toks, _, key = p.py_propose(prompt + [1, 2], 8)
    assert toks == [3, 4, 5] and key == opening            # 5 matched, 3 of them the prompt's
    # a match inside the answer keeps its length's key (2 tokens, found twice)
    p.py_begin(prompt, len(prompt))
    toks, _, key = p.py_propose(prompt + [9, 3, 4], 8)
    assert p.match_length == 2 and key != opening and 0 <= key < opening
    # the same question again: the match reaches well into the prompt, its length's key
    ix.add([20, 21, 22, 23, 24, 25, 26, 27, 28, 90, 91, 92, 6, 7])
    prompt = [20, 21, 22, 23, 24, 25, 26, 27, 28, 90, 91, 92]
    p.py_begin(prompt, len(prompt))
    toks, _, key = p.py_propose(prompt, 8)
    assert toks == [6, 7] and p.match_length == 12 and key != opening and 0 <= key < opening


def test_proposer_follows_new_tokens_and_index_changes():
    ix = _core.SuffixIndex(50)
    p = _core.SuffixProposer(ix, 4, 2)
    p.py_begin([10, 11], 2)
    assert p.py_propose([10, 11], 4)[0] == []
    ix.add([10, 11, 12, 13, 14])
    assert p.py_propose([10, 11], 4)[0] == [12, 13, 14]
    p.py_extend([10, 11, 12])
    assert p.py_propose([10, 11, 12], 4)[0] == [13, 14]
    # max_match bounds the matched length
    p.py_extend([10, 11, 12, 13, 14])
    assert p.match_length == 4
    ix.clear()
    assert p.py_propose([10, 11, 12, 13, 14], 4)[0] == []


def test_bad_index_input():
    with pytest.raises(ValueError):
        _core.SuffixIndex(0)
    ix = _core.SuffixIndex(10)
    ix.add([1, 2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ix.add_many([[3, 4], [5, 10]])
    with pytest.raises(TypeError):
        ix.add([1, "x"])
    assert ix.n_docs == 1 and ix.count([3, 4]) == 0       # nothing was added
    with pytest.raises(ValueError):
        _core.SuffixProposer(ix, 2, 3)


# -- SuffixCorpus -------------------------------------------------------------------------------
def test_corpus_bounds_drop_oldest_documents():
    c = SuffixCorpus(n_vocab=100, max_tokens=10)
    p = c.proposer(max_match=8, min_match=2)
    assert c.add([1, 2, 3, 4]) == 4
    assert c.add([5, 6, 7, 8]) == 4
    assert (len(c), c.n_tokens) == (2, 8)
    assert c.add([9, 10, 11]) == 3                       # 11 > 10: the oldest goes
    assert (len(c), c.n_tokens) == (2, 7)
    assert c.documents == [[5, 6, 7, 8], [9, 10, 11]]
    p.py_begin([5, 6], 2)                                # the proposer sees the rebuilt index
    assert p.py_propose([5, 6], 4)[0] == [7, 8]
    p.py_begin([1, 2], 2)
    assert p.py_propose([1, 2], 4)[0] == []
    assert c.add(list(range(20, 40))) == 10              # too long alone: its tail is kept
    assert c.documents == [list(range(30, 40))]
    assert c.add([]) == 0 and len(c) == 1
    c.clear()
    assert (len(c), c.n_tokens, c.index.n_tokens) == (0, 0, 0)


def test_corpus_bad_input_leaves_it_untouched():
    c = SuffixCorpus(n_vocab=100)
    c.add([1, 2, 3])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        c.add([1, 100])
    with pytest.raises(TypeError, match="no model"):
        c.add("text")
    with pytest.raises(TypeError):
        c.add(5)
    assert c.documents == [[1, 2, 3]]
    with pytest.raises(ValueError):
        SuffixCorpus()
    with pytest.raises(ValueError):
        SuffixCorpus(n_vocab=10, max_tokens=0)


def test_corpus_save_load_roundtrip(tmp_path):
    c = SuffixCorpus(n_vocab=100)
    c.add([1, 2, 3, 4])
    c.add([5, 6, 1, 2, 3, 7])
    path = tmp_path / "c.fsc"
    c.save(path)
    d = SuffixCorpus.load(path, n_vocab=100)
    assert d.documents == c.documents and d.n_tokens == 10
    assert d.index.count([1, 2, 3]) == 2
    e = SuffixCorpus(n_vocab=100)
    e.add([42])
    assert e.load(path) is e
    assert e.documents == c.documents
    small = SuffixCorpus.load(path, n_vocab=100, max_tokens=7)     # oldest dropped to fit
    assert small.documents == [[5, 6, 1, 2, 3, 7]]


def test_corpus_corrupt_or_foreign_files_raise_and_change_nothing(tmp_path):
    c = SuffixCorpus(n_vocab=100)
    c.add([1, 2, 3, 4, 5])
    good = tmp_path / "good.fsc"
    c.save(good)
    data = good.read_bytes()
    target = SuffixCorpus(n_vocab=100)
    target.add([7, 8, 9])

    def check(blob, match):
        path = tmp_path / "bad.fsc"
        path.write_bytes(blob)
        with pytest.raises(ValueError, match=match):
            target.load(path)
        assert target.documents == [[7, 8, 9]] and target.index.count([7, 8]) == 1

    check(b"", "bad magic")
    check(b"GGUF" + data[4:], "bad magic")
    check(data[:-1], "checksum")
    flipped = bytearray(data)
    flipped[-40] ^= 1
    check(bytes(flipped), "checksum")
    check(data[:16] + (2).to_bytes(4, "little") + data[20:], "version")
    other = SuffixCorpus(n_vocab=50)
    other.add([1, 2])
    other.save(tmp_path / "other.fsc")
    check((tmp_path / "other.fsc").read_bytes(), "another model")
    with pytest.raises(FileNotFoundError):
        target.load(tmp_path / "missing.fsc")


def test_corpus_fingerprint_is_the_models_vocabulary(bpe_pair, spm_pair, tmp_path):
    model = _core.Model(bpe_pair[0], vocab_only=True)
    same = _core.Model(bpe_pair[1], vocab_only=True)
    other = _core.Model(spm_pair[0], vocab_only=True)
    c = SuffixCorpus(model, max_tokens=1000)
    n = c.add("hello world, hello world")
    assert n == len(model.tokenize("hello world, hello world", add_special=False))
    assert c.fingerprint.startswith("vocab-sha256:")
    path = tmp_path / "tiny.fsc"
    c.save(path)
    d = SuffixCorpus.load(path, same)                    # same vocabulary: fine
    assert d.documents == c.documents
    foreign = SuffixCorpus(other)
    foreign.add([1, 2, 3])
    with pytest.raises(ValueError, match="another model"):
        foreign.load(path)
    assert foreign.documents == [[1, 2, 3]]
    with pytest.raises(ValueError, match="another model"):
        SuffixCorpus.load(path, n_vocab=model.n_vocab)   # no model: no fingerprint match
