"""The advisor: the cost/acceptance model on hand-computed cases, and ``python -m fastspec.bench
advise`` on tiny models (it runs, prints its sections, and its --json parses)."""
import json
import math

import pytest

from fastspec import _core, bench
from fastspec.bench import advise

FLAT = {n: 1.0 for n in range(1, 18)}          # a batch costs one pass, whatever its size
LINEAR = {n: float(n) for n in range(1, 18)}   # a batch costs its tokens one by one
# a 2-core EPYC: target pass of 1/2/3/4/8/16 tokens in ms, one draft token 14.7 ms
EPYC = {1: 34.8, 2: 59.0, 3: 78.0, 4: 94.0, 8: 232.0, 16: 298.0}
EPYC_DRAFT = 14.7


def test_verify_time_interpolates_between_and_scales_beyond():
    assert advise.verify_time({1: 1.0, 3: 3.0}, 2) == pytest.approx(2.0)
    assert advise.verify_time({1: 1.0, 4: 2.0}, 8) == pytest.approx(4.0)   # proportional beyond
    assert advise.verify_time({2: 5.0}, 1) == 5.0
    with pytest.raises(ValueError):
        advise.verify_time({}, 1)


def test_expected_tokens_per_pass():
    assert advise.expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert advise.expected_tokens(1.0, 4) == pytest.approx(5.0)
    assert advise.expected_tokens(0.0, 4) == pytest.approx(1.0)
    # a measured per-position curve wins where it exists, alpha beyond it
    assert advise.expected_tokens(0.5, 3, [1.0, 0.5]) == pytest.approx(1 + 1 + 0.5 + 0.25)


def test_free_draft_flat_costs_takes_the_longest_draft():
    assert advise.best_setting(FLAT, 0.0, 1.0) == (16, pytest.approx(17.0))
    # k=1 at alpha 0.5 with c = 0.25: 1.5 / 1.25 = 1.2; k=2: 1.75 / 1.5 < 1.2
    assert advise.best_setting(FLAT, 0.25, 0.5) == (1, pytest.approx(1.2))


def test_linear_costs_never_pay():
    assert advise.best_setting(LINEAR, 0.1, 1.0) == (0, 1.0)
    assert advise.break_even_cost(LINEAR, 1.0) <= 0


def test_epyc_ceiling_is_about_1_07():
    k, s = advise.ceiling(EPYC, EPYC_DRAFT)
    # t(16) measured: 16 tokens of 34.8 ms in 15 * 14.7 + 298 ms
    assert k == 15 and s == pytest.approx(16 * 34.8 / (15 * 14.7 + 298.0))
    assert 1.05 < s < 1.09
    # k = 3: 4 * 34.8 / (3 * 14.7 + 94) just above 1
    assert advise.speedup_at(EPYC, EPYC_DRAFT, 1.0, 3) == pytest.approx(4 * 34.8 / (3 * 14.7 + 94.0))


def test_break_even_cost():
    # flat costs: (E(k) - 1) / k, best at k = 1 for alpha 0.5: 0.5; for alpha 1: 1.0
    assert advise.break_even_cost(FLAT, 0.5) == pytest.approx(0.5)
    assert advise.break_even_cost(FLAT, 1.0) == pytest.approx(1.0)
    # at the break-even cost the best speed-up is 1 (to rounding), below it more
    c = advise.break_even_cost(EPYC, 0.9) * EPYC[1]
    assert advise.best_setting(EPYC, c * 0.9, 0.9)[1] > 1.0


def test_advice_when_the_draft_cannot_pay():
    acc = {"code": dict(alpha=0.9, n_drafted=100), "chat": dict(alpha=0.5, n_drafted=100, lookup_alpha=0.8,
                                                                 lookup_n_drafted=20)}
    a = advise.advise({n: t / 1e3 for n, t in EPYC.items()}, EPYC_DRAFT / 1e3, acc)
    assert a["cost_ratio"] == pytest.approx(14.7 / 34.8)
    assert a["ceiling_100_k"] == 15 and 1.05 < a["ceiling_100"] < 1.09
    assert a["categories"]["chat"]["best_k"] == 0 and a["categories"]["chat"]["predicted_speedup"] == 1.0
    assert a["categories"]["chat"]["lookup_predicted_speedup"] > 1.0   # free proposals at 80 %
    assert a["categories"]["code"]["lookup_alpha"] is None
    s = a["sentence"]
    assert "0.42 of a target pass" in s and "at most 1.07x" in s
    assert f"below {a['break_even_cost_ratio']:.2f}" in s and "run the target alone" in s
    json.dumps(a)   # JSON-able


