"""The cost-aware policy over proposers, the proposer interface, the shared settings,
and streams that take the decoder only while iterated.

Costs are set (and held) with CostModel.set(), so that what the policy decides does not
depend on this machine's speed; only tiny random-weight models run."""
import gc
import inspect
import threading
import warnings

import pytest

import fastspec
from fastspec import _core, config
from fastspec.config import GenerationConfig
from greedy_check import CPU_LAYERS

PROMPT = "once upon a time there was"
PASSAGE = "the quick brown fox jumps over the lazy dog and the cat sat on the mat"


@pytest.fixture(scope="module")
def same(bpe_pair):
    """A decoder whose draft is the target's twin: every draft is accepted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = fastspec.SpeculativeDecoder(str(bpe_pair[0]), str(bpe_pair[1]), n_ctx=512, n_gpu_layers=CPU_LAYERS)
    yield d
    d.close()


@pytest.fixture(scope="module")
def other(bpe_pair):
    """A decoder whose draft is differently seeded: its drafts are mostly rejected."""
    d = fastspec.SpeculativeDecoder(str(bpe_pair[0]), str(bpe_pair[2]), n_ctx=512, n_gpu_layers=CPU_LAYERS)
    yield d
    d.close()


@pytest.fixture(scope="module")
def alone(bpe_pair):
    d = fastspec.SpeculativeDecoder(str(bpe_pair[0]), n_ctx=512, n_gpu_layers=CPU_LAYERS)
    yield d
    d.close()


def set_costs(dec, *, t1=0.1, per_token=0.02, draft=0.01, catchup=0.002):
    """Target pass of n tokens: t1 + (n-1) per_token seconds; a draft token: ``draft``."""
    dec.cost_model.set(draft_time=draft, catchup_time=catchup,
                       verify_times={n: t1 + (n - 1) * per_token for n in range(1, 34)})
    dec.acceptance.reset()


# -- never slower ------------------------------------------------------------
def test_a_draft_that_cannot_pay_is_never_run(same):
    """Even certain acceptance cannot pay when a draft token costs twice a target pass:
    the policy runs the target alone from the first pass, no probe."""
    set_costs(same, t1=0.1, per_token=0.02, draft=0.2)
    base = same.generate(PROMPT, max_tokens=60, speculative=False)
    r = same.generate(PROMPT, max_tokens=60)
    assert r.tokens == base.tokens
    assert r.stats.raw["n_draft_steps"] == 0 and r.stats.n_drafted == 0
    assert r.stats.raw["draft_first_at"] == -1          # the draft never ran
    assert r.stats.probes_by_source["draft"] == 0
    assert r.stats.passes_by_source["target"] == r.stats.n_target_passes
    # predicted: the target alone's rate, exactly
    assert r.stats.predicted_tokens_per_second == pytest.approx(10.0)
    assert r.stats.predicted_target_tokens_per_second == pytest.approx(10.0)


def test_a_draft_that_pays_is_used(same):
    # pays if acceptance is high, not at the draft prior's 0.7
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    base = same.generate(PROMPT, max_tokens=160, speculative=False)
    r = same.generate(PROMPT, max_tokens=160)
    assert r.tokens == base.tokens
    s = r.stats
    assert s.probes_by_source["draft"] >= 1               # nothing known at first: probed
    assert s.raw["n_draft_steps"] >= s.n_target_passes / 2
    assert s.acceptance_rate == 1.0 and s.mean_accepted_length > 2.0
    assert s.predicted_tokens_per_second > s.predicted_target_tokens_per_second
    # what was learned stays with the decoder: the next generation drafts at once
    assert same.acceptance.rate("draft") > 0.8
    again = same.generate(PROMPT, max_tokens=80)
    assert again.stats.probes_by_source["draft"] == 0 and again.stats.raw["n_draft_steps"] > 0
    assert again.stats.raw["draft_first_at"] == 0       # at the answer's first token


def test_a_useless_draft_is_set_aside(other):
    """A draft that pays only if acceptance is high (above the draft prior's 0.7), whose
    drafts are mostly rejected, costs the target little: probed and set aside on its
    evidence, or not run at all where the target's certainty already says it will do
    poorly (the random tiny target is unsure of most of its tokens)."""
    set_costs(other, t1=0.1, per_token=0.02, draft=0.045)
    base = other.generate(PROMPT, max_tokens=150, speculative=False)
    r = other.generate(PROMPT, max_tokens=150)
    assert r.tokens == base.tokens                         # identical across pauses and catch-ups
    s = r.stats
    assert s.raw["n_draft_steps"] < s.n_target_passes / 2
    assert other.acceptance.rate("draft") <= 0.7           # below the prior if run: set aside


def test_fixed_n_draft_always_drafts(other):
    set_costs(other, t1=0.1, per_token=0.02, draft=0.2)    # would never pay
    r = other.generate(PROMPT, max_tokens=60, n_draft=4)
    assert r.stats.raw["n_draft_steps"] >= r.stats.n_target_passes - 1


def test_lookup_that_cannot_pay_is_not_verified(alone):
    """Verifying n tokens costs n single passes: no lookup proposal can pay."""
    set_costs(alone, t1=0.1, per_token=0.12, draft=0.0)
    base = alone.generate(PASSAGE * 3, max_tokens=60, speculative=False)
    r = alone.generate(PASSAGE * 3, max_tokens=60, lookup=True)
    assert r.tokens == base.tokens
    assert r.stats.drafted_by_source["lookup"] == 0
    assert r.stats.probes_by_source["lookup"] == 0


def test_lookup_on_repeats_pays(alone):
    set_costs(alone, t1=0.1, per_token=0.002, draft=0.0)
    base = alone.generate(PASSAGE * 3, max_tokens=60, speculative=False)
    r = alone.generate(PASSAGE * 3, max_tokens=60, lookup=True)
    assert r.tokens == base.tokens
    assert r.stats.accepted_by_source["lookup"] > 0
    assert r.stats.passes_by_source["lookup"] > 0
    assert r.stats.drafted_by_source["draft"] == 0


def test_a_free_probe_is_priced_on_the_answers_expected_length(alone):
    """A lookup proposal whose mean acceptance does not pay (a token costs 0.45 of a pass;
    those of some keys do) is probed where the answer may run on (no length known yet:
    half of max_tokens), not where this decoder's answers end after a couple of tokens:
    what a probe can teach serves only the tokens still to come, not all that max_tokens
    allows."""
    set_costs(alone, t1=0.1, per_token=0.045, draft=0.0)
    base = alone.generate(PASSAGE, max_tokens=120, speculative=False)
    r = alone.generate(PASSAGE, max_tokens=120, lookup=True)
    assert r.tokens == base.tokens
    assert r.stats.probes_by_source["lookup"] >= 1
    set_costs(alone, t1=0.1, per_token=0.045, draft=0.0)
    for _ in range(6):
        alone.acceptance.record_length(2)
    r = alone.generate(PASSAGE, max_tokens=120, lookup=True)
    assert r.tokens == base.tokens
    assert r.stats.probes_by_source["lookup"] == 0


def test_no_free_probe_on_an_answers_first_token(alone):
    """A free proposal for an answer's first token is offered once per answer, so a probe
    there teaches nothing this answer's later passes can use (and greedy, the check of a
    proposal not verified learns the same for free): it is not probed there.  Here a
    prediction of the whole output, at costs where its prior acceptance does not pay (a
    token costs 0.6 of a pass) but a probe does: the first pass runs the target alone; the
    check of the first token's proposal against it makes the next one pay, and it runs."""
    set_costs(alone, t1=0.1, per_token=0.06, draft=0.0)
    base = alone.generate(PASSAGE, max_tokens=40, speculative=False)
    set_costs(alone, t1=0.1, per_token=0.06, draft=0.0)
    pieces = list(alone.stream(PASSAGE, max_tokens=40, prediction=base.tokens))
    assert [t for p in pieces for t in p.tokens] == list(base.tokens)
    assert pieces[0].sources == ["target"]                      # the first token: the target alone
    assert "prediction" in pieces[1].sources                     # verified one token on, kept


def test_free_proposals_not_verified_still_learn_greedy(same):
    """Greedy, a pass emits the target's own tokens whatever it verified, so a free proposal
    that was not chosen is checked against the tokens of a pass that emitted several: here a
    prediction of the whole output, whose carried record says it fails (so the twin draft is
    chosen first), is found right on the draft's passes and learns it."""
    set_costs(same, t1=0.1, per_token=0.005, draft=0.005)
    base = same.generate(PASSAGE, max_tokens=40, speculative=False)

    def poor_record():
        set_costs(same, t1=0.1, per_token=0.005, draft=0.005)
        for key in range(16):
            for _ in range(20):
                same.acceptance.record("prediction", key, 1, 0)

    poor_record()
    r = same.generate(PASSAGE, max_tokens=40, prediction=base.tokens)
    assert r.tokens == base.tokens
    assert r.stats.passes_by_source["draft"] >= 1
    hits = sum(h for h, _ in same.acceptance.counts()["prediction"].values())
    assert hits >= 5            # the carried record had none
    # sampled tokens depend on what was verified: no such evidence, the prediction stays set aside
    poor_record()
    r = same.generate(PASSAGE, max_tokens=40, prediction=base.tokens, temperature=0.8, seed=3)
    assert r.stats.passes_by_source["prediction"] == 0
    assert sum(h for h, _ in same.acceptance.counts()["prediction"].values()) == 0


