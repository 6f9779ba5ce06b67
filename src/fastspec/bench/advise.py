"""The advisor: does speculative decoding pay on this machine, for this pair, and why (not)?

``python -m fastspec.bench advise [--target A --draft B]`` measures, on this machine, the
target's cost per verification batch size and the draft's cost per token (the decoder's own
cost model, calibrated as an ``n_draft="auto"`` generation does), and the acceptance per
category (greedy generations drafting a fixed number of tokens per pass, and n-gram lookup);
then prints the cost ratio, the verification cost per batch size, the best speed-up at the
measured acceptance and at 100 %, the best draft length per category, and a sentence saying
what to do.  The default ``python -m fastspec.bench`` run prints the same advice from its own
measurements (both read the costs as the median over the draft's generations, ``run_costs``,
and price each category at the median over its own generations, ``category_costs``).

The model (Leviathan et al., with the measured batch costs instead of "a batch costs one
pass"): with per-token acceptance α and k drafted tokens a pass emits
E(k) = (1 − α^(k+1)) / (1 − α) tokens (or 1 + Σ_j Π_{i<j} p_i from a measured per-position
curve p) and takes k·t_d + t(k+1) seconds; the predicted speed-up is E(k) / (k·t_d + t(k+1))
divided by the target alone's rate 1 / t(1), best over k; below 1 the advice is the target
alone.  n-gram lookup costs ~nothing to propose, so its t_d is 0, but it proposes only
where the text repeats: with a share ψ of the output coming from lookup passes (measured),
its predicted speed-up is 1 / ((1 − ψ) + ψ / s), s the speed-up of its passes.  The same
holds for the draft model where its generations drafted only part of the time (the
default run's ``n_draft="auto"`` drafts where the policy expects it to pay, and its α is
measured there): the rest of the output came from the target alone.  And before its
first draft of a generation the draft model reads the prompt (at most its first and last
tokens: ``_core.DRAFT_CATCHUP_HEAD`` + ``_core.DRAFT_CATCHUP_WINDOW``; all of it where the
policy had it read all, see ``catchup_tokens``), a one-off cost of the seconds per token of a
catch-up (measured) that a short answer cannot earn back: the predicted speed-up is the
target alone's time over catch-ups plus passes.  Shares and catch-ups are taken per prompt
and a category's prediction is the geometric mean over its prompts, as the bench measures it
(a summary whose answer repeats its text and one whose answer does not are two prompts at
shares near 1 and near 0, not two at the pooled share).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fastspec import _core, models
from fastspec.bench import runner
from fastspec.bench.options import add_common_arguments
from fastspec.bench.prompts import BenchError, Prompt, load_prompts, select_prompts
from fastspec.bench.report import TABLE_STYLE, fmt

SCHEMA = "fastspec-advise/1"
K_MAX = 16            # draft lengths considered (the decoder's "auto" range)
PROBE_N_DRAFT = 4     # tokens drafted per pass while measuring acceptance
SHOWN_SIZES = (1, 2, 3, 4, 5, 8, 9, 16, 17)


# -- the model (pure functions) --------------------------------------------------------
def verify_time(times: dict[int, float], n: int) -> float:
    """t(n) from measured sizes: exact where measured, linear between two measured sizes,
    proportional to n beyond the largest (a conservative guess), the smallest below it."""
    if not times:
        raise ValueError("no verification cost measured")
    if n in times:
        return times[n]
    lo = max((m for m in times if m < n), default=None)
    hi = min((m for m in times if m > n), default=None)
    if lo is not None and hi is not None:
        return times[lo] + (times[hi] - times[lo]) * (n - lo) / (hi - lo)
    if lo is not None:
        return times[lo] * n / lo
    return times[hi]


def expected_tokens(alpha: float, k: int, by_position: list[float] | None = None) -> float:
    """Tokens emitted by a pass that verifies k drafted tokens: 1 + Σ_{j=1..k} Π_{i<j} p_i,
    p_i the acceptance at draft position i (from ``by_position`` where given, else α)."""
    total, run = 1.0, 1.0
    for i in range(k):
        p = by_position[i] if by_position and i < len(by_position) else alpha
        run *= min(max(p, 0.0), 1.0)
        total += run
    return total


def speedup_at(times: dict[int, float], t_draft: float, alpha: float, k: int,
               by_position: list[float] | None = None) -> float:
    """Predicted speed-up over the target alone when drafting k tokens per pass."""
    if k == 0:
        return 1.0
    return expected_tokens(alpha, k, by_position) * verify_time(times, 1) / (k * t_draft + verify_time(times, k + 1))


def best_setting(times: dict[int, float], t_draft: float, alpha: float,
                 by_position: list[float] | None = None, k_max: int = K_MAX) -> tuple[int, float]:
    """(k, speed-up) maximising the predicted speed-up over k = 1..k_max; k = 0 (the
    target alone, 1.0) when no k beats it."""
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup_at(times, t_draft, alpha, k, by_position)
        if s > best[1] + 1e-12:
            best = (k, s)
    return best


def ceiling(times: dict[int, float], t_draft: float, k_max: int = K_MAX) -> tuple[int, float]:
    """The best any draft of this cost can do: every drafted token accepted."""
    return best_setting(times, t_draft, 1.0, None, k_max)


def break_even_cost(times: dict[int, float], alpha: float, target: float = 1.0, k_max: int = K_MAX) -> float:
    """The largest draft/target cost ratio c at which some k reaches ``target`` speed-up at
    acceptance α: max_k (E(k) / target − t(k+1)/t(1)) / k; ≤ 0 when even a free draft does not."""
    t1 = verify_time(times, 1)
    return max((expected_tokens(alpha, k) / target - verify_time(times, k + 1) / t1) / k
               for k in range(1, k_max + 1))


def covered(s: float, share: float | None) -> float:
    """Speed-up of a run in which passes making ``share`` of the output ran at speed-up s
    and the rest at the target alone's pace (``share`` None, not known: s)."""
    return s if share is None else 1.0 / ((1.0 - share) + share / s)