def test_advice_when_no_length_pays_even_at_full_acceptance():
    """A draft dearer than a target pass (a small pair on a GPU, where both are launch-bound):
    the sentence says no length pays, not "verifying 1 tokens ... at most 1.00x (k=0)"."""
    times = {1: 1.8e-3, 2: 2.1e-3, 4: 2.8e-3, 8: 3.7e-3, 16: 4.6e-3}
    a = advise.advise(times, 2.5e-3, {"chat": dict(alpha=0.8, n_drafted=40)})
    assert a["ceiling_100_k"] == 0
    s = a["sentence"]
    assert "more than the target pass it would save" in s and "no draft length pays" in s
    assert "k=0" not in s and "1 tokens" not in s


@pytest.mark.parametrize("mode, drafted, accepted, alpha, passes, t_draft, mean_k, capped_k", [
    ("lookup", 120, 114, 0.97, 12, 0.0, 10.0, 10),   # what the match offers: the edits' 8.6-10.5 tokens, not 15
    ("draft", 42, 36, 0.9, 20, 0.1, 2.1, 3),         # auto drafts far only where the draft is sure: rounded up
], ids=["lookup", "draft"])
def test_advice_is_capped_at_the_proposals_the_run_made(mode, drafted, accepted, alpha, passes, t_draft, mean_k,
                                                         capped_k):
    """The advice's best k is no longer than the run's passes of that proposer were on average
    (records' drafted / passes by source; lookup's rounded, the draft's rounded up: auto's
    acceptance at deep positions is measured on the stretches the draft was sure of), and the
    prediction drops with it; records that do not say leave k free."""
    key = "lookup_" if mode == "lookup" else ""
    stats = dict(n_generated=128, n_drafted=drafted, n_accepted=accepted, alpha=alpha,
                 passes_by_source={"target": 2, mode: passes}, accepted_by_source={mode: accepted},
                 drafted_by_source={mode: drafted})
    acc = advise.acceptance_from_records([{"category": "c", "mode": mode, "stats": stats}])
    assert acc["c"][key + "mean_k"] == pytest.approx(mean_k)
    free = dict(acc["c"], **{key + "mean_k": None})
    capped = advise.advise(FLAT, t_draft, acc)["categories"]["c"]
    uncapped = advise.advise(FLAT, t_draft, {"c": free})["categories"]["c"]
    assert capped[key + "best_k"] == capped_k and uncapped[key + "best_k"] > capped_k
    assert capped[key + "predicted_speedup"] < uncapped[key + "predicted_speedup"]
    assert advise.mean_proposal([{"n_generated": 5}], mode) is None


def test_advice_when_the_draft_pays():
    a = advise.advise(FLAT, 0.1, {"math": dict(alpha=0.9, n_drafted=50)})
    assert a["predicted_speedup"] > 2 and "speculation pays here" in a["sentence"] and "math" in a["sentence"]


def test_acceptance_from_records():
    def rec(cat, mode, acc, drafted, alpha, by_pos=()):
        return dict(category=cat, mode=mode, stats=dict(n_accepted=acc, n_drafted=drafted, alpha=alpha,
                                                        acceptance_by_position=list(by_pos)))
    recs = [rec("a", "draft", 8, 10, 0.8, [0.9, 0.7]), rec("a", "draft", 2, 10, 0.5, [0.5]),
            rec("a", "lookup", 3, 4, 0.75), rec("a", "target", 0, 0, 0.0), rec("b", "combined", 0, 4, 0.0)]
    acc = advise.acceptance_from_records(recs)
    # tested = 8 / 0.8 + 2 / 0.5 = 14 -> alpha = 10 / 14
    assert acc["a"]["alpha"] == pytest.approx(10 / 14) and acc["a"]["n_drafted"] == 20
    # all of the first 1 / 2 tokens accepted in 70 % / 70 % of passes: p = 0.7, then 1.0
    assert acc["a"]["by_position"] == pytest.approx([0.7, 1.0])
    assert acc["a"]["lookup_alpha"] == pytest.approx(0.75)
    assert acc["b"]["alpha"] == 0.0          # combined stands in for draft
    assert "lookup_alpha" not in acc["b"]