def test_free_proposals_not_verified_are_checked_on_one_token_passes(alone):
    """Greedy, a lookup proposal that cannot pay (verifying n tokens costs n passes) is
    never verified, yet the tokens the target emits one pass at a time check it: each
    proposal's first two tokens, up to the first miss, one proposal at a time, count in the
    acceptance model as if verified.  The counts equal those worked out here from the
    output and the lookup's own proposals (with the fading of what is passed over)."""
    set_costs(alone, t1=0.1, per_token=0.12, draft=0.0)
    max_tokens = 40
    prompt = PASSAGE * 3
    r = alone.generate(prompt, max_tokens=max_tokens, lookup=True)
    assert r.stats.passes_by_source["lookup"] == 0 and r.stats.passes_by_source["target"] >= 10
    toks = alone.tokenize(prompt) + list(r.tokens)
    n_prompt = len(toks) - len(r.tokens)
    lookup = _core.LookupProposer(len(toks) + 1)
    lookup.propose_for(toks[:n_prompt], 1)               # begins on the prompt
    hits, tries = {}, {}
    pending = None                       # (tokens, key, position of the first)
    for i in range(len(r.tokens)):       # pass i emits token i at n_prompt + i
        cap = min(config.AUTO_DRAFT_MAX, max_tokens - i - 1)
        offer = lookup.propose_for(toks[:n_prompt + i], cap, restart=False) if cap > 0 else ([], [], 0)
        if offer[0]:
            key = offer[2]               # passed over: its evidence fades a little
            hits[key], tries[key] = hits.get(key, 0.0) * 0.99, tries.get(key, 0.0) * 0.99
            if pending is None:
                pending = (offer[0][:2], key, n_prompt + i)
        if pending is not None:
            ptoks, key, pos = pending
            end = n_prompt + i + 1
            m = 0
            while m < len(ptoks) and pos + m < end and toks[pos + m] == ptoks[m]:
                m += 1
            if m == len(ptoks) or pos + m < end:
                tries[key] = tries.get(key, 0.0) + (m if m == len(ptoks) else m + 1)
                hits[key] = hits.get(key, 0.0) + m
                pending = None
    expected = {k: (hits[k], tries[k]) for k in tries if tries[k] > 0}
    got = alone.acceptance.counts().get("lookup", {})
    assert sum(t for _, t in expected.values()) >= 2
    assert set(got) == set(expected)
    for k, (h, t) in expected.items():
        assert got[k] == pytest.approx((h, t), rel=1e-6, abs=1e-9)
    # a prediction of the whole output, never verified either: its checked tokens are right
    set_costs(alone, t1=0.1, per_token=0.12, draft=0.0)
    p = alone.generate(prompt, max_tokens=max_tokens, prediction=r.tokens)
    assert p.tokens == r.tokens and p.stats.passes_by_source["prediction"] == 0
    counts = alone.acceptance.counts()["prediction"].values()
    assert sum(h for h, _ in counts) == sum(t for _, t in counts) >= 10


def test_combined_identical(same, other):
    for dec in (same, other):
        set_costs(dec, t1=0.1, per_token=0.005, draft=0.005)
        base = dec.generate(PASSAGE, max_tokens=50, speculative=False)
        r = dec.generate(PASSAGE, max_tokens=50, lookup=True)
        assert r.tokens == base.tokens


def test_a_draft_run_that_proposes_nothing_is_priced_at_its_decode(other):
    """A draft chosen on its acceptance mean (the prior) whose first token's confidence is
    too low to verify proposes nothing: that run is a draft decode and a one-token pass,
    and the policy's prediction of the draft's passes counts every decode it ran (the
    dropped token's included), as the bench and the what-if read it."""
    t1, per, td = 0.1, 0.03, 0.005
    other.cost_model.set(draft_time=td, catchup_time=1e-6,
                         verify_times={n: t1 + (n - 1) * per for n in range(1, 34)})
    other.acceptance.reset()
    s = other.generate(PROMPT, max_tokens=60).stats
    assert s.raw["n_draft_empty"] >= 1            # the random draft is unsure of everything
    assert s.raw["n_draft_empty"] <= s.raw["n_draft_steps"]
    seconds = s.raw["predicted_by_source"]["draft"][1]
    # each draft pass: its decodes, and a target pass of 1 + k tokens (catch-ups ~0 here)
    decoded = s.raw["n_draft_decodes"] * td + s.raw["n_draft_steps"] * t1 + s.n_drafted * per
    assert seconds == pytest.approx(decoded, abs=1e-3)


def test_a_free_proposers_record_outlasts_the_drafts(same):
    """At each new generation a free proposer's per-key counts keep 0.8 of their weight (a
    key's record is mostly the proposer's own), the draft model's half (capped: how it
    does on one answer says little of the next)."""
    acc = same.acceptance
    acc.reset()
    acc.record("lookup", 15, 10, 10)     # (a key lookup's proposals here do not use)
    acc.record("draft", 0, 3, 1)         # 2 tried (one kept, the next not), 1 kept
    same.generate(PROMPT, max_tokens=1, lookup=True)   # a new generation; no room to propose
    counts = acc.counts()
    assert counts["lookup"][15] == pytest.approx((8.0, 8.0))
    assert counts["draft"][0] == pytest.approx((0.5, 1.0))


def test_stats_per_source_and_predicted(same):
    set_costs(same, t1=0.1, per_token=0.005, draft=0.005)
    s = same.generate(PROMPT, max_tokens=40, lookup=True).stats
    for d in (s.drafted_by_source, s.accepted_by_source, s.emitted_by_source, s.passes_by_source,
              s.probes_by_source):
        assert set(d) == set(fastspec.SOURCE_NAMES)
    assert sum(s.emitted_by_source.values()) == s.n_generated
    assert sum(s.passes_by_source.values()) == s.n_target_passes
    assert set(s.raw["predicted_by_source"]) == set(fastspec.SOURCE_NAMES)
    assert s.predicted_tokens_per_second > 0 and s.tokens_per_second > 0


def check_trace(s, target_rate):
    """A pass trace agrees with the generation's counts, pass by pass and per source."""
    trace = s.trace
    assert len(trace) == s.n_target_passes
    assert sum(p["emitted"] for p in trace) == s.n_generated
    at = 0
    for p in trace:                      # each pass starts where the one before left off
        assert p["at"] == at
        at += p["emitted"]
        assert 0 <= p["accepted"] <= p["k"] and p["emitted"] <= p["accepted"] + 1
        assert p["target_rate"] == pytest.approx(target_rate)
        assert p["best_rate"] >= p["target_rate"] and p["expected_seconds"] > 0 and p["seconds"] > 0
        if p["source"] == "target":
            assert p["k"] == 0 and p["expected_tokens"] == 1.0
        if p["source"] == "draft" and not p["probe"]:
            # the draft ran because it promised the most
            assert p["draft_rate"] == pytest.approx(p["best_rate"]) and 0 < p["draft_acceptance"] <= 1
    for name in fastspec.SOURCE_NAMES:
        mine = [p for p in trace if p["source"] == name]
        assert len(mine) == s.passes_by_source[name]
        assert sum(p["k"] for p in mine) == s.drafted_by_source[name]
        assert sum(p["accepted"] for p in mine) == s.accepted_by_source[name]
        assert sum(p["probe"] for p in mine) == s.probes_by_source[name]
    table = s.explain().splitlines()
    assert len(table) == len(trace) + 2


def test_the_trace_says_what_each_pass_chose_and_what_came_of_it(same, other):
    """generate(trace=True): one record a target pass, agreeing with the generation's counts;
    the output the same as without it; the promises weighed in the policy's own terms."""
    for lookup in (False, True):
        set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
        base = same.generate(PROMPT, max_tokens=160, lookup=lookup)
        set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
        r = same.generate(PROMPT, max_tokens=160, lookup=lookup, trace=True)
        assert r.tokens == base.tokens
        check_trace(r.stats, 10.0)                   # 1 / t1, as set
        used = {p["source"] for p in r.stats.trace}
        assert "draft" in used and ("lookup" in used) == lookup     # (a twin draft pays: drafted)
    # a draft that cannot pay: every pass the target alone, the draft's promise below it
    set_costs(other, t1=0.1, per_token=0.02, draft=0.2)
    t = other.generate(PROMPT, max_tokens=20, trace=True).stats.trace
    assert [p["source"] for p in t] == ["target"] * len(t)
    assert all(p["draft_rate"] < p["target_rate"] == p["best_rate"] and p["draft_acceptance"] > 0 for p in t[:-1])
    assert t[-1]["draft_rate"] == t[-1]["draft_acceptance"] == 0    # the last token: nothing to weigh
    # without trace=True: none, and nothing to explain
    plain = same.generate(PROMPT, max_tokens=5).stats
    assert plain.trace is None and plain.raw["trace"] is None
    with pytest.raises(ValueError, match="trace=True"):
        plain.explain()


def test_a_stream_keeps_its_trace(same):
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    pieces = list(same.stream(PROMPT, max_tokens=30, trace=True))
    trace = same.last_result.stats.trace
    assert len(trace) == len(pieces) == same.last_result.stats.n_target_passes
    assert [p["emitted"] for p in trace] == [len(x.tokens) for x in pieces]


def test_sampling_with_policy_runs(same):
    set_costs(same, t1=0.1, per_token=0.005, draft=0.005)
    a = same.generate(PROMPT, max_tokens=40, temperature=0.8, seed=3, lookup=True)
    b = same.generate(PROMPT, max_tokens=40, temperature=0.8, seed=3, lookup=True)
    assert len(a.tokens) > 0 and a.stats.n_generated == len(a.tokens)
    assert b.stats.n_generated == len(b.tokens)