@dataclass
class CategoryAdvice:
    category: str
    alpha: float | None                 # per-token acceptance of the draft model
    n_drafted: int
    by_position: list = field(default_factory=list)
    best_k: int = 0
    coverage: float | None = None            # share of the output that came from draft passes
    catchup_seconds: float | None = None     # the draft's reading of the prompts, over the category
    predicted_speedup: float | None = None   # best over k, weighted by coverage; 1.0 = the target alone
    lookup_alpha: float | None = None
    lookup_n_drafted: int = 0
    lookup_coverage: float | None = None     # share of the output that came from lookup passes
    lookup_best_k: int = 0
    lookup_predicted_speedup: float | None = None
    combined_predicted_speedup: float | None = None   # draft and lookup on one decoder (combined mode)


def advise(times: dict[int, float], t_draft: float, acceptance: dict[str, dict], k_max: int = K_MAX,
           t_catchup: float | None = None, by_category: dict[str, dict] | None = None) -> dict:
    """Costs (seconds per target pass of n tokens, per draft token, per token of the draft's
    catch-up with a prompt) and acceptance per category ({category: {"alpha", "n_drafted",
    "by_position", "coverage", "n_generated", "catchup_tokens", "lookup_alpha",
    "mean_k", "lookup_n_drafted", "lookup_coverage", "lookup_mean_k", "prompts", "lookup_prompts",
    "combined_prompts"}}, any may be missing; see acceptance_from_records) -> the advice as a
    JSON-able dict.  ``by_category`` ({category: {"draft": costs, "lookup": costs}}, costs as
    run_costs returns them; see category_costs) prices a category's draft and lookup passes at
    what its own generations measured, where given; the run-wide figures (ceiling,
    break-even, the sentence) keep ``times`` and ``t_draft``."""
    times = _clean(times)
    t1 = verify_time(times, 1)
    c = t_draft / t1 if t_draft else None
    out = dict(t_target_1=t1, t_draft=t_draft or None, cost_ratio=c, t_catchup=t_catchup,
               verify_cost={n: times[n] / t1 for n in sorted(times)}, categories={})
    if c is not None:
        k100, s100 = ceiling(times, t_draft, k_max)
        out.update(ceiling_100=s100, ceiling_100_k=k100)
    for cat, a in acceptance.items():
        adv = CategoryAdvice(cat, a.get("alpha"), a.get("n_drafted", 0), list(a.get("by_position") or []))
        own = (by_category or {}).get(cat) or {}
        d_costs, l_costs = own.get("draft") or {}, own.get("lookup") or {}
        d_times = _clean(d_costs["times"]) if d_costs.get("times") else times
        d_draft = d_costs.get("t_draft") or t_draft
        d_catchup = d_costs.get("t_catchup") or t_catchup
        l_times = _clean(l_costs["times"]) if l_costs.get("times") else times
        draft_speedup = draft_share = lookup_pass = lookup_pass_of = None
        if adv.alpha is not None and c is not None:
            # no longer than the run's draft passes were on average, rounded up: its acceptance
            # by position is measured where n_draft="auto" drafted that far, in the stretches
            # the draft was sure of (a run whose coding passes drafted 2.1 tokens, kept 100 %
            # from the second position on, was predicted 1.53x at k = 8 against 1.27x measured;
            # over seven newcomer runs the mean |log(predicted / measured)| 0.0365 -> 0.0348)
            dk = a.get("mean_k")
            dk_max = min(k_max, max(1, math.ceil(dk))) if dk else k_max
            adv.best_k, s_k = best_setting(d_times, d_draft, adv.alpha, adv.by_position or None, dk_max)
            adv.coverage = a.get("coverage")
            d_t1 = verify_time(d_times, 1)

            def catchup(p: dict) -> float:
                # the draft's first look at each prompt, against the time the target alone takes
                n_gen, n_read = p.get("n_generated"), p.get("catchup_tokens")
                return n_read * d_catchup / (n_gen * d_t1) if d_catchup and n_gen and n_read else 0.0

            def draft_speedup(p: dict) -> float:
                s = covered(s_k, p.get("coverage"))
                return 1.0 / (1.0 / s + catchup(p)) if adv.best_k else s

            def draft_share(p: dict) -> float:
                # (combined mode: the draft's passes made ``coverage`` of a prompt's output at
                # s_k, after its catch-up where it drafted; the rest came from other passes)
                return p["coverage"] / s_k + catchup(p)
            adv.predicted_speedup = _over_prompts(draft_speedup, a, a.get("prompts"))
            if adv.best_k and d_catchup and a.get("catchup_tokens"):
                adv.catchup_seconds = a["catchup_tokens"] * d_catchup
            if adv.predicted_speedup <= 1.0:
                adv.best_k, adv.predicted_speedup = 0, 1.0     # the policy keeps the target alone
                draft_speedup = None
        la = a.get("lookup_alpha")
        if la is not None:
            adv.lookup_alpha, adv.lookup_n_drafted = la, a.get("lookup_n_drafted", 0)
            # a lookup pass proposes what the match offers: no longer on average than the
            # run's lookup passes were (the edit prompts' 8.6-10.5 tokens, not 15)
            lk = a.get("lookup_mean_k")
            lk_max = min(k_max, max(1, round(lk))) if lk else k_max
            adv.lookup_best_k, lookup_pass = best_setting(l_times, 0.0, la, None, lk_max)
            # lookup proposes only where the text so far repeats: the rest of the output comes
            # from the target alone, at 1.0x
            adv.lookup_coverage = a.get("lookup_coverage")

            def lookup_pass_of(p: dict) -> float:
                # each prompt's passes at the tokens they made and the length they proposed,
                # where the records say: an edit whose matches proposed 2.4 tokens a pass beside
                # four that proposed 7-9 was priced at the category's pooled k = 6 (predicted
                # 2.56x, measured 1.91x; 1.96x priced at its own)
                if not p.get("tokens_per_pass") or not p.get("mean_k"):
                    return lookup_pass
                sizes = p.get("sizes") or {p["mean_k"] + 1: 1}
                # each pass at its own size where the records count them, else at the mean
                # length (which prices a mix of 2- and 16-token passes at a 9-token one's cost)
                t_pass = sum(c * verify_time(l_times, k) for k, c in sizes.items()) / sum(sizes.values())
                return max(1.0, p["tokens_per_pass"] * verify_time(l_times, 1) / t_pass)
            adv.lookup_predicted_speedup = _over_prompts(
                lambda p: covered(lookup_pass_of(p), p.get("coverage")),
                dict(coverage=adv.lookup_coverage), a.get("lookup_prompts"))
        if lookup_pass is not None and c is not None:
            # (a draft model that never drafted in this category, or does not pay: lookup's passes
            # and the target alone, as combined mode runs it)
            adv.combined_predicted_speedup = _combined(draft_speedup, lookup_pass_of, a, adv.lookup_coverage,
                                                       draft_share)
        out["categories"][cat] = adv.__dict__
    alphas = [(a["alpha"], a["n_drafted"]) for a in out["categories"].values() if a["alpha"] is not None]
    if c is not None and alphas:
        n = sum(w for _, w in alphas)
        mean_alpha = sum(x * w for x, w in alphas) / n if n else sum(x for x, _ in alphas) / len(alphas)
        out["mean_alpha"] = mean_alpha
        out["best_k"], out["predicted_speedup"] = best_setting(times, t_draft, mean_alpha, None, k_max)
        out["break_even_cost_ratio"] = break_even_cost(times, mean_alpha, 1.0, k_max)
        out["break_even_cost_ratio_100"] = break_even_cost(times, 1.0, 1.0, k_max)
        out["cost_ratio_for_1_5x"] = break_even_cost(times, mean_alpha, 1.5, k_max)
    out["sentence"] = sentence(out)
    return out