@pytest.fixture
def cli_args(bpe_pair, tmp_path):
    target, same, _ = bpe_pair
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(dict(prompt=f"the quick brown fox {i}", category=c))
                              for i, c in enumerate(["one", "two"])) + "\n")
    return ["advise", "--target", str(target), "--draft", str(same), "--prompts", str(path),
            "--max-tokens", "12", "--threads", "1", "--ctx", "512"]


def test_advise_command_prints_its_sections(cli_args, capsys):
    assert bench.main(cli_args) == 0
    out = capsys.readouterr().out
    for section in ("Costs on this machine", "one draft token", "ceiling at 100 % acceptance",
                    "Predicted best setting per category", "Advice: Here a draft token costs"):
        assert section in out, section
    assert "one" in out and "two" in out


def test_advise_json(cli_args, capsys):
    assert bench.main(cli_args + ["--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["schema"] == advise.SCHEMA and set(a["categories"]) == {"one", "two"}
    assert a["cost_ratio"] > 0 and a["verify_cost"]["1"] == 1.0 and a["sentence"]
    # the draft is the target itself: every drafted token is accepted
    assert all(c["alpha"] == 1.0 for c in a["categories"].values())


def test_advise_bad_input(cli_args, tmp_path, capsys):
    assert bench.main(cli_args + ["--categories", "nope"]) == 2
    assert "unknown categories" in capsys.readouterr().err
    args = list(cli_args)
    args[args.index("--target") + 1] = str(tmp_path / "missing.gguf")
    assert bench.main(args) == 1
    assert "cannot load models" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["lookup_", ""], ids=["lookup", "draft"])
def test_prediction_counts_only_the_share_its_passes_made(key):
    """n-gram lookup proposes only where the text repeats, and an n_draft="auto" run drafts
    only where the policy expects that to pay: the rest of the output came from the
    target alone."""
    def entry(**cov):
        return {key + "alpha": 0.9, key + "n_drafted": 100, **{key + k: v for k, v in cov.items()}}
    acc = {"all": entry(coverage=1.0), "half": entry(coverage=0.5), "unknown": entry()}
    a = advise.advise(FLAT, 0.1, acc)["categories"]
    s = a["all"][key + "predicted_speedup"]
    assert s > 2.0 and a["unknown"][key + "predicted_speedup"] == pytest.approx(s)
    assert a["half"][key + "predicted_speedup"] == pytest.approx(1.0 / (0.5 + 0.5 / s))


def test_lookup_coverage_from_stats():
    st = [dict(n_generated=100, passes_by_source={"lookup": 10}, accepted_by_source={"lookup": 30}),
          dict(n_generated=50, passes_by_source={"lookup": 0}, accepted_by_source={"lookup": 0})]
    assert advise.lookup_coverage(st) == pytest.approx(40 / 150)
    assert advise.lookup_coverage([dict(n_generated=10)]) is None
    assert advise.lookup_coverage([]) is None


def test_a_draft_probed_on_a_few_tokens_is_not_predicted_the_ceiling():
    """An auto run's α is measured where it drafted: a category drafted in 2 % of its
    output at 100 % acceptance (a probe or two) predicts little."""
    a = advise.advise(FLAT, 0.1, {"little": dict(alpha=1.0, n_drafted=3, coverage=0.02)})["categories"]
    assert a["little"]["best_k"] > 0 and a["little"]["predicted_speedup"] < 1.05
    assert a["little"]["coverage"] == 0.02


def test_draft_coverage_from_records():
    def rec(mode, gen, passes, accepted):
        return dict(category="c", mode=mode, stats=dict(
            n_generated=gen, n_drafted=accepted + passes, n_accepted=accepted, alpha=0.9,
            passes_by_source={mode: passes}, accepted_by_source={mode: accepted}))
    acc = advise.acceptance_from_records([rec("draft", 100, 10, 30), rec("draft", 100, 0, 0),
                                          rec("lookup", 100, 5, 15)])
    assert acc["c"]["coverage"] == pytest.approx(40 / 200)
    assert acc["c"]["lookup_coverage"] == pytest.approx(20 / 100)


@pytest.mark.parametrize("mode", ["lookup", "draft"])
def test_a_category_is_predicted_per_prompt_as_it_is_measured(mode):
    """The bench's speed-up for a category is the geometric mean of its prompts' ratios, so the
    advisor predicts each prompt at its own share of the output and takes the same mean: one
    prompt covered wholly and one not at all is not predicted as two covered half the time."""
    def rec(pid, gen, passes, accepted):
        return dict(category="c", mode=mode, prompt_id=pid, stats=dict(
            n_generated=gen, n_drafted=accepted + passes, n_accepted=accepted, alpha=0.9,
            passes_by_source={mode: passes}, accepted_by_source={mode: accepted}))
    key = "lookup_" if mode == "lookup" else ""
    acc = advise.acceptance_from_records([rec("a", 100, 25, 75), rec("b", 100, 0, 0), rec("b", 100, 0, 0)])
    assert acc["c"][key + "coverage"] == pytest.approx(100 / 300)     # pooled, token-weighted
    assert [p["coverage"] for p in acc["c"][key + "prompts"]] == pytest.approx([1.0, 0.0])
    a = advise.advise(FLAT, 0.1, acc)["categories"]["c"]
    pooled = advise.advise(FLAT, 0.1, {"c": {k: v for k, v in acc["c"].items() if k != key + "prompts"}})
    s = advise.best_setting(FLAT, 0.0 if mode == "lookup" else 0.1, 0.9, None, advise.K_MAX)[1]
    assert a[key + "predicted_speedup"] == pytest.approx(math.sqrt(s * 1.0), rel=0.02)
    assert a[key + "predicted_speedup"] > pooled["categories"]["c"][key + "predicted_speedup"]
    if mode == "draft":     # no draft-mode records: combined mode's, its draft passes' share
        comb = [dict(r, mode="combined") for r in (rec("a", 100, 25, 75), rec("b", 100, 0, 0))]
        assert [p["coverage"] for p in advise.acceptance_from_records(comb)["c"]["prompts"]] == [1.0, 0.0]
    # records without prompt ids (older files): the pooled figures
    for r in (recs := [rec("a", 100, 25, 75), rec("b", 100, 0, 0)]):
        del r["prompt_id"]
    assert key + "prompts" not in advise.acceptance_from_records(recs)["c"]


def test_combined_mode_is_priced_from_lookups_share_and_the_drafts_rest():
    """Combined mode: lookup's passes make the share of the output they make in lookup mode, at
    their speed-up; the draft model the rest at its own predicted speed-up (the target alone's
    1.0x where the draft does not pay), per prompt as the bench measures a category."""
    base = dict(alpha=0.9, n_drafted=100, coverage=1.0, lookup_alpha=0.95, lookup_n_drafted=100)
    acc = {"half": dict(base, lookup_coverage=0.5), "none": dict(base, lookup_coverage=0.0),
           "no draft pays": dict(base, alpha=0.01, lookup_coverage=0.5)}
    a = advise.advise(FLAT, 0.1, acc)["categories"]
    s_d = a["half"]["predicted_speedup"]
    s_l = advise.best_setting(FLAT, 0.0, 0.95, None, advise.K_MAX)[1]
    assert a["half"]["combined_predicted_speedup"] == pytest.approx(1.0 / (0.5 / s_l + 0.5 / s_d))
    assert a["none"]["combined_predicted_speedup"] == pytest.approx(s_d)
    assert a["no draft pays"]["best_k"] == 0
    assert a["no draft pays"]["combined_predicted_speedup"] == pytest.approx(1.0 / (0.5 / s_l + 0.5))
    assert a["no draft pays"]["combined_predicted_speedup"] == pytest.approx(a["no draft pays"]["lookup_predicted_speedup"])
    # per prompt: one prompt lookup covers wholly, one it does not touch
    per = dict(base, lookup_coverage=0.5, prompts=[dict(coverage=1.0), dict(coverage=1.0)],
               lookup_prompts=[dict(coverage=1.0), dict(coverage=0.0)])
    c = advise.advise(FLAT, 0.1, {"c": per})["categories"]["c"]
    assert c["combined_predicted_speedup"] == pytest.approx(math.sqrt(s_l * s_d))
    # a draft model that never drafted here (no α): lookup's passes and the target alone
    never = advise.advise(FLAT, 0.1, {"c": dict(lookup_alpha=0.95, lookup_n_drafted=100, lookup_coverage=0.5)})
    assert never["categories"]["c"]["combined_predicted_speedup"] == pytest.approx(1.0 / (0.5 / s_l + 0.5))
    # no lookup measured, or no draft model: nothing to say of combined mode
    assert advise.advise(FLAT, 0.1, {"c": dict(alpha=0.9, n_drafted=100)})["categories"]["c"][
        "combined_predicted_speedup"] is None
    assert advise.advise(FLAT, None, {"c": dict(lookup_alpha=0.9, lookup_n_drafted=100)})["categories"]["c"][
        "combined_predicted_speedup"] is None


def _by_source_rec(pid, mode, gen, by_source, n_prompt=100):
    """A bench record whose passes came from ``by_source`` ({source: (passes, drafted,
    accepted)}) and, for the rest of its ``gen`` tokens, the target alone."""
    passes = {src: p for src, (p, _, _) in by_source.items()}
    made = sum(p + a for p, _, a in by_source.values())
    passes["target"] = gen - made
    drafted = sum(d for _, d, _ in by_source.values())
    accepted = sum(a for _, _, a in by_source.values())
    return dict(category="c", mode=mode, prompt_id=pid, n_prompt=n_prompt, stats=dict(
        n_generated=gen, n_drafted=drafted, n_accepted=accepted,
        alpha=accepted / (accepted + sum(p for p, d, a in by_source.values() if d > a)) if drafted else 0.0,
        passes_by_source=passes, accepted_by_source={s: a for s, (_, _, a) in by_source.items()},
        drafted_by_source={s: d for s, (_, d, _) in by_source.items()}))


def test_lookup_is_priced_per_prompt_at_its_own_pass_length():
    """Each prompt's lookup passes at the tokens a pass they made and the length they proposed:
    an edit whose matches offered 2 tokens a pass beside one whose matches offered 8 is not
    priced at the category's pooled acceptance and length."""
    times = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 18)}
    recs = [_by_source_rec("a", "lookup", 80, {"lookup": (10, 80, 70)}),     # 8 a pass, all kept
            _by_source_rec("b", "lookup", 20, {"lookup": (10, 20, 10)})]     # 2 proposed, 1 kept
    acc = advise.acceptance_from_records(recs)["c"]
    assert [(p["tokens_per_pass"], p["mean_k"]) for p in acc["lookup_prompts"]] == [(8.0, 8.0), (2.0, 2.0)]
    a = advise.advise(times, 0.5, {"c": acc})["categories"]["c"]
    expected = math.sqrt(8.0 / times[9] * 2.0 / times[3])
    assert a["lookup_predicted_speedup"] == pytest.approx(expected)
    pooled = advise.advise(times, 0.5, {"c": {k: v for k, v in acc.items() if k != "lookup_prompts"}})
    assert pooled["categories"]["c"]["lookup_predicted_speedup"] != pytest.approx(expected)
    # where the records count passes by size, each pass at its own: "a" made its 8 tokens a
    # pass in 5 passes of 3 and 5 of 15 (a mean of 8 proposed), priced at t(3) and t(15), not t(9)
    recs[0]["stats"]["passes_by_size"] = {"1": 0, "3": 5, "15": 5}
    recs[1]["stats"]["passes_by_size"] = {"3": 10}
    acc = advise.acceptance_from_records(recs)["c"]
    assert acc["lookup_prompts"][0]["sizes"] == {3: 5, 15: 5}
    bumpy = {**times, 15: 4.0}          # a 15-token pass dearer than the line through the rest
    a = advise.advise(bumpy, 0.5, {"c": acc})["categories"]["c"]
    mixed = 8.0 * 10 / (5 * bumpy[3] + 5 * bumpy[15])
    assert a["lookup_predicted_speedup"] == pytest.approx(math.sqrt(mixed * 2.0 / bumpy[3]))
    assert a["lookup_predicted_speedup"] < 0.9 * math.sqrt(8.0 / bumpy[9] * 2.0 / bumpy[3])   # (the mean length)
    # counts that do not add up to the lookup passes (older or odd records): the mean length
    recs[1]["stats"]["passes_by_size"] = {"3": 9}
    assert "sizes" not in advise.acceptance_from_records(recs)["c"]["lookup_prompts"][1]


