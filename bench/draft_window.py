#!/usr/bin/env python3
"""How much does reading only a window of a long prompt cost a draft model's agreement?

    python bench/draft_window.py                        # the built-in prompts, default pair
    python bench/draft_window.py --windows 16,32,64,0 --at 8,16

An adaptive draft far behind (a long prompt) catches up with the text's first DRAFT_CATCHUP_HEAD
tokens and the last W of what it missed (``_core.DRAFT_CATCHUP_WINDOW``), leaving the
stretch between out of its cache.  For each prompt the target alone answers greedily;
then the draft reads the text as such a catch-up would at the answer's ``--at``-th token
(window W, or all of it for W = 0) and, teacher-forced on the rest of the answer, its
most likely next token is compared with the target's at every position.  The share that
agree is about what the draft would be accepted at there.  Prompts no longer than the
head and the window read the same either way; the overall line counts the others only.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import fastspec
from fastspec import _core, models
from fastspec.bench.prompts import BenchError, load_prompts, select_prompts
from fastspec.bench.runner import format_prompt

HEAD = _core.DRAFT_CATCHUP_HEAD   # a far-behind draft's catch-up keeps the text's first tokens


def agreement(ctx: _core.Context, seq: list[int], cut: int, window: int) -> tuple[int, int]:
    """(agreeing, compared): the draft reads seq[:cut] (its head and the last ``window``
    tokens only, if window > 0 and the text is longer), then predicts each later token."""
    ctx.clear()
    start = 0
    if window > 0 and cut > HEAD + window:
        ctx.decode(seq[:HEAD], logits="none")
        ctx.skip_to(cut - window)
        start = cut - window
    pos = start
    while pos < cut - 1:
        m = min(ctx.n_batch, cut - 1 - pos)
        ctx.decode(seq[pos:pos + m], logits="none")
        pos += m
    hits = n = 0
    while pos < len(seq) - 1:
        m = min(ctx.n_batch, len(seq) - 1 - pos)
        ctx.decode(seq[pos:pos + m], logits="all")
        for j in range(m):
            hits += int(np.argmax(ctx.get_logits(j)) == seq[pos + j + 1])
            n += 1
        pos += m
    return hits, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", default=models.DEFAULT_PAIR[0])
    ap.add_argument("--draft", default=models.DEFAULT_PAIR[1])
    ap.add_argument("--prompts", default=None, help="JSONL prompt file (default: the built-in set)")
    ap.add_argument("--categories", default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--windows", default=f"16,32,{_core.DRAFT_CATCHUP_WINDOW},0",
                    help="windows to compare, comma-separated (0: read everything)")
    ap.add_argument("--at", default="16", help="answer tokens before the catch-up, comma-separated")
    args = ap.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",")]
        ats = [int(a) for a in args.at.split(",")]
    except ValueError:
        ap.error("--windows and --at take comma-separated integers")
    if any(w < 0 for w in windows) or any(a < 1 for a in ats) or args.max_tokens < 2:
        ap.error("windows must be >= 0, --at >= 1, --max-tokens >= 2")
    try:
        prompts = select_prompts(load_prompts(args.prompts),
                                 args.categories.split(",") if args.categories else None, args.limit)
    except BenchError as e:
        ap.error(str(e))
    target = str(models.resolve(args.target))
    draft_model = _core.Model(str(models.resolve(args.draft)))
    totals = {(a, w): [0, 0] for a in ats for w in windows}
    with fastspec.SpeculativeDecoder(target, None) as dec, \
            _core.Context(draft_model, n_ctx=dec.n_ctx, n_batch=256) as ctx:
        print(f"{'prompt':18} {'prompt tok':>10} {'answer':>6}  at  " + "  ".join(f"{('W=' + str(w)) if w else 'all':>6}" for w in windows))
        for p in prompts:
            text, add_special = format_prompt(dec, p.text, True)
            r = dec.generate(text, max_tokens=args.max_tokens, add_special=add_special)
            prompt = dec.tokenize(text, add_special=add_special)
            seq = prompt + list(r.tokens)
            for a in ats:
                if a >= len(r.tokens) - 1:
                    continue
                cut = len(prompt) + a
                shortened = any(w > 0 and cut > HEAD + w for w in windows)
                shares = []
                for w in windows:
                    h, n = agreement(ctx, seq, cut, w)
                    shares.append(h / n)
                    if shortened:
                        totals[(a, w)][0] += h
                        totals[(a, w)][1] += n
                print(f"{p.id:18} {len(prompt):>10} {len(r.tokens):>6} {a:>3}  " + "  ".join(f"{s:>6.2f}" for s in shares))
    for a in ats:
        row = [totals[(a, w)] for w in windows]
        if row[0][1]:
            print(f"overall at {a} (prompts a window shortens): "
                  + ", ".join(f"{('W=' + str(w)) if w else 'all'} {h / n:.3f}" for w, (h, n) in zip(windows, row)))
    draft_model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
