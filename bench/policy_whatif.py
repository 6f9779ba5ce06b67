#!/usr/bin/env python3
"""What would the policy do with one machine's costs held fixed?  (Deterministic.)

    python bench/policy_whatif.py --costs results.json            # costs a bench run measured
    python bench/policy_whatif.py --t1-ms 73 --verify 2:88,4:116,8:172,16:367 --draft-ms 18
    python bench/policy_whatif.py --costs results.json --multi-turn --prompts spec_bench.jsonl --limit 3
    python bench/policy_whatif.py --costs results.json --n-draft 3      # a fixed length, to compare with auto
    python bench/policy_whatif.py --costs results.json --as-bench       # the bench's draft mode, history and all
    python bench/policy_whatif.py --costs results.json --as-bench --lookup --trace coding-1   # every pass of one
    python bench/policy_whatif.py --costs results.json --costs-of 161:combined:3 --as-bench --lookup   # one cell's costs

Runs the built-in benchmark prompts (or --prompts) in order on one decoder, greedy, with the
cost model set to the given costs and held (``CostModel.set``), so every choice of the policy
(run the draft or not, how many tokens, when to probe) depends only on the tokens and the
acceptance it has seen: the same on every run and every machine load.  For each prompt it
prints what the policy did and the speed-up by its own accounting: the target alone's passes
at t1 against the passes it chose, each at the held costs.  That is a prediction, not a
measurement: use it to compare policy changes without the machine's noise, then confirm
with ``python -m fastspec.bench``.

``--as-bench`` also runs, uncounted, what the bench's shared decoder runs around each
generation (the target alone before and after it, combined mode after draft mode or draft mode
before combined): the policy's history (answer lengths, acceptance carried over) is then the
bench's, and so are its choices (summarisation-1's 16 drafted, 7 kept in 15 draft passes, as in
the bench runs of the thirty-fifth session; without the replay it drafts otherwise); each
generation finds the draft's cache as the bench leaves it, as after another prompt.

``--multi-turn`` does what the bench's ``--multi-turn`` corpus mode does: the target alone
answers each two-turn conversation's first turn, which goes into a suffix corpus with its
answer; then turn 2 of each is generated with the draft, lookup and the corpus.  A line per
category (the mean of its prompts) comes before the overall figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings

import fastspec
from fastspec import models
from fastspec.bench.prompts import BenchError, load_prompts, select_prompts, two_turn_prompts
from fastspec.bench.runner import first_turns, forget_prompt, format_prompt, prompt_length, template_head


def costs_from_bench(path: str, record: str | None = None) -> tuple[float, dict[int, float], float, float | None]:
    """(t1, {n: seconds}, draft seconds, the draft's catch-up seconds per token or None) from
    a ``python -m fastspec.bench --out`` file: the costs its advice measured, or with
    ``record`` ("PROMPT:MODE[:ROUND[:N]]") those one measurement's cost model held as its
    generation ended (the costs move with the machine's pace from cell to cell: a choice seen
    in one cell may need that cell's costs to show; N picks among the matches, the first by
    default; a cell without a draft keeps the advice's draft token)."""
    def passes(t1: float, ratios: dict) -> dict[int, float]:
        return {1: t1, **{int(n): t1 * float(x) for n, x in ratios.items()}}

    try:
        doc = json.loads(open(path, encoding="utf-8").read())
        adv = doc["advice"]
        t1 = float(adv["t_target_1"])
        verify = passes(t1, adv["verify_cost"])
        td = float(adv["t_draft"] or 0.0)
        catchup = adv.get("t_catchup")
        if record:
            pid, mode, rnd, nth = (record.split(":") + [None, None])[:4]
            nth = int(nth or 0)
            found = [m for m in doc["measurements"]
                     if m.get("prompt_id") == pid and m.get("mode") == mode
                     and (rnd is None or str(m.get("round") or 0) == rnd) and (m.get("policy") or {}).get("costs")]
            if len(found) <= nth:
                raise SystemExit(f"error: no measurement {record!r} with the policy's costs in {path}")
            c = found[nth]["policy"]["costs"]
            t1 = float(c["t1"])
            verify = passes(t1, c["verify"])
            if c.get("draft"):
                td = float(c["draft"]) * t1
        return t1, verify, td, float(catchup) if catchup else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: cannot read the measured costs from {path}: {e}") from None


def parse_verify(text: str, t1: float) -> dict[int, float]:
    out = {1: t1}
    for item in filter(None, (x.strip() for x in text.split(","))):
        n, _, ms = item.partition(":")
        try:
            out[int(n)] = float(ms) / 1e3
        except ValueError:
            raise SystemExit(f"error: --verify wants n:ms pairs, got {item!r}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--draft", default="default-draft", help="draft model, or 'none' (with --lookup: the bench's lookup mode)")
    ap.add_argument("--prompts", help="JSONL prompt file (default: the built-in set)")
    ap.add_argument("--categories", help="only these categories (comma-separated)")
    ap.add_argument("--limit", type=int, help="at most N prompts per category")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--lookup", action="store_true", help="n-gram lookup as well (the bench's combined mode)")
    ap.add_argument("--multi-turn", action="store_true",
                    help="two-turn prompts: turn 1 by the target alone into a suffix corpus, turn 2 timed "
                         "(the bench's --multi-turn corpus mode: draft, lookup and the corpus)")
    ap.add_argument("--costs", help="a python -m fastspec.bench --out file: take the costs it measured")
    ap.add_argument("--costs-of", metavar="PROMPT:MODE[:ROUND[:N]]",
                    help="with --costs: the costs one measurement's cost model held as its generation ended "
                         "(e.g. 161:combined:3), not the advice's")
    ap.add_argument("--t1-ms", type=float, help="a one-token target pass, ms")
    ap.add_argument("--verify", default="", help="target passes of n tokens, 'n:ms,...' (others interpolated)")
    ap.add_argument("--draft-ms", type=float, help="one draft token, ms")
    ap.add_argument("--catchup-ms", type=float,
                    help="per token of a draft catch-up (default: the cost model's priors, a draft token per token "
                         "for a few tokens, a third of one for a long catch-up)")
    ap.add_argument("--n-draft", default="auto",
                    help="'auto' (the policy), or a fixed number of tokens to propose each pass (the bench's "
                         "--n-draft: what the policy is compared with)")
    ap.add_argument("--as-bench", action="store_true",
                    help="around each generation, what the bench's shared decoder also runs there (the target "
                         "alone before it, draft mode before combined or combined after draft, the target alone "
                         "again): not counted, but they move the decoder's history as in the bench")
    ap.add_argument("--attn-us", type=float, default=0.0,
                    help="attention: microseconds each query of a pass spends per cached token (the cost model's "
                         "attn_time; default 0: every pass costs the same at any context)")
    ap.add_argument("--at-context", type=int, default=100,
                    help="with --attn-us: the cached tokens at which the given costs hold (default 100)")
    ap.add_argument("--threads", type=int, help="threads a decoder runs on (what it chooses does not depend on "
                                                 "them: 1 lets two what-ifs run side by side on 2 cores)")
    ap.add_argument("--trace", default="",
                    help="prompt ids (comma-separated): after each one's line, every pass of its counted "
                         "generation as the policy saw it (stats.explain())")
    a = ap.parse_args(argv)
    if a.n_draft != "auto":
        try:
            a.n_draft = int(a.n_draft)
        except ValueError:
            a.n_draft = 0
        if a.n_draft < 1:
            ap.error("--n-draft: 'auto' or a number of tokens >= 1")
    if a.costs_of and not a.costs:
        ap.error("--costs-of needs --costs FILE")
    if a.costs:
        t1, verify, td, measured_catchup = costs_from_bench(a.costs, a.costs_of)
    elif a.t1_ms and a.draft_ms is not None:
        t1, td, measured_catchup = a.t1_ms / 1e3, a.draft_ms / 1e3, None
        verify = parse_verify(a.verify, t1)
    else:
        ap.error("give --costs FILE, or --t1-ms and --draft-ms (and --verify)")
    if not t1 > 0 or td < 0:
        ap.error("costs must be positive")
    catchup = a.catchup_ms / 1e3 if a.catchup_ms is not None else measured_catchup
    try:
        prompts = load_prompts(a.prompts)
        if a.multi_turn:
            prompts = two_turn_prompts(prompts)
            if not prompts:
                raise BenchError("--multi-turn needs prompts with two turns (Spec-Bench's \"turns\")", 2)
        prompts = select_prompts(prompts, a.categories.split(",") if a.categories else None, a.limit)
    except BenchError as e:
        raise SystemExit(f"error: {e}") from None
    target = str(models.resolve(a.target))
    alone_dec = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draft = None if a.draft.lower() == "none" else str(models.resolve(a.draft))
        dec = fastspec.SpeculativeDecoder(target, draft, corpus=a.multi_turn, n_threads=a.threads)
        if a.multi_turn:
            alone_dec = fastspec.SpeculativeDecoder(target, n_threads=a.threads)
    try:
        if not a.attn_us >= 0 or a.at_context < 0:
            ap.error("--attn-us and --at-context must be >= 0")
        dec.cost_model.set(draft_time=td, catchup_time=catchup, verify_times=verify,
                           attn_time=a.attn_us * 1e-6, at_context=a.at_context)
        dec.acceptance.reset()
        print(f"held costs: t1 {t1 * 1e3:.1f} ms, draft token {td * 1e3:.1f} ms, catch-up "
              f"{'the priors' if catchup is None else format(catchup * 1e3, '.1f') + ' ms/token'}, "
              f"verify {', '.join(f'{n}: {s * 1e3:.0f}' for n, s in sorted(verify.items()))} ms"
              + (f", attention {a.attn_us:g} us per query per cached token from {a.at_context}" if a.attn_us else ""))
        print(f"{'prompt':18s} {'tokens':>6s} {'drafted':>7s} {'accepted':>8s} {'draft passes/empty':>18s} {'probes':>6s} "
              f"{'read all at':>11s} {'predicted':>9s}")
        if a.multi_turn:      # as the bench does: turn 1 by the target alone, into the corpus
            formatted = first_turns({"target": alone_dec, "corpus": dec}, prompts, ["target", "corpus"],
                                    argparse.Namespace(max_tokens=a.max_tokens, chat_template=True))
        else:
            formatted = {p.id: format_prompt(dec, p.text, True) for p in prompts}
        alone = chosen = 0.0
        by_category = {}
        replay = a.as_bench and draft is not None and not a.multi_turn

        head = template_head(dec, True)

        traced = set(filter(None, a.trace.split(",")))

        def gen(text, add, lookup, trace=False):     # lookup None: the target alone
            if replay:      # as the bench does: the draft's cache as after another prompt
                forget_prompt([dec], head)
            if lookup is None:
                return dec.generate(text, add_special=add, max_tokens=a.max_tokens, speculative=False)
            return dec.generate(text, add_special=add, max_tokens=a.max_tokens, temperature=0.0,
                                lookup=lookup, n_draft=a.n_draft, trace=trace)

        for p in prompts:
            text, add = formatted[p.id]
            if replay:      # the bench's order: target alone, draft, combined, target alone again
                gen(text, add, None)
                if a.lookup:
                    gen(text, add, False)
            r = gen(text, add, a.lookup or a.multi_turn, p.id in traced)
            if replay:
                if not a.lookup:
                    gen(text, add, True)
                gen(text, add, None)
            s = r.stats
            n0 = prompt_length(dec, text, add)
            # the target alone: a one-token pass per token, each after the context it reads
            t_alone = sum(dec.cost_model.verify_time(1, n0 + i) for i in range(s.n_generated + s.raw["n_eog"]))
            t_chosen = sum(sec for _, sec in s.raw["predicted_by_source"].values())
            if a.n_draft != "auto" and draft is not None:
                # a fixed length's draft reads the prompt as the target does, before the
                # passes (auto catches up when first run, inside them): a long catch-up's cost
                t_chosen += n0 * dec.cost_model.catchup_time
            alone += t_alone
            chosen += t_chosen
            by_category.setdefault(p.category, []).append(t_alone / t_chosen)
            probes = sum(s.probes_by_source.values())
            print(f"{p.id[:18]:18s} {s.n_generated:6d} {s.n_drafted:7d} {s.n_accepted:8d} "
                  f"{s.raw['n_draft_steps']:14d}/{s.raw['n_draft_empty']:<3d} {probes:6d} "
                  f"{s.raw['draft_read_all_at'] if s.raw.get('draft_read_all_at', -1) >= 0 else '-':>11} {t_alone / t_chosen:8.3f}x", flush=True)
            if p.id in traced:
                print(s.explain(), flush=True)
        means = {c: statistics.mean(v) for c, v in by_category.items()}
        print("by category: " + ", ".join(f"{c} {m:.3f}x" for c, m in means.items())
              + f" (lowest {min(means.values()):.3f}x)")
        print(f"overall, by the policy's accounting at the held costs (not measured): {alone / chosen:.3f}x")
    finally:
        dec.close()
        if alone_dec is not None:
            alone_dec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