def test_combined_mode_is_priced_at_the_shares_its_own_generations_took():
    """Where combined mode was measured, its shares of each prompt's output (lookup's, the
    draft's, the target alone's) are priced at lookup's and the draft's pass speed-ups and
    1.0x: a copying answer whose non-lookup tokens the policy left to the target alone is not
    predicted as if the draft had made them.  Lookup's proposals in a generation the draft
    never drafted in do not charge the draft's catch-up."""
    times = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 18)}
    recs = [_by_source_rec("a", "draft", 100, {"draft": (25, 100, 75)}),
            _by_source_rec("a", "lookup", 100, {"lookup": (10, 90, 80)}),
            _by_source_rec("a", "combined", 100, {"lookup": (10, 90, 80)})]      # the rest: target
    acc = advise.acceptance_from_records(recs)["c"]
    assert acc["combined_prompts"] == [dict(lookup_coverage=pytest.approx(0.9), draft_coverage=0.0,
                                            n_generated=100, catchup_tokens=0)]
    a = advise.advise(times, 0.05, {"c": acc}, t_catchup=0.01)["categories"]["c"]
    s_l = 9.0 / times[10]
    assert a["combined_predicted_speedup"] == pytest.approx(1.0 / (0.9 / s_l + 0.1))
    # the draft makes the rest: its pass speed-up there, and its reading of the prompt
    recs[2] = _by_source_rec("a", "combined", 100, {"lookup": (10, 90, 80), "draft": (2, 8, 8)})
    acc = advise.acceptance_from_records(recs)["c"]
    read = min(100, _core.DRAFT_CATCHUP_HEAD + _core.DRAFT_CATCHUP_WINDOW)
    assert acc["combined_prompts"][0]["catchup_tokens"] == read
    a = advise.advise(times, 0.05, {"c": acc}, t_catchup=0.01)["categories"]["c"]
    s_k = advise.best_setting(times, 0.05, acc["alpha"], acc["by_position"] or None, math.ceil(acc["mean_k"]))[1]
    assert a["combined_predicted_speedup"] == pytest.approx(1.0 / (0.9 / s_l + 0.1 / s_k + read * 0.01 / (100 * times[1])))