def _combined(draft_speedup, lookup_pass, a: dict, lookup_coverage: float | None, draft_share=None) -> float:
    """Combined mode's speed-up (the draft model and lookup on one decoder, each pass taking
    the better).  Where the records hold combined-mode generations (``a["combined_prompts"]``,
    per prompt: the shares of its output lookup's and the draft's passes made, and the
    draft's catch-up), those shares priced at lookup's pass speed-up (``lookup_pass(prompt)``,
    from lookup mode) and the draft's (``draft_share``, its time per token of the output),
    the rest at the target alone's pace: the policy there leaves most of a copying answer's
    non-lookup tokens to the target alone rather than pay the draft's catch-up (an edit
    priced as if the draft made them was predicted 3.23x against 2.60x measured).  Else
    lookup's share of the output in lookup mode at its pass speed-up and the rest at the
    draft model's predicted speed-up (``draft_speedup(prompt)``; None where the draft does
    not pay, the target alone's 1.0x).  Per prompt where the records say, as the bench
    measures a category."""
    lookups, combs = a.get("lookup_prompts"), a.get("combined_prompts")
    if combs and lookups and len(combs) == len(lookups):
        def priced(pc: dict, pl: dict) -> float:
            lc, dc = pc["lookup_coverage"] or 0.0, pc["draft_coverage"] or 0.0
            x = (lc / lookup_pass(pl) if lc else 0.0) + max(0.0, 1.0 - lc - dc)
            if dc or pc.get("catchup_tokens"):
                x += draft_share(dict(pc, coverage=dc)) if draft_share is not None else dc
            return 1.0 / x
        return math.exp(sum(math.log(priced(pc, pl)) for pc, pl in zip(combs, lookups)) / len(lookups))

    def one(pd: dict, pl: dict, lc: float | None) -> float:
        s_d = max(1.0, draft_speedup(pd)) if draft_speedup is not None else 1.0
        return s_d if not lc else 1.0 / (lc / lookup_pass(pl) + (1.0 - lc) / s_d)
    drafts = a.get("prompts")
    if not lookups:
        return one(a, {}, lookup_coverage)
    if not drafts or len(drafts) != len(lookups):
        drafts = [a] * len(lookups)      # (the draft never drafted here: its pooled figures)
    return math.exp(sum(math.log(one(pd, pl, pl.get("coverage"))) for pd, pl in zip(drafts, lookups))
                    / len(lookups))