def test_cost_model_set_checks():
    cm = _core.CostModel()
    with pytest.raises(ValueError):
        cm.set(verify_times={0: 0.1})
    with pytest.raises(ValueError):
        cm.set(verify_times={1: -1.0})
    cm.set(draft_time=0.01, verify_times={1: 0.1, 5: 0.2})
    assert cm.calibrated and cm.hold and cm.verify_times == {1: 0.1, 5: 0.2}


# -- the proposer interface --------------------------------------------------
def test_source_names_are_the_cores():
    assert fastspec.SOURCE_NAMES == _core.SOURCE_NAMES
    assert fastspec.SOURCE_NAMES[:3] == ("target", "draft", "lookup")


def test_lookup_proposer_unit():
    p = _core.LookupProposer(256)
    assert p.name == "lookup"
    seq = [5, 6, 7, 8, 9, 5, 6, 7]
    toks, conf, key = p.propose_for(seq, 4)
    assert toks == [8, 9, 5, 6] and key == 0 and all(c == -1.0 for c in conf)     # at the answer's start
    toks, conf, key = p.propose_for(seq[:-1], 4)
    assert toks == [7, 8, 9, 5] and key == 0
    toks, conf, key = p.propose_for(seq, 4, restart=False)                         # a token later
    assert toks == [8, 9, 5, 6] and key == 3                                        # the 3-gram matched
    assert p.propose_for(list(range(10, 40)), 4)[0] == []
    assert p.propose_for(seq, 1)[0] == [8]
    with pytest.raises(ValueError, match="ngram"):
        _core.LookupProposer(256, 3, 2)
    with pytest.raises(ValueError):
        p.propose_for([], 4)


def test_lookup_key_marks_a_copy_in_progress():
    p = _core.LookupProposer(256)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]           # the prompt
    toks, _, key = p.propose_for(seq, 2)
    assert toks == [4, 5] and key == 0                   # an answer's first token: a key of its own
    seq += [4]                                            # the target said 4
    toks, _, key = p.propose_for(seq, 2, restart=False)
    assert toks == [5, 6] and key == 4                   # a fresh match of 4 tokens
    p.feedback_for(2, 2)                                  # both kept, then the target said 7
    seq += [5, 6, 7]
    toks, _, key = p.propose_for(seq, 2, restart=False)
    assert toks == [8, 9] and key == 7 + 7               # the same copy, 7 tokens matched
    p.feedback_for(2, 1)                                  # 9 rejected: the copy broke off
    seq += [8, 10]
    toks, _, key = p.propose_for(seq, 2, restart=False)
    assert key < 8
    with pytest.raises(ValueError):
        p.feedback_for(1, 2)


def test_base_proposer_proposes_nothing():
    p = _core.Proposer()
    assert p.name == "target"
    assert p.propose_for([1, 2, 3]) == ([], [], 0)


def test_proposers_keyword_takes_free_proposers(bpe_pair):
    m = _core.Model(str(bpe_pair[0]))
    with _core.Context(m, n_ctx=256) as c:
        toks = m.tokenize(PASSAGE * 2)
        base = _core.Generator(c, None, adaptive=False, max_tokens=30)
        base.start(toks)
        base.run()
        g = _core.Generator(c, None, n_draft=4, adaptive=False, max_tokens=30,
                            proposers=[_core.LookupProposer(c.n_ctx + 1)])
        g.start(toks)
        g.run()
        assert g.tokens == base.tokens
        assert g.stats()["drafted_by_source"]["lookup"] > 0
        with pytest.raises(TypeError, match="Proposer"):
            _core.Generator(c, None, proposers=["not a proposer"])
        with pytest.raises(ValueError, match="source"):
            _core.Generator(c, None, proposers=[_core.Proposer()])
    m.close()


# -- one place for settings ----------------------------------------------------
def test_config_defaults_and_limits_agree():
    assert config.NGRAM_MIN == _core.NGRAM_MIN_DEFAULT == 2
    assert config.NGRAM_MAX == _core.NGRAM_MAX_DEFAULT == 8
    assert config.MAX_DRAFT == _core.DRAFT_LIMIT
    sig = inspect.signature(fastspec.SpeculativeDecoder.generate).parameters
    for f in GenerationConfig.__dataclass_fields__.values():
        assert sig[f.name].default == f.default, f.name


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(n_draft=0), ValueError, "n_draft"), (dict(n_draft=True), ValueError, "n_draft"),
    (dict(ngram_min=0), ValueError, "ngram"), (dict(ngram_max=9), ValueError, "ngram"),
    (dict(ngram_min=5, ngram_max=3), ValueError, "ngram"), (dict(seed="x"), ValueError, "seed"),
    (dict(stop=[1]), TypeError, "stop"), (dict(max_tokens=0), ValueError, "max_tokens"),
])
def test_config_checks(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        GenerationConfig(**kwargs)


def test_config_unknown_argument():
    with pytest.raises(TypeError, match="unexpected arguments: bogus"):
        GenerationConfig.from_kwargs(bogus=1)
    assert GenerationConfig.from_kwargs(stop="x").stop == ("x",)


# -- streams take the decoder only while iterated (issue #10) -----------------
def test_stream_not_iterated_holds_nothing(alone):
    it = alone.stream(PROMPT, max_tokens=5)          # never iterated
    assert alone.generate("hello", max_tokens=3).tokens is not None
    assert "".join(p.text for p in it) == alone.generate(PROMPT, max_tokens=5).text


def test_stream_bad_input_raises_at_the_call(alone):
    with pytest.raises(ValueError, match="temperature"):
        alone.stream(PROMPT, temperature=-1)
    with pytest.raises(TypeError, match="unexpected"):
        alone.stream(PROMPT, bogus=1)
    with pytest.raises(ValueError, match="empty"):
        alone.stream("")
    with pytest.raises(ValueError, match="vocabulary"):
        alone.stream([10 ** 9])
    with pytest.raises(ValueError, match="context"):
        alone.stream("hello world " * 600)
    assert alone.generate("hello", max_tokens=2).tokens is not None


def test_stream_gives_the_decoder_back(alone):
    it = alone.stream(PROMPT, max_tokens=40)
    next(it)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, alone.generate, "x")))
    t.start()
    t.join()
    assert errors and "another thread" in str(errors[0].value)
    it.close()                                        # closed early
    assert alone.generate("hello", max_tokens=2).tokens is not None
    it = alone.stream(PROMPT, max_tokens=40)
    next(it)
    del it                                            # dropped mid-way
    gc.collect()
    assert alone.generate("hello", max_tokens=2).tokens is not None
    list(alone.stream(PROMPT, max_tokens=5))          # exhausted
    assert alone.generate("hello", max_tokens=2).tokens is not None


def test_stream_error_during_iteration_gives_the_decoder_back(alone):
    it = alone.stream(PROMPT, max_tokens=40)
    alone._lock.acquire()                             # another user holds it
    try:
        with pytest.raises(RuntimeError, match="another thread"):
            next(it)
    finally:
        alone._lock.release()
    assert alone.generate("hello", max_tokens=2).tokens is not None


