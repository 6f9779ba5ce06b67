"""The prediction proposer (predicted outputs), driven with plain token-id lists."""
from __future__ import annotations

import random

import pytest

from fastspec import _core

PROMPT = [900, 901, 902]


def simulate(pred, output, cap=16, prompt=PROMPT):
    """Greedy verification against a known output: each pass accepts the longest agreeing
    prefix of the proposal and adds the target's own next token.  Returns (passes, accepted,
    proposals as (position, tokens))."""
    p = _core.PredictionProposer(pred)
    seq = list(prompt)
    p.py_begin(seq, len(prompt))
    passes = accepted = 0
    log = []
    while len(seq) - len(prompt) < len(output):
        pos = len(seq) - len(prompt)
        toks, conf, key = p.py_propose(seq, cap)
        assert len(toks) == len(conf) <= cap
        assert all(0.0 <= c <= 1.0 for c in conf)
        assert 0 <= key < 16
        log.append((pos, toks))
        a = 0
        while a < len(toks) and pos + a < len(output) and toks[a] == output[pos + a]:
            a += 1
        if toks:
            p.py_feedback(len(toks), a)
        emitted = output[pos:pos + a + 1]
        seq += emitted
        accepted += a
        passes += 1
        p.py_extend(seq)
    return passes, accepted, log