def _over_prompts(speedup, pooled: dict, prompts: list[dict] | None) -> float:
    """The geometric mean of ``speedup`` over the category's prompts (each its own coverage
    and catch-up: a category whose one prompt repeats its input and the other does not is
    not predicted as if each repeated it half the time), as the bench measures a category;
    over the pooled figures where the records did not say per prompt."""
    if not prompts:
        return speedup(pooled)
    return math.exp(sum(math.log(speedup(p)) for p in prompts) / len(prompts))


def _clean(times: dict) -> dict[int, float]:
    return {int(n): float(t) for n, t in times.items() if t and t > 0}


def sentence(a: dict) -> str:
    """What a user can act on, in plain words, from the numbers in ``a``."""
    c, t1 = a.get("cost_ratio"), a["t_target_1"]
    if c is None:
        return "No draft model was measured: nothing to say about draft-model speculation."
    k100 = a["ceiling_100_k"]
    v = a["verify_cost"].get(k100 + 1) or a["verify_cost"].get(5)
    n_v = k100 + 1 if a["verify_cost"].get(k100 + 1) else 5
    head = f"Here a draft token costs {c:.2f} of a target pass ({a['t_draft'] * 1e3:.1f} vs {t1 * 1e3:.1f} ms)"
    if k100 == 0:
        # no length pays even at 100 %: "verifying 1 tokens ... at most 1.00x (k=0)" says nothing
        parts = [head + (", more than the target pass it would save" if c >= 1 else
                         ", too much for what verifying several tokens at once saves")
                 + ", so no draft length pays even if every drafted token were accepted"]
    else:
        parts = [head + (f" and verifying {n_v} tokens costs {v:.1f} passes" if v else "")
                 + f", so even perfect drafts give at most {a['ceiling_100']:.2f}x (k={k100})"]
    if "predicted_speedup" in a:
        s, k, alpha = a["predicted_speedup"], a["best_k"], a["mean_alpha"]
        parts.append(f"at the measured acceptance ({alpha:.0%} per token) the best is "
                     + (f"{s:.2f}x with {k} drafted tokens per pass" if k else "the target alone"))
        be = a["break_even_cost_ratio"]
        if be <= 0:
            parts.append("at that acceptance even a free draft cannot pay, because verifying several tokens "
                         "costs nearly as much as decoding them one by one; use a GPU, or n-gram lookup/a "
                         "prediction where the output repeats its input")
        elif be <= c < 1.1 * be:
            parts.append(f"a draft pays only if it costs below {be:.2f} of a target pass: this one is at the "
                         "break-even, so it pays on the answers it drafts best (n_draft='auto' drafts only "
                         "there) and a slightly cheaper draft or larger target would make it pay more widely; "
                         "use lookup/prediction on text that repeats its input")
        elif c >= be:
            parts.append(f"a draft pays only if it costs below {be:.2f} of a target pass "
                         f"({c / be:.1f}x cheaper than this one), or with a target at least {c / be:.1f}x larger "
                         "with the same draft; until then run the target alone, or use lookup/prediction on "
                         "text that repeats its input")
        else:
            good = [cat for cat, x in a["categories"].items() if (x["predicted_speedup"] or 0) > 1.05]
            tip = a.get("cost_ratio_for_1_5x", 0)
            parts.append(f"speculation pays here (c below the break-even {be:.2f})"
                         + (f", most on {', '.join(good)}" if good else "")
                         + (f"; for 1.5x a draft would need c below {tip:.2f}" if tip > 0 else
                            "; 1.5x is out of reach at this acceptance on this machine"))
    return "; ".join(parts) + "."