# -- what passes delivered against what was predicted ------------------------------
def test_realized_correction_starts_at_one_and_follows_the_evidence():
    acc = _core.AcceptanceModel()
    assert acc.realized("lookup", 0.1) == pytest.approx(1.0)
    # passes predicted to take 0.2 s that took 0.4 s: half the rate (tokens do not count:
    # the acceptance counts learn those)
    for _ in range(50):
        acc.record_pass("lookup", 4.0, 0.2, 2, 0.4)
    c = acc.realized("lookup", 0.1)
    assert 0.5 <= c < 0.6
    assert acc.realized("draft", 0.1) == pytest.approx(1.0)     # per source
    for _ in range(50):
        acc.record_pass("suffix", 4.0, 0.2, 1, 0.2)
    assert acc.realized("suffix", 0.1) == pytest.approx(1.0)
    # faster than predicted counts too, but is capped
    for _ in range(200):
        acc.record_pass("draft", 2.0, 0.4, 2, 0.2)
    assert acc.realized("draft", 0.1) == pytest.approx(1.2)
    acc.reset()
    assert acc.realized("lookup", 0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        acc.record_pass("nonsense", 1.0, 1.0, 1, 1.0)
    with pytest.raises(ValueError):
        acc.realized("target")


def test_a_few_passes_move_the_correction_little():
    acc = _core.AcceptanceModel()
    acc.record_pass("draft", 4.0, 0.2, 1, 0.5)           # one slow pass
    assert acc.realized("draft", 0.1) > 0.8


# -- the draft model reads the prompt only when first run -------------------------
def test_adaptive_draft_skips_the_prompt_until_used(bpe_pair):
    target, _, other = (str(p) for p in bpe_pair)
    tm, dm = _core.Model(target), _core.Model(other)
    with _core.Context(tm, n_ctx=256) as tc, _core.Context(dm, n_ctx=256) as dc:
        prompt = tm.tokenize(PASSAGE)
        gen = _core.Generator(tc, dc, max_tokens=20, adaptive=True)
        gen.start(prompt)
        assert tc.n_past == len(prompt) - 1
        assert dc.n_past == 0                              # not prefilled
        gen.calibrate()
        assert 0 < dc.n_past <= len(prompt) - 1            # timed on the prompt's own tokens
        fixed = _core.Generator(tc, dc, n_draft=3, adaptive=False, max_tokens=20)
        fixed.start(prompt)
        assert dc.n_past == len(prompt) - 1                # a fixed draft length drafts: prefilled


def test_lazy_draft_output_identical(same, other):
    """Whether the draft runs from the first pass (twin) or after catching up, greedy
    output is the target's."""
    for dec in (same, other):
        dec.cost_model.reset()
        dec.acceptance.reset()
        base = dec.generate(PASSAGE, max_tokens=50, speculative=False)
        r = dec.generate(PASSAGE, max_tokens=50)
        assert r.tokens == base.tokens


def test_a_slower_machine_moves_every_size():
    """Passes of one size that take twice as long, one after another (the target alone in a
    slow spell), are the machine's pace: every size's estimate and the draft's move with
    them, their ratios as measured; one slow pass moves little.  Sizes taking turns tell
    the sizes apart: one that is dear against the others becomes dearer than the pace."""
    cm = _core.CostModel()
    cm.set(verify_times={1: 0.1, 5: 0.3}, draft_time=0.02, hold=False)
    cm.record_verify(1, 0.15)
    assert 0.1 < cm.verify_times[1] < 0.115 and cm.verify_times[5] > 0.3
    ratio = cm.verify_times[5] / cm.verify_times[1]      # (the first pass after set() is a turn)
    assert ratio < 3.0
    for _ in range(100):
        cm.record_verify(1, 0.2)
    t = cm.verify_times
    assert t[1] == pytest.approx(0.2, rel=0.02)
    assert t[5] / t[1] == pytest.approx(ratio)           # all of it taken as the machine's pace
    # the draft's time follows the same pace: a slow spell slows both models alike
    assert cm.draft_time / 0.02 == pytest.approx(t[5] / 0.3) and cm.draft_time > 0.025
    assert cm.catchup_time == pytest.approx(cm.draft_time / 3)
    # sizes in turn, the one-token pass 1.5x what the model says against a 5-token one
    turns = _core.CostModel()
    turns.set(verify_times={1: 0.1, 5: 0.3}, hold=False)
    for _ in range(100):
        turns.record_verify(1, 0.15)
        turns.record_verify(5, 0.3)
    t = turns.verify_times
    assert t[1] == pytest.approx(0.15, rel=0.05) and t[5] == pytest.approx(0.3, rel=0.05)
    held = _core.CostModel()
    held.set(verify_times={1: 0.1})
    held.record_verify(1, 1.0)
    assert held.verify_times == {1: 0.1}
    with pytest.raises(ValueError):
        cm.record_verify(0, 0.1)


def test_passes_after_a_longer_context_cost_more_per_query():
    """Every query of a pass reads the whole cache: the cost model reads from the passes
    just after each jump of the context (a new prompt) what a cached token adds to a query,
    and prices a pass of n tokens after L cached tokens n times that more per token of
    context, so a verification batch is dearer against one token at a long context than at
    a short one."""
    cm = _core.CostModel()
    cm.set(verify_times={1: 0.030, 8: 0.090}, hold=False, at_context=200)
    assert cm.attn_time == 0.0
    for i in range(40):                                # one context only: nothing to fit
        cm.record_verify(1, 0.030, context=200)
    assert cm.attn_time == 0.0
    assert cm.verify_time(8, 1500) == pytest.approx(cm.verify_time(8, 200))
    slope = 6e-6                                       # seconds per query per cached token
    for i in range(40):                                # answers to prompts of four lengths
        for j in range(10):
            L = (100, 600, 1100, 1600)[i % 4] + j
            cm.record_verify(1, 0.029 + slope * L, context=L)
            if j % 4 == 1:
                cm.record_verify(8, 0.084 + 8 * slope * L, context=L)
    assert cm.attn_time == pytest.approx(slope, rel=0.1)
    short, long_ = (cm.verify_time(8, L) / cm.verify_time(1, L) for L in (100, 1600))
    assert short == pytest.approx((0.084 + 8 * slope * 100) / (0.029 + slope * 100), rel=0.05)
    assert long_ == pytest.approx((0.084 + 8 * slope * 1600) / (0.029 + slope * 1600), rel=0.05)
    assert long_ > short + 0.4
    # a context that explains the time is no surprise: the machine's pace stays put
    t = cm.verify_time(1, 100)
    for _ in range(50):
        cm.record_verify(1, 0.029 + slope * 1600, context=1600)
    assert cm.verify_time(1, 100) == pytest.approx(t, rel=0.03)
    # passes that get cheaper with context say nothing of attention
    neg = _core.CostModel()
    neg.set(verify_times={1: 0.05}, hold=False)
    for i in range(20):
        for j in range(6):
            L = (100, 1100)[i % 2] + j
            neg.record_verify(1, 0.05 - 1e-5 * L, context=L)
    assert neg.attn_time == 0.0
    held = _core.CostModel()
    held.set(verify_times={1: 0.03, 4: 0.06}, attn_time=5e-6, at_context=100)
    assert held.verify_time(4, 1100) == pytest.approx(0.06 + 4 * 5e-6 * 1000)
    held.record_verify(1, 1.0, context=2000)
    assert held.attn_time == 5e-6 and held.verify_times == {1: 0.03, 4: 0.06}
    with pytest.raises(ValueError):
        held.set(attn_time=-1.0)
    for bad in (-1, 1.5, "x", True):
        with pytest.raises(ValueError, match="context"):
            held.record_verify(1, 0.1, context=bad)
    with pytest.raises(ValueError):
        held.verify_time(1, -5)


def test_a_slow_spell_on_a_long_prompt_is_the_pace_not_attention():
    """The attention's cost is read where the context jumps (a new prompt), from the cost
    model's surprise at the passes just after the jump, the model as it was at the jump (the
    pace it had followed up to then); a slow spell that falls on one long prompt is then the
    machine's, not the context's, and the median of the jumps' readings leaves it out (a line
    through every pass took it for attention: 400 us a cached token after one spell on a
    Spec-Bench run, after which a one-token pass after 100 tokens was priced at a microsecond)."""
    slope, base = 6e-6, 0.029
    cm = _core.CostModel()
    cm.set(verify_times={1: 0.030, 8: 0.090}, hold=False, at_context=100)

    def answer(prompt, pace=1.0, n=40):
        for i in range(n):
            L = prompt + i
            cm.record_verify(1, pace * (base + slope * L), context=L)
            if i % 5 == 4:
                cm.record_verify(8, pace * (0.084 + 8 * slope * L), context=L)

    for prompt in (100, 700, 150, 1200, 60, 900, 200, 1500, 80):
        answer(prompt)
    assert cm.attn_time == pytest.approx(slope, rel=0.15)
    answer(1500, pace=2.5)                       # a slow spell, all through a long prompt
    for prompt in (100, 60):
        answer(prompt)
    assert cm.attn_time == pytest.approx(slope, rel=0.15)
    for L in (100, 1500):
        assert cm.verify_time(1, L) == pytest.approx(base + slope * L, rel=0.1)
        assert cm.verify_time(8, L) == pytest.approx(0.084 + 8 * slope * L, rel=0.15)


def test_a_few_tokens_behind_costs_the_draft_a_decode_each(bpe_pair):
    """Calibration times a two-token draft catch-up (as after a pass whose drafts were all
    accepted) apart from a long one; before any is seen, a short catch-up is priced like
    one decode per token."""
    cm = _core.CostModel()
    cm.set(draft_time=0.02, hold=False)
    assert cm.catchup_small_time == pytest.approx(0.02)
    assert cm.catchup_time == pytest.approx(0.02 / 3)
    target, _, other = (str(p) for p in bpe_pair)
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512) as dec:
        r = dec.generate(PASSAGE, max_tokens=8)
        c = dec.cost_model
        assert c.calibrated and c.catchup_small_time >= 0.0 and c.catchup_time >= 0.0
        # the passes are priced after the cache they read: the last one's context
        n_prompt = len(dec.tokenize(PASSAGE))
        assert n_prompt <= c.context < n_prompt + r.stats.n_generated


