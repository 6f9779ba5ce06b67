#!/usr/bin/env python3
"""Does one model's decode run slower right after the other model's than after its own?

    python bench/interleave_cost.py                        # the default pair, 2 threads
    python bench/interleave_cost.py --target T.gguf --draft D.gguf --rounds 60

Speculative decoding alternates the two models: a few draft decodes, then a target pass of
k + 1 tokens.  The cost model times each kind of pass where it runs (inside that
alternation) and keeps one pace for all of them, so a pass that runs slower after the
other model's decode (its weights pushed out of the caches) would be charged to the pace
and show up in every estimate, the target alone's included.  This script times, on one
pair of contexts with the caches as the loop leaves them:

* a target pass of k = 1..4 tokens (logits at every position, as verification asks) right
  after another target pass, after one draft decode, and after three;
* a one-token draft decode right after another draft decode and right after a target pass.

Each figure is a median over ``--rounds`` rounds taken in turn (the kinds interleaved, so
the machine's slow and fast minutes fall on all of them); the ratios are what to read.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

from fastspec import _core, models

TEXT = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n" * 20
BASE = 100          # tokens both contexts hold before every timed decode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--draft", default="default-draft")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--max-k", type=int, default=4, help="largest target pass timed (tokens)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or not 1 <= args.max_k <= 8 or args.threads < 1:
        ap.error("--rounds and --threads must be >= 1, --max-k in 1..8")
    tm = _core.Model(str(models.resolve(args.target, progress=False)))
    dm = _core.Model(str(models.resolve(args.draft, progress=False)))
    tc = _core.Context(tm, n_ctx=512, n_threads=args.threads, flash_attn=True)
    dc = _core.Context(dm, n_ctx=512, n_threads=args.threads, flash_attn=True)
    try:
        toks = tm.tokenize(TEXT, add_special=False)[:BASE + args.max_k + 4]
        if len(toks) < BASE + args.max_k + 1:
            raise SystemExit("the sample text is too short for this tokenizer")
        top = dm.n_vocab
        dtoks = [t if t < top else 0 for t in toks]
        tc.decode(toks[:BASE])
        dc.decode(dtoks[:BASE])

        def target(k, at=BASE):
            tc.remove_from(at)
            t0 = time.perf_counter()
            tc.decode(toks[at:at + k], logits="all")
            return time.perf_counter() - t0

        def draft(at=BASE):
            dc.remove_from(at)
            t0 = time.perf_counter()
            dc.decode(dtoks[at:at + 1])
            return time.perf_counter() - t0

        times: dict[tuple, list[float]] = collections.defaultdict(list)
        for _ in range(args.rounds):
            for k in range(1, args.max_k + 1):
                target(1)
                times[("t", k, "target")].append(target(k, BASE + 1))
                draft()
                times[("t", k, "draft")].append(target(k, BASE + 1))
                for j in range(3):
                    draft(BASE + j)
                times[("t", k, "3 drafts")].append(target(k, BASE + 1))
            draft()
            times[("d", 1, "draft")].append(draft(BASE + 1))
            target(1)
            times[("d", 1, "target")].append(draft(BASE + 1))
        med = {key: statistics.median(v) for key, v in times.items()}
        print(f"{args.rounds} rounds, {args.threads} threads; medians in ms (ratio to the first column)")
        print("target pass   after a target pass   after a draft decode   after 3 draft decodes")
        for k in range(1, args.max_k + 1):
            a = med[("t", k, "target")]
            b = med[("t", k, "draft")]
            c = med[("t", k, "3 drafts")]
            print(f"  {k} token{'s' if k > 1 else ' '}     {a * 1e3:8.3f}            {b * 1e3:8.3f} ({b / a:.3f}x)"
                  f"       {c * 1e3:8.3f} ({c / a:.3f}x)")
        a = med[("d", 1, "draft")]
        b = med[("d", 1, "target")]
        print(f"draft decode  after a draft decode {a * 1e3:.3f}   after a target pass {b * 1e3:.3f} ({b / a:.3f}x)")
    finally:
        tc.close()
        dc.close()
        tm.close()
        dm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