# -- from measurements --------------------------------------------------------------------
def catchup_tokens(record: dict) -> int:
    """Prompt tokens the draft read in a generation it drafted in: a windowed catch-up reads
    the prompt's first DRAFT_CATCHUP_HEAD and last DRAFT_CATCHUP_WINDOW tokens, a draft the
    policy had read all of it (an answer copying the prompt at length: the record's
    ``policy["draft_read_all"]``) the whole prompt."""
    n = record["n_prompt"]
    if (record.get("policy") or {}).get("draft_read_all"):
        return n
    return min(n, _core.DRAFT_CATCHUP_HEAD + _core.DRAFT_CATCHUP_WINDOW)


def acceptance_from_records(records: list[dict]) -> dict[str, dict]:
    """Per category: the draft model's α (from ``draft`` mode, else ``combined``),
    per-position acceptance and share of the output, the tokens it read of the prompts of
    the generations it drafted in (where records have ``n_prompt``: catchup_tokens), and
    lookup's α, share and tokens a pass (``lookup`` mode), each also per prompt where the
    records carry prompt ids (``prompts``, ``lookup_prompts``: a lookup prompt's tokens a
    pass and proposal length), and per prompt the shares lookup's and the draft's passes
    made in ``combined`` mode with the draft's reading there (``combined_prompts``), from
    bench measurement records (their ``stats`` dicts)."""
    out: dict[str, dict] = {}
    for cat in sorted({r["category"] for r in records}):
        recs = [r for r in records if r["category"] == cat]
        entry: dict = {}
        for mode, key in (("draft", ""), ("lookup", "lookup_")):
            rs = [r for r in recs if r["mode"] == mode]
            if mode == "draft" and not rs:
                rs = [r for r in recs if r["mode"] == "combined"]
            alpha, n = pooled_alpha([r["stats"] for r in rs])
            if alpha is None:
                continue
            entry[key + "alpha"], entry[key + "n_drafted"] = alpha, n
            entry[key + "coverage"] = source_coverage([r["stats"] for r in rs], mode)
            entry[key + "mean_k"] = mean_proposal([r["stats"] for r in rs], mode)
            if mode == "draft":
                entry["by_position"] = pooled_by_position([r["stats"] for r in rs])
                entry.update(_read_prompts(rs))
            # the same per prompt (its records over runs): the measured speed-up is the mean
            # of the prompts' ratios (geometric), so the prediction is made per prompt too
            ids = sorted({r.get("prompt_id") for r in rs}, key=str)
            if all(i is not None for i in ids):
                entry[key + "prompts"] = [
                    dict(coverage=source_coverage([r["stats"] for r in ps], mode),
                         **(_read_prompts(ps) if mode == "draft" else _lookup_prompt(ps)))
                    for ps in ([r for r in rs if r["prompt_id"] == i] for i in ids)]
        rs = [r for r in recs if r["mode"] == "combined"]
        ids = sorted({r.get("prompt_id") for r in rs}, key=str)
        if rs and all(i is not None for i in ids):
            per = [[r for r in rs if r["prompt_id"] == i] for i in ids]
            if all(source_coverage([r["stats"] for r in ps], "lookup") is not None for ps in per):
                entry["combined_prompts"] = [
                    dict(lookup_coverage=source_coverage([r["stats"] for r in ps], "lookup"),
                         draft_coverage=source_coverage([r["stats"] for r in ps], "draft"),
                         **_read_prompts(ps)) for ps in per]
        out[cat] = entry
    return out