def test_generation_lengths_are_learned(same):
    """How long generations run (what a probe's evidence can serve) is learned from those
    that end by themselves; one cut short by max_tokens says only that it would have run
    at least that long: nothing before a length is known or when shorter than the mean,
    else it raises the mean."""
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    assert same.acceptance.mean_length == 0.0
    same.generate(PROMPT, max_tokens=20)
    assert same.acceptance.mean_length == 0.0
    base = same.generate(PROMPT, max_tokens=40, speculative=False)
    stop = base.text[len(base.text) // 2:][:3]
    r = same.generate(PROMPT, max_tokens=40, stop=stop)
    assert r.finish_reason == "stop"
    m = same.acceptance.mean_length
    assert 0 < m <= 40
    same.generate(PROMPT, max_tokens=2)                 # cut below the mean: nothing learned
    assert same.acceptance.mean_length == m
    long = same.generate(PROMPT, max_tokens=int(m) + 30)
    # cut above the mean (or ended by itself): it ran at least that long
    assert long.finish_reason in ("length", "stop")
    assert same.acceptance.mean_length == pytest.approx(m + 0.3 * (long.stats.n_generated - m))
    acc = _core.AcceptanceModel()
    acc.record_length(100)
    acc.record_length(50)
    assert acc.mean_length == pytest.approx(85.0)
    with pytest.raises(ValueError):
        acc.record_length(-1)


def test_the_free_proposers_share_is_a_moving_average():
    """What share of recent generations' output free proposers made beside the draft model:
    the newest weighs most; kept by copy/restore, forgotten by reset."""
    acc = _core.AcceptanceModel()
    assert acc.free_share == 0.0
    acc.record_free_share(0.9)
    acc.record_free_share(0.1)
    assert acc.free_share == pytest.approx(0.9 + 0.3 * (0.1 - 0.9))
    assert acc.copy().free_share == pytest.approx(acc.free_share)
    # long prompts' shares kept apart; a kind not seen yet takes the other's
    assert acc.free_share_of(True) == pytest.approx(acc.free_share)
    acc.record_free_share(0.95, long_prompt=True)
    assert acc.free_share_of(True) == pytest.approx(0.95)
    assert acc.free_share_of(False) == pytest.approx(0.9 + 0.3 * (0.1 - 0.9))
    assert acc.copy().free_share_of(True) == pytest.approx(0.95)
    other = _core.AcceptanceModel()
    other.restore(acc)
    assert other.free_share_of(True) == pytest.approx(0.95)
    acc.reset()
    assert acc.free_share == 0.0 and acc.free_share_of(True) == 0.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            acc.record_free_share(bad)


def test_how_often_long_prompts_answers_copied_at_length_is_a_moving_average():
    """Whether recent long-prompt answers copied the part of the prompt a windowed draft
    skips at length: the newest weighs most; kept by copy/restore, forgotten by reset."""
    acc = _core.AcceptanceModel()
    assert acc.copies_at_length == 0.0
    acc.record_copies_at_length(True)
    assert acc.copies_at_length == pytest.approx(1.0)
    acc.record_copies_at_length(False)
    assert acc.copies_at_length == pytest.approx(0.7)
    assert acc.copy().copies_at_length == pytest.approx(0.7)
    other = _core.AcceptanceModel()
    other.restore(acc)
    assert other.copies_at_length == pytest.approx(0.7)
    acc.reset()
    assert acc.copies_at_length == 0.0


def test_the_drafts_catch_up_is_spread_over_what_the_free_proposers_leave(same):
    """In combined mode the draft model serves only the tokens lookup does not: where recent
    answers came mostly from lookup (a run of code edits), reading a new prompt for the draft
    is spread over that small rest and not paid at the answer's first token; where they did
    not, it is.  A combined generation records its free share.  Output stays the target's."""
    def run(history, prompt):      # (a prompt the draft's cache does not hold: it has to read it)
        same.cost_model.set(draft_time=0.005, catchup_time=0.02,
                            verify_times={n: 0.1 + (n - 1) * 0.005 for n in range(1, 34)})
        same.acceptance.reset()
        for h in history:
            same.acceptance.record_free_share(h)
        r = same.generate(prompt, max_tokens=40, lookup=True)
        assert r.tokens == same.generate(prompt, max_tokens=40, speculative=False).tokens
        return r
    s = run([], "a " + PASSAGE).stats
    assert s.raw["draft_first_at"] == 0
    made = sum(v for k, v in s.emitted_by_source.items() if k not in ("target", "draft"))
    assert same.acceptance.free_share == pytest.approx(made / s.n_generated)
    assert run([0.97] * 4, "so " + PASSAGE).stats.raw["draft_first_at"] != 0


def test_the_free_share_a_long_prompt_expects_is_that_of_long_prompts(bpe_pair):
    """What lookup makes of an answer follows what its prompt gives it to copy: after long
    prompts whose answers lookup made (code edits) and short ones it did not (chat), a long
    prompt's draft start is weighed against the long prompts' share (not started at the
    answer's first token), a short prompt's against the short ones' (started there); the
    generation records its share under its own kind.  Output unchanged."""
    target, twin, _ = (str(p) for p in bpe_pair)
    long = " ".join([PASSAGE] * 8)
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        assert len(dec.tokenize(long)) > _core.LONG_PROMPT_TOKENS
        assert len(dec.tokenize("a " + PASSAGE)) <= _core.LONG_PROMPT_TOKENS

        def run(prompt):
            dec.cost_model.set(draft_time=0.005, catchup_time=0.0005,
                               verify_times={n: 0.1 + (n - 1) * 0.005 for n in range(1, 34)})
            dec.acceptance.reset()
            for _ in range(4):
                dec.acceptance.record_free_share(0.02)
                dec.acceptance.record_free_share(0.97, long_prompt=True)
            long_before = dec.acceptance.free_share_of(True)
            r = dec.generate(prompt, max_tokens=40, lookup=True)
            assert r.tokens == dec.generate(prompt, max_tokens=40, speculative=False).tokens
            dec._draft_ctx.keep_prefix([])          # the next reads its prompt anew
            return r.stats, long_before
        s, long_before = run("a " + PASSAGE)
        assert s.raw["draft_first_at"] == 0
        if s.n_generated >= _core.FREE_SHARE_MIN_TOKENS:   # recorded as a short prompt's share
            assert dec.acceptance.free_share_of(True) == pytest.approx(long_before)
        s, _ = run(long)
        assert s.raw["draft_first_at"] != 0


def test_tokens_left_weigh_short_answers_and_follow_the_answer():
    """What a one-off cost (a catch-up, a probe) is spread over: before any generation
    ended, half of what max_tokens allows; then the harmonic mean of the recent lengths
    still running at what this answer has run (no shorter than it), less that: short
    answers weigh as their share of the time says (a loss on a 30-token answer is as felt
    as a gain on a 130-token one), and an answer that has outrun the short ones is
    reckoned a long one."""
    acc = _core.AcceptanceModel()
    assert acc.tokens_left(0, 200) == pytest.approx(100.0)
    acc.record_length(130)
    acc.record_length(30)
    at_start = acc.tokens_left(0, 500)
    harmonic = (1 + 0.8) / (1 / 30 + 0.8 / 130)
    assert at_start == pytest.approx(harmonic) and at_start < (30 + 130) / 2
    assert acc.tokens_left(10, 500) == pytest.approx(harmonic - 10)
    # a length counts the tokens before the end token: at its own length the short one's
    # last pass is still to come, so it still says how long this runs
    # (no fewer than a quarter of the usual length: past it, it may still go on)
    assert acc.tokens_left(30, 500) == pytest.approx(max(harmonic - 30, 0.25 * acc.mean_length))
    assert acc.tokens_left(30, 500) < 30
    # past the short one: only the long one is left to say how long this runs
    assert acc.tokens_left(31, 500) == pytest.approx(99.0)
    assert acc.tokens_left(40, 500) == pytest.approx(90.0)
    assert acc.tokens_left(40, 50) == pytest.approx(50.0)            # no more than max_tokens allows
    # past every length seen: it may still go on a little
    assert acc.tokens_left(400, 500) == pytest.approx(0.25 * acc.mean_length)
    with pytest.raises(ValueError):
        acc.tokens_left(-1, 10)
    # an answer that ended at once is no length to divide by
    acc.record_length(0)
    assert acc.tokens_left(0, 500) == pytest.approx(at_start, rel=0.05)


def test_a_long_catch_up_reads_only_the_last_tokens(bpe_pair):
    """An adaptive draft far behind (a long new prompt) decodes only the last
    DRAFT_CATCHUP_WINDOW tokens of what it missed; the stretch before is left out of its
    cache.  Greedy output stays the target's."""
    target, twin, _ = (str(p) for p in bpe_pair)
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        set_costs(dec, t1=0.1, per_token=0.01, draft=0.005)     # a draft that pays from the first pass
        long = " ".join([PASSAGE] * 8)
        n_prompt = len(dec.target_model.tokenize(long))
        assert n_prompt > _core.DRAFT_CATCHUP_WINDOW + 10
        base = dec.generate(long, max_tokens=30, speculative=False)
        r = dec.generate(long, max_tokens=30)
        assert r.tokens == base.tokens
        assert r.stats.raw["n_draft_steps"] > 0
        start, n = dec._draft_ctx.skipped
        assert start + n == n_prompt - _core.DRAFT_CATCHUP_WINDOW
        # what a windowed draft's tokens and looks showed went into the window's factor,
        # not into the table by the target's certainty (that is of drafts that read it all)
        assert sum(c[1] for c in dec.acceptance.target_gap_counts()) == 0
        assert dec.acceptance.window_agreement(1.0) != pytest.approx(_core.AcceptanceModel().window_agreement(1.0))
        # the share of the prompt the window left unread (what the factor is taken at)
        assert r.stats.raw["draft_unread"] == pytest.approx(n / n_prompt)


def test_a_draft_the_window_costs_reads_all_of_the_prompt(bpe_pair):
    """Where a windowed draft has been seen to agree far less than a draft that read the
    prompt (the window's factor, learned) and reading the rest costs little, the policy
    has the draft read all of it: nothing is left out of its cache.  Output unchanged."""
    target, twin, _ = (str(p) for p in bpe_pair)
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        set_costs(dec, t1=0.1, per_token=0.01, draft=0.005, catchup=0.0005)
        for _ in range(200):
            dec.acceptance.record_windowed(9.0, False)
        assert dec.acceptance.window_agreement() < 0.1
        long = " ".join([PASSAGE] * 8)
        base = dec.generate(long, max_tokens=30, speculative=False)
        r = dec.generate(long, max_tokens=30)
        assert r.tokens == base.tokens
        assert r.stats.raw["draft_read_all"] == 1 and r.stats.raw["n_draft_steps"] > 0
        assert dec._draft_ctx.skipped is None and r.stats.raw["draft_unread"] == 0.0


def test_a_read_of_all_the_prompt_is_a_bet_on_no_more_than_the_answer_has_run(bpe_pair):
    """After answers cut at max_tokens the decoder expects a long one, but reading all of a
    long prompt is paid for this answer alone: its cost is spread over no more tokens than
    the answer has run (READ_ALL_HORIZON_TOKENS while it has run fewer).  A read that pays
    only over the long answers seen before is not made early in the answer (spread over
    the 128 tokens the history promises, 3 s was read 5 tokens in; over 32, it costs about
    a target pass a token, more than any draft can save); one that pays within the horizon
    is made.  Output unchanged either way."""
    target, twin, _ = (str(p) for p in bpe_pair)
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        long = " ".join([PASSAGE] * 8)
        n_prompt = len(dec.tokenize(long))
        assert n_prompt > 2 * _core.DRAFT_CATCHUP_WINDOW
        base = dec.generate(long, max_tokens=128, speculative=False)
        for t_all, reads in ((3.0, False), (0.1, True)):
            set_costs(dec, t1=0.1, per_token=0.01, draft=0.005, catchup=t_all / n_prompt)
            for _ in range(200):
                dec.acceptance.record_windowed(9.0, False)      # the window: no use
            for _ in range(8):
                dec.acceptance.record_cut(128)
            assert dec.acceptance.tokens_left(0, 128) > 120.0
            r = dec.generate(long, max_tokens=128)
            assert r.tokens == base.tokens
            at = r.stats.raw["draft_read_all_at"]
            assert r.stats.raw["draft_read_all"] == int(at >= 0)
            assert (at >= 0) if reads else (at == -1 or at >= 32)
            if reads:       # (else the windowed draft, its start capped alike, may not run)
                assert r.stats.raw["n_draft_steps"] > 0
            dec._draft_ctx.keep_prefix([])          # the next reads the prompt anew


def test_a_read_of_all_the_prompt_at_the_first_token_follows_how_often_long_prompts_were_copied(bpe_pair):
    """Where recent long prompts' answers copied the part a windowed draft skips at length
    (a run of code edits), the next long prompt's answer is likely to as well: reading all
    of it is weighed over the tokens the answer is expected to run, not only the first few
    (READ_ALL_HORIZON_TOKENS), as often as they did.  A read that pays only over the long
    answers seen before is made at the answer's first token after such answers, and not
    after answers that did not copy (as above).  Output unchanged either way; the
    generation records whether it copied at length (this random-weight pair's answers do
    not)."""
    target, twin, _ = (str(p) for p in bpe_pair)
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        long = " ".join([PASSAGE] * 8)
        n_prompt = len(dec.tokenize(long))
        base = dec.generate(long, max_tokens=128, speculative=False)
        for copied in (True, False):
            set_costs(dec, t1=0.1, per_token=0.01, draft=0.005, catchup=3.0 / n_prompt)
            for _ in range(200):
                dec.acceptance.record_windowed(9.0, False)      # the window: no use
            for _ in range(8):
                dec.acceptance.record_cut(128)
                dec.acceptance.record_copies_at_length(copied)
            r = dec.generate(long, max_tokens=128)
            assert r.tokens == base.tokens
            at = r.stats.raw["draft_read_all_at"]
            assert (at == 0) if copied else (at == -1 or at >= 32)
            runs = _core.copy_runs(dec.tokenize(long), base.tokens)
            at_length = max((run for run, _ in runs), default=0) >= _core.COPY_RUN_MIN_TOKENS
            before = 1.0 if copied else 0.0
            assert dec.acceptance.copies_at_length == pytest.approx(before + 0.3 * (at_length - before))
            dec._draft_ctx.keep_prefix([])          # the next reads the prompt anew


def test_a_windowed_start_is_a_bet_on_no_more_than_the_answer_has_run(bpe_pair):
    """After answers cut at max_tokens the decoder expects a long one, but a draft started on
    a long prompt (its head and last window read at once) is paid for this answer alone, and
    the recent lengths come from other texts (Spec-Bench: a 10-token rag answer after
    128-token ones).  Its catch-up is spread over no more tokens than the answer has run
    (READ_ALL_HORIZON_TOKENS while it has run fewer): one that pays only over the 128 tokens
    the history promises is not read at the answer's first token; one that pays within the
    horizon is.  Output unchanged either way."""
    target, twin, _ = (str(p) for p in bpe_pair)
    h = _core.READ_ALL_HORIZON_TOKENS
    with fastspec.SpeculativeDecoder(target, twin, n_ctx=1024) as dec:
        long = " ".join([PASSAGE] * 8)
        n_read = _core.DRAFT_CATCHUP_HEAD + _core.DRAFT_CATCHUP_WINDOW
        assert len(dec.tokenize(long)) > n_read + 32       # read as its head and last window
        base = dec.generate(long, max_tokens=128, speculative=False)
        # at the draft's prior acceptance a draft pass saves about 0.046 s a token: a 1.5 s
        # catch-up (at the windowed margin, 2.25 s) pays over 128 tokens, not over 16
        for t_read, first in ((1.5, False), (0.1, True)):
            set_costs(dec, t1=0.1, per_token=0.01, draft=0.005, catchup=t_read / n_read)
            for _ in range(8):
                dec.acceptance.record_cut(128)
            assert dec.acceptance.tokens_left(0, 128) > 120.0
            assert dec.acceptance.one_off_tokens(0, 128) == pytest.approx(h)
            r = dec.generate(long, max_tokens=128)
            assert r.tokens == base.tokens
            at = r.stats.raw["draft_first_at"]
            assert (at == 0) if first else (at == -1 or at >= _core.DRAFT_PROBE_AFTER_TOKENS)
            assert r.stats.raw["draft_read_all"] == 0
            dec._draft_ctx.keep_prefix([])          # the next reads the prompt anew


def test_one_off_tokens_are_no_more_than_the_answer_has_run():
    """What a bet on this answer's length (reading all of a long prompt) is spread over:
    tokens_left, capped at what the answer has run, or READ_ALL_HORIZON_TOKENS before."""
    h = _core.READ_ALL_HORIZON_TOKENS
    assert 0 < h < 128
    acc = _core.AcceptanceModel()
    for _ in range(8):
        acc.record_cut(128)
    assert acc.tokens_left(0, 128) > 120.0
    assert acc.one_off_tokens(0, 128) == pytest.approx(h)
    assert acc.one_off_tokens(h - 3, 128 - h + 3) == pytest.approx(h)
    assert acc.one_off_tokens(50, 78) == pytest.approx(50.0)
    assert acc.one_off_tokens(100, 28) == pytest.approx(acc.tokens_left(100, 28))
    acc = _core.AcceptanceModel()
    acc.record_length(10)                   # short answers: tokens_left is lower still
    assert acc.one_off_tokens(0, 128) == pytest.approx(acc.tokens_left(0, 128))
    assert acc.one_off_tokens(0, 128) < h
    with pytest.raises(ValueError):
        acc.one_off_tokens(-1, 10)


def test_a_catch_up_over_generated_tokens_is_evidence(same, bpe_pair):
    """Greedy: when the draft catches up with tokens the target emitted that it was not
    asked about (here the token each all-accepted pass adds after the drafts), its
    prediction at each is compared with the token that followed -- acceptance evidence
    without a verification pass.  The twin draft would have proposed every one, so each
    counts as a hit: an off-by-one in the comparison would count misses.  Not at sampling
    temperatures."""
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    base = same.generate(PROMPT, max_tokens=160, speculative=False)
    r = same.generate(PROMPT, max_tokens=160)
    assert r.tokens == base.tokens
    looked = r.stats.raw["n_draft_looked"]
    assert looked > 0 and r.stats.n_accepted == r.stats.n_drafted
    hits, tries = same.acceptance.counts()["draft"][0]
    assert hits == pytest.approx(tries) == pytest.approx(r.stats.n_accepted + looked)
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    s = same.generate(PROMPT, max_tokens=160, temperature=0.8, seed=3)
    assert s.stats.raw["n_draft_steps"] > 0 and s.stats.raw["n_draft_looked"] == 0


def test_a_free_proposer_that_over_promises_here_is_set_aside_within_the_generation():
    """Evidence carried from other texts says this (source, key) is right 95 % of the time;
    in this generation its confident proposals fail.  One or two misses set it aside,
    instead of the many its carried counts would take to outweigh."""
    cost = _core.CostModel()
    cost.set(verify_times={n: 0.035 + 0.02 * (n - 1) for n in range(1, 34)})
    acc = _core.AcceptanceModel()
    for _ in range(10):
        acc.record("suffix", 3, 8, 8)          # other conversations' copies: 80 of 80
    acc.record("suffix", 3, 8, 4)
    pol = _core.Policy(cost, acc)
    confs = [0.8] * 6
    k, e, r = pol.choose_free("suffix", 3, confs)
    assert k >= 4 and r > 1 / 0.035 and pol.calibration("suffix") == 1.0
    misses = 0
    while pol.choose_free("suffix", 3, confs)[0] > 0:
        pol.record_free("suffix", 3, confs[:2], 0)      # its first token rejected
        misses += 1
        assert misses <= 3
    assert misses <= 2
    assert pol.calibration("suffix") < 0.6
    # the carried evidence alone would still say verify: what set it aside is this generation
    assert acc.rate("suffix", 3) > 0.85
    assert _core.Policy(cost, acc).choose_free("suffix", 3, confs)[0] > 0


def test_a_free_proposer_that_delivers_what_it_promised_keeps_its_chances():
    cost = _core.CostModel()
    cost.set(verify_times={n: 0.035 + 0.02 * (n - 1) for n in range(1, 34)})
    acc = _core.AcceptanceModel()
    pol = _core.Policy(cost, acc)
    confs = [0.9] * 8
    for _ in range(12):
        pol.record_free("lookup", 4, confs, 8)
    assert pol.calibration("lookup") == 1.0
    assert pol.choose_free("lookup", 4, confs)[0] == 8
    # a miss now and then, as its chances say: the factor stays close to 1
    pol.record_free("lookup", 4, confs, 0)
    assert pol.calibration("lookup") > 0.9
    with pytest.raises(ValueError, match="free proposer"):
        pol.choose_free("draft", 0, confs)
    with pytest.raises(ValueError, match="unknown source"):
        pol.calibration("nonsense")
    with pytest.raises(ValueError, match="0 <= a"):
        pol.record_free("lookup", 4, confs, 9)
    with pytest.raises(ValueError, match="confidences"):
        pol.choose_free("lookup", 4, [])
    with pytest.raises(TypeError):
        pol.choose_free("lookup", 4, [0.5, "high"])


def test_calibration_times_every_size_at_least_twice():
    """A shape's first pass in a process pays one-off costs, so the calibration times the long
    sizes (interpolated between) in two rounds of its three and the short ones in all three,
    only sizes that fit the context."""
    plan = _core.calibration_rounds(17, 17)
    assert len(plan) == 3
    assert plan[0] == plan[1] == [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17]
    assert plan[2] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert _core.calibration_rounds(9, 17) == [[2, 3, 4, 5, 6, 7, 8, 9]] * 3
    assert _core.calibration_rounds(17, 5) == [[2, 3, 4, 5]] * 3
    assert _core.calibration_rounds(1, 17) == [[], [], []]


def test_calibration_keeps_each_size_against_the_one_token_passes_beside_it():
    """The calibration times every short size in three rounds, each between two one-token
    passes: a slow spell over one size (outside load) is left out even where it hit that
    size in two rounds of three, and one over a whole round moves the sizes and their
    reference alike."""
    calm = (0.030, {2: 0.045, 3: 0.055, 8: 0.066, 12: 0.15}, 0.030)
    spike = (0.030, {2: 0.090, 3: 0.055, 8: 0.200}, 0.030)   # sizes 2 and 8 hit by a slow spell
    slow = (0.060, {2: 0.090, 3: 0.110, 8: 0.300}, 0.060)    # the whole round slowed, 8 hit again
    c = _core.calibrated_costs([calm, spike, slow])
    assert c[1] == pytest.approx(0.030)
    assert c[2] == pytest.approx(0.045) and c[3] == pytest.approx(0.055)
    assert c[8] == pytest.approx(0.066)                   # the median ratio would say 0.15
    assert c[12] == pytest.approx(0.15)                   # timed in one round only
    assert set(c) == {1, 2, 3, 8, 12}
    with pytest.raises(ValueError, match="no calibration"):
        _core.calibrated_costs([])
    with pytest.raises(ValueError, match="> 0"):
        _core.calibrated_costs([(0.0, {2: 0.04}, 0.03)])
    with pytest.raises(ValueError, match="sizes >= 2"):
        _core.calibrated_costs([(0.03, {1: 0.04}, 0.03)])


def test_a_doubtful_free_proposal_is_probed_with_few_tokens():
    """A free proposal's tokens are evidence only up to its first miss: a probe of one
    whose mean acceptance does not pay verifies few of its tokens (each one more grows the
    pass, while the evidence it brings shrinks with the chance all before it passed), and
    it is tried only where there is enough left to generate for the lesson to pay."""
    cost = _core.CostModel()
    cost.set(verify_times={n: 0.035 * (1 + 0.45 * (n - 1)) for n in range(1, 34)})
    acc = _core.AcceptanceModel()
    for _ in range(3):
        acc.record("lookup", 2, 4, 1)              # 2 tested, 1 kept
        acc.record("lookup", 2, 1, 0)
    assert 0.3 < acc.rate("lookup", 2) < 0.4
    pol = _core.Policy(cost, acc)
    assert pol.choose_free("lookup", 2, [0.9] * 8)[0] == 0     # not on its mean
    assert pol.probe_free("lookup", 2, 8, 0.0) == (False, 0)
    assert pol.probe_free("lookup", 2, 8, 5.0) == (False, 0)
    assert pol.probe_free("lookup", 2, 8, 100.0) == (True, 1)
    assert pol.probe_free("lookup", 2, 8, 1e4) == (True, 1)
    # an untried proposer (prior mean 0.5) is worth a longer look where much is left
    fresh = _core.Policy(cost, _core.AcceptanceModel())
    worth, k = fresh.probe_free("lookup", 2, 8, 1e3)
    assert worth and 1 <= k <= 8
    with pytest.raises(ValueError, match="n must be"):
        pol.probe_free("lookup", 2, 0, 10.0)
    with pytest.raises(ValueError, match="future"):
        pol.probe_free("lookup", 2, 8, -1.0)
    with pytest.raises(ValueError, match="free proposer"):
        pol.probe_free("draft", 0, 8, 10.0)


def test_a_draft_confident_on_other_texts_is_recalibrated_within_the_generation():
    """The draft's acceptance by its own confidence is carried across generations; on a
    text where its confident tokens fail, a few misses (drafted or looked at) lower what
    the policy expects of them in this generation, and a new generation starts afresh."""
    cost = _core.CostModel()
    cost.set(draft_time=0.01, verify_times={n: 0.035 + 0.01 * (n - 1) for n in range(1, 34)})
    acc = _core.AcceptanceModel()
    pol = _core.Policy(cost, acc)
    for _ in range(40):
        pol.record_draft(0.95, True)               # other texts: confident and right
    before = pol.draft_token_chance(0.95)
    assert before > 0.9 and pol.calibration("draft") == 1.0
    pol2 = _core.Policy(cost, acc)                 # the next generation
    for _ in range(3):
        pol2.record_draft(0.95, False)
    assert pol2.calibration("draft") < 0.5
    assert pol2.draft_token_chance(0.95) < 0.5 * before
    assert _core.Policy(cost, acc).draft_token_chance(0.95) > 0.8     # carried: still trusted
    with pytest.raises(ValueError, match="conf"):
        pol2.record_draft(1.5, True)


def test_the_targets_certainty_says_how_the_draft_will_do_here():
    """Greedy: the draft agrees with the target where the target is sure (its two best
    logits far apart) and about half the time where it is not (learned across
    generations).  A generation whose tokens the target emits sure of them expects more
    of the draft than the evidence carried from other texts says, one whose tokens are
    unsure expects less -- before the draft has read a token of it."""
    cost = _core.CostModel()
    cost.set(draft_time=0.01, verify_times={n: 0.035 + 0.01 * (n - 1) for n in range(1, 34)})
    acc = _core.AcceptanceModel()
    for i in range(40):
        acc.record_target_gap(9.0, True)
        acc.record_target_gap(0.2, i % 2 == 0)
    assert acc.draft_agreement(9.0) > 0.95 and 0.4 < acc.draft_agreement(0.2) < 0.6
    for _ in range(3):
        acc.record("draft", 0, 4, 1)                   # other texts: 3 of 6 tested tokens kept
    carried = _core.Policy(cost, acc).draft_rate()
    assert carried == pytest.approx(acc.rate("draft"))  # nothing emitted yet: the carried rate
    sure, unsure = _core.Policy(cost, acc), _core.Policy(cost, acc)
    for _ in range(16):
        sure.record_target_token(9.0)
        unsure.record_target_token(0.2)
    assert sure.draft_rate() > 0.8 > carried
    assert unsure.draft_rate() < carried
    # the first few emitted tokens move it less than many
    few = _core.Policy(cost, acc)
    few.record_target_token(9.0)
    assert carried < few.draft_rate() < carried + 0.1
    # what the draft's own tokens show here outweighs the table as they come
    high = sure.draft_rate()
    for _ in range(8):
        acc.record("draft", 0, 2, 0)               # here: 8 first tokens rejected
    assert sure.draft_rate() < high - 0.15
    for _ in range(4):
        sure.record_draft(0.9, False, gap=9.0)      # into the table, under its sure bucket
    counts = acc.target_gap_counts()
    assert len(counts) == len(_core.TARGET_GAP_EDGES) + 1
    assert counts[-1] == (44.0 - 4.0, 44.0) and counts[0] == (20.0, 40.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="gap"):
            acc.record_target_gap(bad, True)
        with pytest.raises(ValueError, match="gap"):
            sure.record_target_token(bad)
        with pytest.raises(ValueError, match="gap"):
            sure.record_draft(0.5, True, gap=bad)
    with pytest.raises(TypeError):
        acc.draft_agreement("sure")


def test_a_draft_reading_a_window_of_a_long_prompt_is_expected_to_agree_less():
    """A draft that read only a window of a long prompt agrees with the target less than
    the certainty table says of one that read it all, the less the more of the prompt the
    window left unread; the factor's scale is learned from such a draft's own tokens, which
    leave the table as it was."""
    acc = _core.AcceptanceModel()
    assert acc.window_agreement() == pytest.approx(1.0)        # nothing unread: no loss
    assert 0.5 < acc.window_agreement(0.7) < acc.window_agreement(0.3) < 1.0
    prior = acc.window_agreement(0.5)
    empty = acc.target_gap_counts()
    for _ in range(100):
        acc.record_windowed(9.0, True, 0.5)      # agrees wherever the table says it would
    assert acc.window_agreement(0.5) > 0.95 > prior
    assert acc.target_gap_counts() == empty
    bad = _core.AcceptanceModel()
    for i in range(50):
        bad.record_windowed(9.0, i % 2 == 0)     # half of what the table promises
    assert bad.window_agreement() < 0.65
    assert bad.window_agreement(0.6) < bad.window_agreement(0.2) < bad.window_agreement()
    bad.reset()
    assert bad.window_agreement(0.5) == pytest.approx(prior)
    with pytest.raises(ValueError, match="gap"):
        acc.record_windowed(-1.0, True)
    with pytest.raises(ValueError, match="unread"):
        acc.record_windowed(9.0, True, 1.5)
    with pytest.raises(ValueError, match="unread"):
        acc.window_agreement(-0.1)


def test_copies_from_the_prompt_a_windowed_draft_skips_are_not_evidence_of_it():
    """A generated token ending a 4-gram of the prompt's unread middle (after its first
    DRAFT_HEAD, before its last DRAFT_CATCHUP_WINDOW tokens) is a copy the target is sure
    of because it read it; the read parts and short prompts give no copies."""
    prompt = list(range(1000, 1200))
    middle, tail = prompt[60:65], prompt[-10:-5]
    assert _core.copied_from_unread(prompt, middle + [7]) == [False, False, False, True, True, False]
    assert not any(_core.copied_from_unread(prompt, tail))          # the window: read
    assert not any(_core.copied_from_unread(prompt, prompt[28:34]))  # no 4-gram wholly past the head
    assert not any(_core.copied_from_unread(prompt[:100], prompt[50:60]))   # nothing skipped
    # a copy spanning the prompt's end and the answer counts too
    assert _core.copied_from_unread(prompt[:150] + prompt[60:63], [prompt[63]]) == [True]
    assert _core.copied_from_unread([], []) == []


def test_copies_from_the_unread_prompt_make_a_run():
    """The loop counts the generated tokens copied from the prompt's unread middle in a run
    (an edit's answer: the file again) and keeps how much of the prompt follows the last
    copy's source; a run bears up to COPY_GAP_MAX tokens in a row that are no copy (an edit's
    renamed name: the new token and the 4-grams through it), more end it."""
    assert _core.COPY_RUN_MIN_TOKENS == 16 and _core.COPY_GAP_MAX_TOKENS == 8
    prompt = list(range(1000, 1200))
    runs = _core.copy_runs(prompt, prompt[60:70] + [7] + prompt[80:86])
    # a copy needs 4 tokens of the prompt: the 4th token on starts a run (source 64: 136 left)
    assert runs[:4] == [(0, 0), (0, 0), (0, 0), (1, 136)]
    assert runs[9] == (7, 130)
    # a changed token: it and the next 3 are no copy (their 4-grams hold it), the run bears them
    assert runs[10:14] == [(7, 130)] * 4
    assert runs[14:] == [(8, 200 - 84), (9, 200 - 85), (10, 200 - 86)]
    assert _core.copied_from_unread(prompt, prompt[60:70] + [7] + prompt[80:86]) == \
        [False] * 3 + [True] * 7 + [False] * 4 + [True] * 3
    # a longer change ends it: 9 changed tokens, 12 that are no copy; the run is 0 from the
    # 9th until copies come again
    gap = _core.COPY_GAP_MAX_TOKENS
    long = _core.copy_runs(prompt, prompt[60:70] + [7] * (gap + 1) + prompt[80:86])
    assert [r for r, _ in long[10:]] == [7] * gap + [0] * 4 + [1, 2, 3]
    assert long[-1] == (3, 200 - 86)
    # a copy lookup proposed counts as none (lookup serves such copies already): the run
    # bears it as a gap, and a stretch of them longer than COPY_GAP_MAX ends it
    answer = prompt[60:90]
    own = _core.copy_runs(prompt, answer)
    assert [r for r, _ in own] == [0, 0, 0] + list(range(1, 28))
    assert _core.copy_runs(prompt, answer, ["target"] * 30) == own
    assert _core.copy_runs(prompt, answer, ["target", "draft"] * 15) == own
    mixed = _core.copy_runs(prompt, answer, ["target"] * 10 + ["lookup"] * 5 + ["target"] * 15)
    assert [r for r, _ in mixed] == [0, 0, 0] + list(range(1, 8)) + [7] * 5 + list(range(8, 23))
    served = _core.copy_runs(prompt, answer, ["target"] * 10 + ["lookup"] * 9 + ["target"] * 11)
    assert [r for r, _ in served][10:] == [7] * 8 + [0] + list(range(1, 12))
    with pytest.raises(ValueError, match="one per generated token"):
        _core.copy_runs(prompt, answer, ["target"])
    with pytest.raises(ValueError, match="each one of"):
        _core.copy_runs(prompt, answer, ["oracle"] * 30)
    # a copy from another place of the prompt goes on with the run (here 62..65 recur at
    # 100..103, so the answer leaves one copy for the other with no token that is no copy;
    # the index knows the latest occurrence of a 4-gram, so the source is 104 from the 6th)
    twice = prompt[:100] + prompt[62:66] + prompt[104:]
    jump = _core.copy_runs(twice, twice[60:66] + twice[104:107])
    assert [r for r, _ in jump] == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    assert jump[4] == (2, 200 - 65) and jump[5] == (3, 200 - 104) and jump[8] == (6, 200 - 107)
    assert _core.copy_runs(prompt[:100], prompt[50:60]) == [(0, 0)] * 10    # nothing skipped


def test_the_loop_counts_no_copies_where_the_draft_reads_everything(same):
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    r = same.generate(PROMPT, max_tokens=40)
    assert r.stats.raw["n_copied_unread"] == 0


def test_the_loop_learns_the_draft_by_the_targets_certainty(same):
    """Greedy: every drafted token verified and every token a catch-up looked at adds to
    the draft's agreement by the target's certainty (the twin draft agrees at every one);
    at sampling temperatures nothing is added."""
    set_costs(same, t1=0.1, per_token=0.01, draft=0.05)
    base = same.generate(PROMPT, max_tokens=160, speculative=False)
    r = same.generate(PROMPT, max_tokens=160)
    assert r.tokens == base.tokens
    s = r.stats
    assert s.n_drafted > 0 and s.n_accepted == s.n_drafted
    counts = same.acceptance.target_gap_counts()
    agreed, tried = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert agreed == tried == s.n_drafted + s.raw["n_draft_looked"]
    same.generate(PROMPT, max_tokens=60, temperature=0.8, seed=5)
    assert same.acceptance.target_gap_counts() == counts


def test_answers_cut_by_max_tokens_say_the_next_runs_at_least_as_long():
    """Before any generation has ended by itself the policy expects half of what max_tokens
    allows; answers cut at the cap before say this one likely runs that long too (a
    lower bound: a short cut one does not shorten the estimate)."""
    acc = _core.AcceptanceModel()
    assert acc.tokens_left(0, 128) == pytest.approx(64.0)
    acc.record_cut(16)                               # a short warm-up: no lower than half
    assert acc.tokens_left(0, 128) == pytest.approx(64.0)
    for _ in range(8):
        acc.record_cut(128)
    assert acc.tokens_left(0, 128) > 120.0
    assert 14.0 < acc.tokens_left(100, 28) <= 28.0               # within what max_tokens allows
    assert acc.tokens_left(0, 50) == pytest.approx(50.0)
    acc.record_length(30)                            # one that ended by itself takes over
    assert acc.tokens_left(0, 128) == pytest.approx(30.0)
    with pytest.raises(ValueError):
        acc.record_cut(-1)


def test_acceptance_model_copy_and_restore():
    """copy() keeps what the model has seen; restore() puts exactly that back (every kind of
    evidence: counts, the draft's by confidence, answer lengths, the target's certainty, a
    windowed draft's agreement, the realized correction), whatever was recorded since."""
    a = _core.AcceptanceModel()

    def teach(m, ok):
        m.record("draft", 0, 4, 3 if ok else 0)
        m.record("lookup", 1, 3, 2 if ok else 0)
        m.record_length(40 if ok else 120)
        m.record_target_gap(2.0, ok)
        m.record_windowed(1.0, ok, 0.5)
        m.record_pass("draft", 2.0, 0.1, 2 if ok else 1, 0.12 if ok else 0.3)
        _core.Policy(_core.CostModel(), m).record_draft(0.95, ok)

    def state(m):
        return (m.counts(), m.mean_length, m.tokens_left(5, 100), m.target_gap_counts(),
                m.window_agreement(0.5), m.realized("draft"), m.rate("draft"), m.rate("lookup", 1),
                _core.Policy(_core.CostModel(), m).draft_token_chance(0.95))
    teach(a, True)
    snap = a.copy()
    before = state(a)
    assert isinstance(snap, _core.AcceptanceModel) and snap is not a and state(snap) == before
    teach(a, False)
    assert state(a) != before and state(snap) == before
    a.restore(snap)
    assert state(a) == before
    fresh = _core.AcceptanceModel()
    a.restore(fresh)
    assert state(a) == state(fresh)
    with pytest.raises(TypeError):
        a.restore(None)


def test_the_draft_starts_on_a_long_read_only_at_a_clear_edge():
    """Starting the draft on a long read (the prompt at an answer's start) is a one-off cost
    against a saving over an answer of unknown length: it is run there only where it
    promises DRAFT_START_EDGE_FACTOR times the best other choice, its read counted; a
    routine catch-up of a few tokens is chosen on the rate alone."""
    p = _core.Policy(_core.CostModel(), _core.AcceptanceModel())
    edge = _core.DRAFT_START_EDGE_FACTOR
    assert 1.0 < edge < 1.1
    best = 38.47                                  # tokens/s of the target alone
    assert not p.start_pays(38.70, best, 53)      # translation-2's start: a 0.6 % edge
    assert p.start_pays(best * (edge + 0.01), best, 53)
    assert not p.start_pays(best * (edge - 0.01), best, 53)
    assert p.start_pays(38.70, best, 2)           # a routine catch-up: the rate alone
    assert not p.start_pays(38.0, best, 2)
    with pytest.raises(ValueError):
        p.start_pays(-1.0, best, 2)