def test_the_drafts_reading_of_a_short_answers_prompt_is_charged():
    """Before its first draft the draft model reads the prompt (at most
    DRAFT_CATCHUP_WINDOW tokens): over a long answer that costs little, over a short one
    it can eat the whole gain, and then the advice is the target alone."""
    base = dict(alpha=0.9, n_drafted=100, coverage=1.0)
    acc = {"long": dict(base, n_generated=1000, catchup_tokens=64),
           "short": dict(base, n_generated=20, catchup_tokens=64),
           "no prompt": dict(base, n_generated=20)}
    t_c = 1.0 / 4                                  # a catch-up token: a quarter of a (FLAT) target pass
    a = advise.advise(FLAT, 0.1, acc, t_catchup=t_c)["categories"]
    s = a["no prompt"]["predicted_speedup"]
    assert a["long"]["predicted_speedup"] == pytest.approx(1000 / (64 * t_c + 1000 / s))
    assert 1.0 < a["long"]["predicted_speedup"] < s
    assert a["short"]["best_k"] == 0 and a["short"]["predicted_speedup"] == 1.0
    assert a["long"]["catchup_seconds"] == pytest.approx(64 * t_c)


def test_catchup_tokens_from_records():
    """A windowed catch-up reads the prompt's head and its last window; a draft the policy had
    read all of the prompt (an answer copying it) reads all of it."""
    def rec(n_prompt, drafted, gen=50, read_all=False):
        return dict(category="c", mode="draft", n_prompt=n_prompt, policy=dict(draft_read_all=read_all),
                    stats=dict(n_generated=gen, n_drafted=drafted, n_accepted=drafted, alpha=1.0,
                               passes_by_source={"draft": 1}, accepted_by_source={"draft": drafted}))
    w = _core.DRAFT_CATCHUP_HEAD + _core.DRAFT_CATCHUP_WINDOW
    acc = advise.acceptance_from_records([rec(10, 5), rec(10 * w, 5), rec(500, 0), rec(400, 5, read_all=True)])
    assert acc["c"]["catchup_tokens"] == 10 + w + 400     # the third never drafted: never read its prompt
    assert acc["c"]["n_generated"] == 200
    assert advise.catchup_tokens(dict(n_prompt=300)) == w      # records without a policy: windowed