def _lookup_prompt(rs: list[dict]) -> dict:
    """{"tokens_per_pass", "mean_k", "sizes"} of one prompt's lookup-mode records: the tokens
    its lookup passes made (accepted and the target's own) and proposed, a pass, and how many
    of them decoded n tokens ({n: passes}, where the records count passes by size); {} where
    lookup ran no pass."""
    passes = sum(r["stats"].get("passes_by_source", {}).get("lookup", 0) for r in rs)
    if not passes:
        return {}
    acc = sum(r["stats"].get("accepted_by_source", {}).get("lookup", 0) for r in rs)
    out = dict(tokens_per_pass=(acc + passes) / passes, mean_k=mean_proposal([r["stats"] for r in rs], "lookup"))
    if all(r["stats"].get("passes_by_size") for r in rs):
        # lookup mode's passes of 2 tokens or more are lookup's (one token: the target alone)
        sizes: dict[int, int] = {}
        for r in rs:
            for k, c in r["stats"]["passes_by_size"].items():
                if int(k) >= 2:
                    sizes[int(k)] = sizes.get(int(k), 0) + c
        if sum(sizes.values()) == passes:
            out["sizes"] = sizes
    return out


def _read_prompts(rs: list[dict]) -> dict:
    """{"n_generated", "catchup_tokens"} of draft-mode (or combined-mode) records, the latter
    over those the draft model drafted in (not those only lookup proposed in), where the
    records have ``n_prompt``; else {}."""
    def drafted(st: dict) -> int:
        by = st.get("drafted_by_source")
        return by.get("draft", 0) if by is not None else st.get("n_drafted", 0)
    ran = [r for r in rs if drafted(r["stats"])]
    if not all("n_prompt" in r for r in ran):
        return {}
    return dict(n_generated=sum(r["stats"].get("n_generated", 0) for r in rs),
                catchup_tokens=sum(catchup_tokens(r) for r in ran))


# how far the one-token pass at a run's end may be from the run's for the end's catch-up cost to
# be rescaled by their ratio (the fiftieth session's Spec-Bench run ended with a cost model whose
# one-token pass read 0.0 s, and the advice's catch-up 4.3 s a token)
CATCHUP_RESCALE_MAX = 3.0


def run_costs(records: list[dict], end: dict, modes: tuple[str, ...] = ("draft", "combined")) -> dict:
    """The costs a bench run's advice is read at: the median, over the generations of the
    draft model's decoder (``draft`` mode, else ``combined``; or the first of ``modes`` that
    has any), of the cost model each left (its one-token time, each verification size and
    the draft token as multiples of it: the records' ``policy["costs"]``), rather than the
    model as the run's last generation left it (``end``: {"times", "t_draft", "t_catchup"}),
    which a slow or quick spell at the end of the run skews for every category (a slow one
    makes every batch look cheap against its one-token pass).  The catch-up's cost keeps
    its ratio to the one-token pass at the end (where that pass is within CATCHUP_RESCALE_MAX
    of the run's either way; else it is taken as it is); a mode without a draft model keeps
    ``end``'s draft cost.  Returns ``end`` where the records hold no costs."""
    for mode in modes:
        snaps = [r["policy"]["costs"] for r in records if r.get("mode") == mode and r.get("policy")
                 and (r["policy"].get("costs") or {}).get("t1")
                 and (r["policy"]["costs"].get("draft") or mode == "lookup")]
        if snaps:
            break
    else:
        return end
    t1 = statistics.median(c["t1"] for c in snaps)
    sizes = {int(n) for c in snaps for n in c["verify"]}
    times = {n: t1 * statistics.median(c["verify"][str(n)] for c in snaps if str(n) in c["verify"])
             for n in sorted(sizes)}
    times[1] = t1
    drafts = [c["draft"] for c in snaps if c.get("draft")]
    out = dict(times=times, t_draft=t1 * statistics.median(drafts) if drafts else end.get("t_draft"),
               t_catchup=end.get("t_catchup"))
    t1_end = (end.get("times") or {}).get(1)
    if out["t_catchup"] and t1_end and 1 / CATCHUP_RESCALE_MAX <= t1 / t1_end <= CATCHUP_RESCALE_MAX:
        out["t_catchup"] *= t1 / t1_end
    return out


