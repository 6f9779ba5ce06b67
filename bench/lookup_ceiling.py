#!/usr/bin/env python3
"""How fast can n-gram lookup be on a prompt set, at best?  And how fast is it?

    python bench/lookup_ceiling.py --prompts ../shared/data/spec_bench_questions.jsonl \
        --categories summarization,rag --limit 5

For each prompt: the target alone generates greedily (the reference); fastspec's lookup
mode generates again (measured tok/s ratio).  Then, on the reference output, two
ceilings are computed with this machine's measured verification cost per batch size:

* oracle-k: the same proposer (the tokens after the latest earlier occurrence of the
  longest 8..2-token suffix), but verifying exactly as many proposed tokens as will be
  accepted, never more (no proposal rule can do better without choosing other text);
* any-copy: at every step, the longest stretch of the upcoming output found anywhere in
  the prompt or the output so far, verified exactly (a bound for every proposer that
  copies from the context, even one that knew the future).

Each is the speed-up over one-token passes, 1 / (time of the passes / n x t(1)).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastspec  # noqa: E402
from fastspec.bench.prompts import BenchError, load_prompts, select_prompts  # noqa: E402
from fastspec.bench.report import geomean  # noqa: E402
from verify_cost import CODE, cost_curve  # noqa: E402

MAX_PROPOSAL = 16


def latest_match(seq: list[int], n_min: int = 2, n_max: int = 8) -> int:
    """Start of the continuation after the latest earlier occurrence of the longest suffix."""
    size = len(seq)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = seq[size - n:]
        for s in range(size - n - 1, -1, -1):
            if seq[s:s + n] == suffix:
                return s + n
    return -1


def longest_copy(seq: list[int], upcoming: list[int]) -> int:
    best = 0
    for length in range(1, min(MAX_PROPOSAL, len(upcoming)) + 1):
        pattern = upcoming[:length]
        if not any(seq[j:j + length] == pattern for j in range(len(seq) - length + 1)):
            break
        best = length
    return best


def ceiling(prompt: list[int], output: list[int], cost: dict[int, float], rule: str) -> float:
    seq, i, spent = list(prompt), 0, 0.0
    while i < len(output):
        if rule == "oracle-k":
            start = latest_match(seq)
            proposal = seq[start:start + MAX_PROPOSAL] if start >= 0 else []
            accepted = 0
            while accepted < len(proposal) and i + accepted < len(output) and proposal[accepted] == output[i + accepted]:
                accepted += 1
        else:
            accepted = longest_copy(seq, output[i:])
        accepted = min(accepted, len(output) - i - 1)
        if accepted and cost[accepted + 1] / (accepted + 1) >= cost[1]:
            accepted = 0                     # verifying would not pay: a one-token pass
        spent += cost[accepted + 1]
        seq += output[i:i + accepted + 1]
        i += accepted + 1
    return len(output) * cost[1] / spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", required=True, help="Spec-Bench style JSONL ({category, turns})")
    ap.add_argument("--categories", default="summarization,rag")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="default-target")
    args = ap.parse_args()
    categories = args.categories.split(",")
    try:
        prompts = select_prompts(load_prompts(args.prompts), categories, args.limit)
    except BenchError as e:
        sys.exit(f"lookup_ceiling.py: {e}")
    dec = fastspec.SpeculativeDecoder(args.target, None, n_ctx=8192, n_threads=args.threads)
    tokens = dec.target_model.tokenize(CODE * 40, add_special=False)
    cost = cost_curve(dec._target_ctx, tokens, list(range(1, MAX_PROPOSAL + 2)), repeats=3)
    results: dict[str, list] = {}
    for category in categories:
        for q in [p for p in prompts if p.category == category]:
            prompt = dec.target_model.apply_chat_template([{"role": "user", "content": q.text}])
            ids = dec.tokenize(prompt, add_special=False)
            alone = dec.generate(ids, max_tokens=args.max_tokens, speculative=False)
            look = dec.generate(ids, max_tokens=args.max_tokens, lookup=True)
            row = (look.stats.tokens_per_second / alone.stats.tokens_per_second,
                   ceiling(ids, alone.tokens, cost, "oracle-k"), ceiling(ids, alone.tokens, cost, "any-copy"))
            results.setdefault(category, []).append(row)
            print(f"{category:14s} q{q.id}: {len(alone.tokens):3d} tokens, lookup measured "
                  f"{row[0]:.2f}x (acceptance {look.stats.acceptance_rate:.0%}, identical "
                  f"{look.tokens == alone.tokens}); ceilings: oracle-k {row[1]:.2f}x, any-copy {row[2]:.2f}x",
                  flush=True)
    print("\ngeometric means:  measured   oracle-k   any-copy")
    for category, vals in results.items():
        g = [geomean([v[k] for v in vals]) for k in range(3)]
        print(f"{category:14s}    {g[0]:.2f}x      {g[1]:.2f}x      {g[2]:.2f}x   ({len(vals)} prompts)")
    dec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