def test_a_runs_advice_is_read_at_its_median_costs():
    """A bench run's advice takes the cost model over the run (the median of what each
    generation of the draft's decoder left), not the one its last generation left: a slow
    spell at the end makes every batch look cheap against its one-token pass."""
    def rec(mode, t1, v2, v4, draft):
        return dict(category="c", mode=mode, policy=dict(costs=dict(
            t1=t1, verify={"1": 1.0, "2": v2, "4": v4}, draft=draft)))
    records = [rec("draft", 0.030, 1.5, 2.0, 0.30), rec("draft", 0.032, 1.6, 2.2, 0.32),
               rec("draft", 0.045, 1.2, 1.6, 0.24),       # the slow spell at the end
               rec("lookup", 0.100, 9.0, 9.0, None), rec("target", 0.5, 1.0, 1.0, None)]
    end = dict(times={1: 0.045, 2: 0.054, 4: 0.072}, t_draft=0.0108, t_catchup=0.009)
    c = advise.run_costs(records, end)
    assert c["times"] == pytest.approx({1: 0.032, 2: 0.032 * 1.5, 4: 0.032 * 2.0})
    assert c["t_draft"] == pytest.approx(0.032 * 0.30)
    assert c["t_catchup"] == pytest.approx(0.009 * 0.032 / 0.045)   # its ratio to t1 kept
    # an end whose one-token pass is far from the run's (a broken model): the catch-up as it is
    broken = dict(end, times={1: 1e-6, 2: 0.054, 4: 0.072})
    assert advise.run_costs(records, broken)["t_catchup"] == pytest.approx(0.009)
    # no draft records: the combined mode's; none of either (or no costs kept): the end's
    assert advise.run_costs([dict(r, mode="combined") for r in records[:2]], end)["times"][1] \
        == pytest.approx(0.031)
    assert advise.run_costs(records[3:], end) is end
    assert advise.run_costs([dict(category="c", mode="draft", policy=None)], end) is end