def code(n_lines=20, seed=0):
    """Token 'lines': each line a few distinct-ish tokens ending in a newline token (10)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        lines.append([100 + i, rng.randrange(20, 60), rng.randrange(20, 60), 200 + i, 10])
    return lines


def flat(lines):
    return [t for line in lines for t in line]


def test_identical_output_is_proposed_in_full_runs():
    pred = flat(code(30))
    passes, accepted, log = simulate(pred, pred, cap=16)
    assert accepted >= len(pred) - passes
    assert passes <= -(-len(pred) // 17) + 1
    assert log[0] == (0, pred[:16])


def test_inserted_line_rejoins():
    lines = code(30)
    pred = flat(lines)
    out_lines = lines[:10] + [[500, 501, 502, 503, 504, 10]] + lines[10:]
    out = flat(out_lines)
    passes, accepted, log = simulate(pred, out, cap=16)
    # two tokens after the inserted line at most, every proposal is the rest of the output
    tail_start = 10 * 5 + 6
    assert [toks for pos, toks in log if pos < tail_start - 6][0] == pred[:16]
    late = [(pos, toks) for pos, toks in log if pos >= tail_start + 2]
    assert late and all(toks and toks == out[pos:pos + len(toks)] for pos, toks in late)
    assert passes <= 16


def test_deleted_lines_rejoin():
    lines = code(30)
    pred = flat(lines)
    out = flat(lines[:8] + lines[12:])
    passes, accepted, _ = simulate(pred, out, cap=16)
    assert accepted >= len(out) - 3 * passes
    assert passes <= 12


def test_substituted_token_rejoins_one_token_later():
    lines = code(10)
    pred = flat(lines)
    out = list(pred)
    out[17] = 777                                   # a renamed identifier
    p = _core.PredictionProposer(pred)
    seq = PROMPT + out[:18]
    p.py_begin(PROMPT, len(PROMPT))
    p.py_extend(seq)
    assert p.cursor_position is None                 # just diverged: nothing to propose
    assert p.py_propose(seq, 8)[0] == []
    seq.append(out[18])
    p.py_extend(seq)
    toks, conf, key = p.py_propose(seq, 8)
    assert toks == pred[19:27]
    assert key == 0                                  # weak (one-token) re-synchronisation


def test_duplicated_line_jumps_back():
    lines = code(20)
    pred = flat(lines)
    out = flat(lines[:6] + [lines[5]] + lines[6:])   # line 5 written twice
    passes, accepted, _ = simulate(pred, out, cap=16)
    assert accepted >= len(out) - 3 * passes
    assert passes <= 10


def test_nearest_occurrence_wins():
    # the same 4 tokens occur three times; after a divergence the occurrence nearest the
    # last trusted position is chosen, here the next one rather than the previous one
    rep = [50, 51, 52, 53]
    pred = rep + list(range(100, 130)) + rep + [70, 71] + list(range(200, 230)) + rep + [80, 81]
    p = _core.PredictionProposer(pred)
    p.py_begin([], 0)
    seq = rep + list(range(100, 120)) + [99] + rep
    p.py_extend(seq)
    assert p.cursor_position == 38
    assert p.py_propose(seq, 3)[0] == [70, 71, 200]


def test_unrelated_output_proposes_nothing():
    pred = list(range(100, 160))
    p = _core.PredictionProposer(pred)
    p.py_begin(PROMPT, len(PROMPT))
    seq = PROMPT + [5, 6, 7, 8, 9, 5, 6, 7]
    p.py_extend(seq)
    assert p.py_propose(seq, 16) == ([], [], 0)


def test_confidence_grows_with_the_accepted_run():
    pred = list(range(100, 300))
    p = _core.PredictionProposer(pred)
    seq = list(PROMPT)
    p.py_begin(seq, len(seq))
    confs, keys = [], []
    for n in (0, 2, 10, 40, 100):
        seq = PROMPT + pred[:n]
        p.py_extend(seq)
        toks, conf, key = p.py_propose(seq, 4)
        assert toks == pred[n:n + 4]
        confs.append(conf[0])
        keys.append(key)
    assert confs == sorted(confs) and confs[0] < confs[-1]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_end_of_prediction_and_cap():
    pred = [5, 6, 7]
    p = _core.PredictionProposer(pred)
    p.py_begin([1], 1)
    assert p.py_propose([1], 0)[0] == []
    assert p.py_propose([1], 10)[0] == [5, 6, 7]
    p.py_extend([1, 5, 6, 7])
    assert p.py_propose([1, 5, 6, 7], 10)[0] == []
    # begin() starts over
    p.py_begin([2, 3], 2)
    assert p.py_propose([2, 3], 2)[0] == [5, 6]


def test_propose_catches_up_without_extend():
    pred = list(range(10, 40))
    p = _core.PredictionProposer(pred)
    p.py_begin([], 0)
    assert p.py_propose(pred[:5], 3)[0] == pred[5:8]


def test_bad_predictions():
    with pytest.raises(ValueError, match="empty"):
        _core.PredictionProposer([])
    with pytest.raises(TypeError):
        _core.PredictionProposer("some text")
    with pytest.raises(TypeError):
        _core.PredictionProposer(42)
    with pytest.raises(TypeError, match="not an int"):
        _core.PredictionProposer([1, 2.5, 3])
    with pytest.raises(TypeError, match="not an int"):
        _core.PredictionProposer([1, None])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _core.PredictionProposer([1, 2, 1000], n_vocab=1000)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        _core.PredictionProposer([-1])
    p = _core.PredictionProposer([1, 2, 999], n_vocab=1000)
    assert p.n_tokens == 3 and p.source == _core.SOURCE_NAMES.index("prediction")


def test_huge_prediction():
    pred = list(range(1_000_000))
    p = _core.PredictionProposer(pred)
    p.py_begin([], 0)
    seq = pred[:10] + [2_000_000] + pred[500_000:500_004]
    p.py_extend(seq)
    assert p.cursor_position == 500_004
    assert p.py_propose(seq, 2)[0] == [500_004, 500_005]


def _generator_with(ctx, prompt, proposers, **kw):
    try:
        g = _core.Generator(ctx, None, max_tokens=60, proposers=proposers, **kw)
    except TypeError as e:
        if "proposers" in str(e):
            pytest.skip("this engine's Generator takes no proposers= yet")
        raise
    g.start(prompt)
    g.run()
    return list(g.tokens), g.stats()


def test_generation_with_a_prediction_is_identical_and_uses_it(bpe_target):
    from fastspec.corpus import SuffixCorpus
    m = _core.Model(str(bpe_target))
    with _core.Context(m, n_ctx=512, n_threads=2) as ctx:
        prompt = m.tokenize("def main(): return print(", add_special=False)
        ref, _ = _generator_with(ctx, prompt, [])
        out, st = _generator_with(ctx, prompt, [_core.PredictionProposer(ref, m.n_vocab)])
        assert out == ref and st["accepted_by_source"]["prediction"] > len(ref) // 2
        wrong = list(ref)
        wrong[len(wrong) // 2] = (wrong[len(wrong) // 2] + 1) % m.n_vocab
        out, st = _generator_with(ctx, prompt, [_core.PredictionProposer(wrong, m.n_vocab)])
        assert out == ref and st["accepted_by_source"]["prediction"] > 0
        corpus = SuffixCorpus(m)
        corpus.add(prompt + ref)
        out, st = _generator_with(ctx, prompt, [corpus.proposer()])
        assert out == ref and st["accepted_by_source"]["suffix"] > len(ref) // 2