def category_costs(records: list[dict], end: dict) -> dict[str, dict]:
    """Per category, the costs its own generations measured (run_costs over them): the
    draft model's (``draft`` mode, else ``combined``) and n-gram lookup's (``lookup`` mode),
    each falling back to ``end`` (the run's), with the target alone's one-token pass as the
    category's generations ran it (runner.one_token_seconds over all of them, below).  A
    category's passes run at its own contexts (an edit's 8-token pass after 400 cached
    tokens costs ~10 % more than after 40: each query reads the whole cache) and in the
    machine's pace while it ran (a one-token pass moves 15 % with the memory traffic beside
    it, a batch's arithmetic much less), so priced at the run's median the default run's
    edits were predicted 2.82x with lookup against 2.39x measured, and 2.47x priced at their
    own."""
    out: dict[str, dict] = {}
    for cat in sorted({r["category"] for r in records if "category" in r}):
        recs = [r for r in records if r.get("category") == cat]
        out[cat] = dict(draft=run_costs(recs, end), lookup=run_costs(recs, end, ("lookup",)))
        # The target alone at the one-token passes the category's generations ran, in every
        # mode (the target alone's own, lookup's unmatched ones, ...), not at what a draft
        # generation's cost model held: one that runs few such passes (often only at its
        # answer's start) keeps the pace of then while its batches follow the pace of now,
        # and a draft-mode cell's model was seen to hold the target alone 10-15 % off the
        # cells beside it.  Re-read from eleven newcomer runs and four held-out runs (151
        # categories; bench/advice_reread.py), the best advised against the best measured: mean
        # |log| error 0.0385 -> 0.0339, beyond 10 % in 10 -> 6, beyond 15 % in 3 -> 0 (the
        # worst +20.3 % -> -14.1 %).
        t1 = runner.one_token_seconds(recs)
        if t1:
            for key, c in out[cat].items():
                if c is not end:
                    out[cat][key] = dict(c, times={**c["times"], 1: t1})
    return out


def pooled_alpha(stats: list[dict]) -> tuple[float | None, int]:
    """Per-token acceptance over several generations: accepted / (accepted + rejections),
    rejections being the passes whose proposal was not wholly accepted (each stats' α is
    accepted / (accepted + rejected), so its tested count is accepted / α)."""
    acc = tested = drafted = 0.0
    for s in stats:
        if not s["n_drafted"]:
            continue
        drafted += s["n_drafted"]
        acc += s["n_accepted"]
        tested += s["n_accepted"] / s["alpha"] if s["alpha"] > 0 else s["n_drafted"]
    if not drafted:
        return None, 0
    return (acc / tested if tested else 0.0), int(drafted)


def source_coverage(stats: list[dict], source: str) -> float | None:
    """Share of the generated tokens that came out of ``source``'s passes (its accepted
    tokens plus each such pass's own target token); None if the stats do not say."""
    made = from_source = 0
    for s in stats:
        passes, accepted = s.get("passes_by_source"), s.get("accepted_by_source")
        if passes is None or accepted is None:
            return None
        made += s.get("n_generated", 0)
        from_source += passes.get(source, 0) + accepted.get(source, 0)
    return min(1.0, from_source / made) if made else None


def mean_proposal(stats: list[dict], source: str) -> float | None:
    """Tokens ``source`` proposed per pass of its own, over several generations; None if the
    stats do not say or it ran no pass."""
    drafted = passes = 0
    for s in stats:
        by_pass, by_drafted = s.get("passes_by_source"), s.get("drafted_by_source")
        if by_pass is None or by_drafted is None:
            return None
        passes += by_pass.get(source, 0)
        drafted += by_drafted.get(source, 0)
    return drafted / passes if passes else None


def lookup_coverage(stats: list[dict]) -> float | None:
    """source_coverage of n-gram lookup."""
    return source_coverage(stats, "lookup")


def pooled_by_position(stats: list[dict]) -> list[float]:
    """Conditional acceptance p_i at each draft position (token i accepted given tokens < i
    were).  A generation's ``acceptance_by_position[i]`` is the share of passes drafting
    position i whose first i+1 tokens were all accepted; these are averaged over generations
    (each weighted equally), then p_i = u_i / u_(i-1)."""
    cols: dict[int, list[float]] = {}
    for s in stats:
        for i, p in enumerate(s.get("acceptance_by_position") or []):
            cols.setdefault(i, []).append(p)
    out, prev = [], 1.0
    for _, v in sorted(cols.items()):
        u = sum(v) / len(v)
        out.append(min(1.0, u / prev) if prev > 0 else 0.0)
        prev = u
    return out


def measure(args, prompts: list[Prompt], say=lambda text: None) -> tuple[dict, float, dict, float, dict]:
    """Load the pair, calibrate its cost model and measure acceptance per category: greedy
    generations drafting PROBE_N_DRAFT tokens per pass (draft model), and n-gram lookup alone
    (on a second load of the target, no draft model).  Returns (verify times {n: seconds},
    seconds per draft token, acceptance per category, seconds per catch-up token, each
    category's own costs), the costs the median over the draft's generations (run_costs,
    category_costs)."""
    args.modes = ["draft", "lookup"]
    decs = runner.open_decoders(args, args.modes)
    try:
        dec = decs["draft"]
        formatted = {p.id: runner.format_prompt(dec, p.text, args.chat_template) for p in prompts}
        say("calibrating the cost model")
        text, add_special = formatted[prompts[0].id]
        dec.generate(text, add_special=add_special, max_tokens=min(16, args.max_tokens), n_draft="auto")
        records = []
        for i, p in enumerate(prompts):
            say(f"[{i + 1}/{len(prompts)}] {p.id}")
            text, add_special = formatted[p.id]
            for mode in ("draft", "lookup"):
                r = decs[mode].generate(text, add_special=add_special, max_tokens=args.max_tokens,
                                        n_draft=PROBE_N_DRAFT, lookup=mode == "lookup")
                records.append(dict(category=p.category, mode=mode, stats=r.stats.to_dict(),
                                    n_prompt=runner.prompt_length(dec, text, add_special),
                                    policy=runner.policy_record(r.stats.raw)))
        # the costs over the measurement, not as its last generation left them (run_costs)
        costs = run_costs(records, dict(times=dict(dec.cost_model.verify_times), t_draft=dec.cost_model.draft_time,
                                        t_catchup=dec.cost_model.catchup_time))
    finally:
        runner.close_decoders(decs)
    return (costs["times"], costs["t_draft"], acceptance_from_records(records), costs["t_catchup"],
            category_costs(records, costs))