def test_each_category_is_priced_at_the_costs_its_own_generations_measured():
    """A category whose passes ran at long contexts (edits) or in a quick spell of the
    machine is predicted at what its own generations' cost models say, per mode: lookup at
    the lookup decoder's, the draft at the draft's; a category or mode without costs keeps
    the run's."""
    def rec(cat, mode, t1, v8, draft):
        return dict(category=cat, mode=mode, policy=dict(costs=dict(
            t1=t1, verify={"1": 1.0, "8": v8}, draft=draft)))
    records = [rec("edit", "draft", 0.030, 3.0, 0.4), rec("edit", "lookup", 0.024, 3.5, None),
               rec("edit", "lookup", 0.024, 3.3, None), rec("chat", "draft", 0.030, 2.0, 0.3)]
    end = dict(times={1: 0.030, 8: 0.060}, t_draft=0.009, t_catchup=0.003)
    by_cat = advise.category_costs(records, end)
    assert by_cat["edit"]["lookup"]["times"] == pytest.approx({1: 0.024, 8: 0.024 * 3.4})
    assert by_cat["edit"]["lookup"]["t_draft"] == 0.009          # no draft in lookup mode: the run's
    assert by_cat["edit"]["draft"]["t_draft"] == pytest.approx(0.030 * 0.4)
    assert by_cat["chat"]["lookup"] is end                        # chat ran no lookup generation
    acc = {cat: dict(lookup_alpha=1.0, lookup_n_drafted=100, lookup_coverage=1.0, lookup_mean_k=7.0)
           for cat in ("edit", "chat")}
    a = advise.advise(end["times"], end["t_draft"], acc, by_category=by_cat)["categories"]
    # 8 tokens a pass: 8 / 2.0 at the run's costs, 8 / 3.4 at the edits' own
    assert a["chat"]["lookup_predicted_speedup"] == pytest.approx(4.0)
    assert a["edit"]["lookup_predicted_speedup"] == pytest.approx(8 / 3.4)
    assert advise.advise(end["times"], end["t_draft"], acc)["categories"]["edit"]["lookup_predicted_speedup"] \
        == pytest.approx(4.0)


