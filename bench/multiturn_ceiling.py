#!/usr/bin/env python3
"""How fast can the free proposers make Spec-Bench's second turns, at best?  (Offline.)

    python bench/multiturn_ceiling.py --limit 3 --save /tmp/mt3.json
    python bench/multiturn_ceiling.py --load /tmp/mt3.json --ratios 2:1.2,4:1.5,8:2.6,16:4.5

The target alone answers each conversation as ``python -m fastspec.bench --multi-turn``
has it (every first turn, then every second turn, greedy, the suffix corpus fed with each
first turn and its answer, then with each second turn and its answer); one batched pass
over each second answer gives the gap between the target's two best logits at each of its
tokens (close to the one-token passes' gaps: enough for buckets).  At every position of a
second answer it asks
n-gram lookup and the suffix corpus what they would propose there, and how many of those
tokens the answer has.  Then three rules are priced with a cost curve (this machine's,
measured, or ``--ratios`` t(n)/t(1)), each as a speed-up over one-token passes:

* conf: at each position the proposal (of either proposer) and length with the best
  expected tokens per second, its own confidences taken as the acceptance chances;
* informed: the same, with each proposal's chances read from what proposals like it (same
  proposer and key, confidence in fifths, the target's gap at the token before in five
  buckets) gave *on these very answers* -- fitted in-sample, so a bound for any policy that
  learns from those signals, not one it could reach;
* oracle: the passes that emit the answer fastest, knowing how far each proposal will be
  accepted (a ceiling for these proposers whatever the policy).

The policy of the real loop learns the same signals as it goes (``python -m fastspec.bench
--multi-turn`` measures it); this says how much of the gap to the oracle is information the
proposers do not give.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fastspec.bench import geomean  # noqa: E402

CAP = 15              # tokens a proposal may verify: a pass of at most 16, the loop's limit
GAP_EDGES = (0.5, 1.0, 2.0, 4.0)


def interpolate(ratios: dict[int, float], top: int) -> dict[int, float]:
    """t(n)/t(1) for n = 1..top from the sizes given (linear between them, past the last
    at the last size's per-token slope)."""
    pts = sorted({1: 1.0, **ratios}.items())
    out = {}
    for n in range(1, top + 1):
        lo = max((p for p in pts if p[0] <= n), key=lambda p: p[0])
        hi = min((p for p in pts if p[0] >= n), key=lambda p: p[0], default=None)
        if hi is None:
            (a, ta), (b, tb) = pts[-2], pts[-1]
            out[n] = tb + (n - b) * (tb - ta) / (b - a)
        elif hi[0] == lo[0]:
            out[n] = lo[1]
        else:
            out[n] = lo[1] + (n - lo[0]) * (hi[1] - lo[1]) / (hi[0] - lo[0])
    return out


def collect(args) -> list[dict]:
    import numpy as np
    import fastspec
    from fastspec import _core
    from fastspec.bench.prompts import load_prompts, select_prompts, two_turn_prompts
    from fastspec.bench.runner import format_prompt
    from fastspec.corpus import SuffixCorpus

    prompts = select_prompts(two_turn_prompts(load_prompts(args.prompts)), args.categories, args.limit)
    dec = fastspec.SpeculativeDecoder("default-target", n_threads=args.threads)
    model = dec.target_model
    corpus = SuffixCorpus(model)           # fed as the bench's corpus mode feeds its decoder's
    ctx = _core.Context(model, n_ctx=dec.n_ctx, n_threads=args.threads)

    def answer(text, add_special):
        """The target alone's answer, as the bench generates it."""
        r = dec.generate(text, add_special=add_special, max_tokens=args.max_tokens, temperature=0.0,
                         speculative=False)
        return dec.tokenize(text, add_special=add_special), r

    def gaps_of(toks, out):
        """The gap between the two best logits where each answer token was chosen (one
        batched pass: within a rounding of the one-token passes', enough for buckets)."""
        ctx.clear()
        ctx.decode(toks)
        rows = [ctx.get_logits()]
        if len(out) > 1:
            ctx.decode(out[:-1], logits="all")
            rows += [ctx.get_logits(i) for i in range(len(out) - 1)]
        return [float(np.diff(np.partition(r, -2)[-2:])[0]) for r in rows]

    seconds = []
    for p in prompts:                       # as the bench: every first turn before any second
        text, special = format_prompt(dec, p.turns[0], True)
        _, r = answer(text, special)
        corpus.add(text + r.text)
        seconds.append((p, format_prompt(dec, p.turns[1], True, [p.turns[0], r.text])))
        print(f"turn 1 {p.id}: {len(r.tokens)} tokens", flush=True)
    convs = []
    for p, (text, special) in seconds:
        toks, r = answer(text, special)
        out = list(r.tokens)
        look = _core.LookupProposer(dec.n_ctx)
        suffix = corpus.proposer()
        props = []
        for i in range(len(out)):
            here = []
            for name, pr in (("lookup", look), ("suffix", suffix)):
                prop, conf, key = pr.propose_for(toks + out[:i], CAP, restart=(i == 0))
                ok = 0
                while ok < len(prop) and i + ok < len(out) and out[i + ok] == prop[ok]:
                    ok += 1
                if prop:
                    here.append(dict(src=name, key=int(key), conf=[float(c) for c in conf], ok=ok,
                                     tokens=[int(t) for t in prop]))
            props.append(here)
        corpus.add(toks + out)              # as the decoder adds each generation
        convs.append(dict(id=p.id, category=p.category, n=len(out), gaps=gaps_of(toks, out), props=props))
        print(f"turn 2 {p.id}: {len(out)} tokens", flush=True)
    dec.close()
    return convs


def bucket(gaps, i, prop):
    g = gaps[i - 1] if i > 0 else -1.0
    gb = -1 if g < 0 else sum(g >= e for e in GAP_EDGES)
    return (prop["src"], prop["key"], min(int(prop["conf"][0] * 5), 4), gb)


def price(convs, cost) -> dict[str, dict[str, list[float]]]:
    """Speed-up per conversation under each rule, by category."""
    # informed: per bucket, the share of proposals whose first j tokens were all right
    hist = defaultdict(lambda: [0] * (CAP + 2))
    for c in convs:
        for i, here in enumerate(c["props"]):
            for p in here:
                h = hist[bucket(c["gaps"], i, p)]
                h[0] += 1
                for j in range(1, p["ok"] + 1):
                    h[j] += 1

    def best_k(chances, room):
        """(tokens per unit time over the one-token pass's, k) of the best length, k = 0 if none pays."""
        best, k, expect = 1.0, 0, 1.0
        for j in range(min(len(chances), room, CAP)):
            expect += chances[j]
            if expect / cost[j + 2] > best:
                best, k = expect / cost[j + 2], j + 1
        return best, k

    out = {r: defaultdict(list) for r in ("conf", "informed", "oracle")}
    for c in convs:
        n = c["n"]
        fastest = [0.0] * (n + 1)         # oracle: the least time from position i to the end
        for i in range(n - 1, -1, -1):
            fastest[i] = cost[1] + fastest[i + 1]
            for p in c["props"][i]:
                for j in range(1, min(p["ok"], n - i - 1, CAP) + 1):
                    fastest[i] = min(fastest[i], cost[j + 1] + fastest[i + j + 1])
        out["oracle"][c["category"]].append(n * cost[1] / fastest[0])
        for rule in ("conf", "informed"):
            i, spent = 0, 0.0
            while i < c["n"]:
                room = c["n"] - i - 1
                choice, value = None, 1.0
                for p in c["props"][i]:
                    if rule == "conf":
                        chain, ch = 1.0, []
                        for x in p["conf"]:
                            chain *= max(x, 0.0)
                            ch.append(chain)
                        v, k = best_k(ch, room)
                    else:
                        h = hist[bucket(c["gaps"], i, p)]
                        v, k = best_k([h[j] / h[0] for j in range(1, len(p["conf"]) + 1)], room)
                    if k and v > value:
                        choice, value = (k, min(p["ok"], k)), v
                if choice is None:
                    spent += cost[1]
                    i += 1
                else:
                    spent += cost[choice[0] + 1]
                    i += choice[1] + 1
            out[rule][c["category"]].append(c["n"] * cost[1] / spent)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "..", "shared", "data", "spec_bench_questions.jsonl"),
                    help="Spec-Bench questions (default: ../shared/data/ beside the checkout)")
    ap.add_argument("--categories", default="writing,roleplay,reasoning,math,coding,extraction,stem,humanities")
    ap.add_argument("--limit", type=int, default=3, help="conversations a category (default 3)")
    ap.add_argument("--max-tokens", type=int, default=128, help="as the bench's default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", help="write what was collected here (JSON)")
    ap.add_argument("--load", help="price what an earlier --save collected instead of generating")
    ap.add_argument("--ratios", help="t(n)/t(1) as n:ratio,... (default: measured here, after 200 tokens)")
    args = ap.parse_args()
    args.categories = args.categories.split(",") if args.categories else None
    ratios = None
    if args.ratios:
        try:
            ratios = {int(n): float(r) for n, r in (x.split(":") for x in args.ratios.split(","))}
        except ValueError:
            sys.exit(f"multiturn_ceiling.py: --ratios wants n:ratio,... (e.g. 2:1.4,4:1.9), got {args.ratios!r}")
        if not ratios or any(n < 2 or r < 1.0 for n, r in ratios.items()):
            sys.exit("multiturn_ceiling.py: --ratios needs sizes >= 2 and ratios >= 1")
    if args.load:
        try:
            with open(args.load) as f:
                convs = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"multiturn_ceiling.py: cannot read {args.load}: {e}")
    else:
        from fastspec.bench.prompts import BenchError
        try:
            convs = collect(args)
        except BenchError as e:
            sys.exit(f"multiturn_ceiling.py: {e}")
        if args.save:
            with open(args.save, "w") as f:
                json.dump(convs, f)
    if ratios is None:
        import fastspec
        from verify_cost import CODE, cost_curve
        with fastspec.SpeculativeDecoder("default-target", n_threads=args.threads) as dec:
            t = cost_curve(dec._target_ctx, dec.target_model.tokenize(CODE * 40, add_special=False),
                           [1, 2, 3, 4, 6, 8, 12, 16], repeats=3)
        ratios = {n: s / t[1] for n, s in t.items() if n > 1}
    cost = interpolate(ratios, CAP + 1)
    print("t(n)/t(1): " + ", ".join(f"{n}: {cost[n]:.2f}" for n in (2, 3, 4, 8, 16)))
    res = price(convs, cost)
    cats = list(dict.fromkeys(c["category"] for c in convs))
    for rule, by in res.items():
        per = {c: geomean(by[c]) for c in cats}
        print(f"{rule:9s} {geomean(list(per.values())):.3f}x  "
              + "  ".join(f"{c} {v:.2f}" for c, v in per.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