# -- report -----------------------------------------------------------------------------
def tables(a: dict) -> list:
    out = []
    t = Table(title="Costs on this machine", **TABLE_STYLE)
    t.add_column("target pass of n tokens", justify="left")
    for n in a["verify_cost"]:
        if n in SHOWN_SIZES:
            t.add_column(str(n), justify="right")
    t.add_row("ms", *[f"{a['verify_cost'][n] * a['t_target_1'] * 1e3:.1f}" for n in a["verify_cost"] if n in SHOWN_SIZES])
    t.add_row("× one pass", *[f"{a['verify_cost'][n]:.2f}" for n in a["verify_cost"] if n in SHOWN_SIZES])
    out.append(t)
    if a.get("cost_ratio") is not None:
        out.append(Text(f"one draft token: {a['t_draft'] * 1e3:.1f} ms, cost ratio c = {a['cost_ratio']:.2f}; "
                        f"ceiling at 100 % acceptance: {a['ceiling_100']:.2f}x (k={a['ceiling_100_k']})"))
    t = Table(title="Predicted best setting per category", **TABLE_STYLE)
    with_lookup = any(x["lookup_alpha"] is not None for x in a["categories"].values())
    with_combined = any(x.get("combined_predicted_speedup") is not None for x in a["categories"].values())
    cols = ("category", "draft α", "draft share", "best k", "predicted") + (("lookup α", "lookup share", "lookup k",
                                                              "lookup predicted") if with_lookup else ()) \
        + (("combined predicted",) if with_combined else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "category" else "right")

    def pred(s, k):
        return "–" if s is None else ("target alone" if k == 0 else f"{s:.2f}x")
    for cat, x in a["categories"].items():
        cells = [fmt(x["alpha"], ".0%"), fmt(x["coverage"], ".0%"), str(x["best_k"]) if x["alpha"] is not None else "–",
                 pred(x["predicted_speedup"], x["best_k"])]
        if with_lookup:
            cells += [fmt(x["lookup_alpha"], ".0%"), fmt(x["lookup_coverage"], ".0%"),
                      str(x["lookup_best_k"]) if x["lookup_alpha"] is not None else "–",
                      pred(x["lookup_predicted_speedup"], x["lookup_best_k"])]
        if with_combined:
            cells.append(fmt(x.get("combined_predicted_speedup"), ".2f", "x"))
        t.add_row(Text(cat), *cells)
    out.append(t)
    return out


def print_advice(console: Console, a: dict) -> None:
    for t in tables(a):
        console.print(t)
    console.print(Text("Advice: " + a["sentence"], style="bold"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastspec.bench advise", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=models.DEFAULT_PAIR[0], help="target model name or GGUF path")
    p.add_argument("--draft", default=models.DEFAULT_PAIR[1], help="draft model name or GGUF path")
    add_common_arguments(p)
    p.add_argument("--json", action="store_true", help="print the advice as JSON instead of tables")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    err, console = Console(stderr=True, soft_wrap=True, highlight=False), Console(highlight=False)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        prompts = select_prompts(load_prompts(args.prompts), args.categories, args.limit)
        if not prompts:
            raise BenchError("no prompts left after --categories/--limit", 2)
        t0 = time.perf_counter()
        times, t_draft, acceptance, t_catchup, by_category = measure(args, prompts, (lambda text: None) if args.json else
                                       (lambda text: err.print(f"advise: {text}", markup=False)))
        if not times:
            raise BenchError("no verification cost was measured")
        a = advise(times, t_draft, acceptance, t_catchup=t_catchup, by_category=by_category)
        a.update(schema=SCHEMA, target=args.target, draft=args.draft, seconds=time.perf_counter() - t0)
    except BenchError as e:
        err.print(f"fastspec.bench advise: error: {e}", markup=False, highlight=False)
        return e.code
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(a, indent=1))
    else:
        print_advice(console, a)
    return 0