def test_a_category_prices_the_target_alone_at_the_one_token_passes_its_generations_ran():
    """A draft generation's cost model holds the one-token pass it saw at its answer's start
    (36 ms here) while its batches follow the machine; the category's one-token passes,
    wherever they ran (the target alone's, lookup's unmatched ones), weighted by how many,
    are the target alone the advice compares with.  The batches and the draft token keep
    the times the draft's generations measured; too few one-token passes keep its model."""
    def rec(mode, t1, one_n, one_s):
        return dict(category="sum", mode=mode, policy=dict(
            costs=dict(t1=t1, verify={"1": 1.0, "2": 0.97}, draft=0.25),
            one_token=dict(n=one_n, seconds=one_s)))
    records = [rec("target", 0.032, 128, 0.033), rec("draft", 0.036, 8, 0.036),
               rec("lookup", 0.032, 40, 0.0322)]
    end = dict(times={1: 0.030, 2: 0.032}, t_draft=0.008, t_catchup=0.003)
    by_cat = advise.category_costs(records, end)
    t1 = (128 * 0.033 + 8 * 0.036 + 40 * 0.0322) / 176
    assert by_cat["sum"]["draft"]["times"] == pytest.approx({1: t1, 2: 0.036 * 0.97})
    assert by_cat["sum"]["draft"]["t_draft"] == pytest.approx(0.036 * 0.25)
    assert by_cat["sum"]["lookup"]["times"][1] == pytest.approx(t1)
    # the draft at 25 % acceptance, one token a pass, (1 + 0.25) t1 / (t_draft + t(2)): 1.02x
    # at the draft generation's own t1, below the target alone (1.0x) at the category's
    acc = {"sum": dict(alpha=0.25, n_drafted=100)}
    assert 1.25 * 0.036 / (0.036 * 0.25 + 0.036 * 0.97) > 1.02 and 1.25 * t1 / (0.036 * 1.22) < 0.95
    a = advise.advise(end["times"], end["t_draft"], acc, k_max=1, by_category=by_cat)["categories"]["sum"]
    assert a["predicted_speedup"] == pytest.approx(1.0)
    # fewer one-token passes than a pace reading needs: the draft's model as it was
    few = [rec("draft", 0.036, 3, 0.030)]
    assert advise.category_costs(few, end)["sum"]["draft"]["times"][1] == pytest.approx(0.036)


def test_advice_at_the_break_even_says_so():
    """A draft whose cost is within 10 % of the break-even at the mean acceptance is not
    told to be "1.0x cheaper": it pays where it drafts best (per category), little elsewhere."""
    acc = {"code": dict(alpha=0.8, n_drafted=100)}
    be = advise.break_even_cost({n: t / 1e3 for n, t in EPYC.items()}, 0.8)
    a = advise.advise({n: t / 1e3 for n, t in EPYC.items()}, 1.05 * be * EPYC[1] / 1e3, acc)
    assert "break-even" in a["sentence"] and "x cheaper" not in a["sentence"]
    a = advise.advise({n: t / 1e3 for n, t in EPYC.items()}, 1.5 * be * EPYC[1] / 1e3, acc)
    assert "1.5x cheaper" in a["sentence"]
