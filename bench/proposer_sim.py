#!/usr/bin/env python3
"""What would the prediction and suffix proposers achieve on the real target?  (Offline.)

    python bench/proposer_sim.py edits            # code edits, prediction= the original code
    python bench/proposer_sim.py multiturn --limit 1 --categories writing,coding,math

The target alone generates greedily (the reference output, and its measured tok/s).  Then
the compiled proposers are replayed on that output as the loop would drive them (begin,
propose, verify against the reference, extend), and the passes are timed with this machine's
measured verification cost per batch size (bench/verify_cost.py's cost_curve).  Two rules:

* verify-all: every proposal is verified in full (at most --cap tokens), whatever its
  confidence, unless the cost curve says the batch cannot pay even if all were accepted;
* conf: verify the k tokens that maximise expected tokens per second when the proposer's
  own confidences are taken as the acceptance probabilities (no learning);
* oracle-k: verify exactly as many proposed tokens as will be accepted (a ceiling).

Each is the speed-up over one-token passes: n x t(1) / (time of the passes).  This is a
replay, not a measured generation: the real loop adds its own overheads and its policy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastspec  # noqa: E402
from fastspec import _core  # noqa: E402
from fastspec.bench import geomean  # noqa: E402
from fastspec.corpus import SuffixCorpus  # noqa: E402
from verify_cost import CODE, cost_curve  # noqa: E402

# Held-out edit tasks: (source code, instruction).  The answer is mostly the code itself.
EDITS = [
    ('''def parse_config(path):
    """Read a key=value config file into a dict."""
    result = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def get_int(config, key, default=0):
    try:
        return int(config.get(key, default))
    except ValueError:
        return default
''', "Rename the function parse_config to load_config. Change nothing else. Reply with the whole file in one Python code block."),
    ('''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            raise IndexError("peek at empty stack")
        return self.items[-1]

    def __len__(self):
        return len(self.items)
''', "Add a method is_empty that returns True when the stack has no items, right after __init__. Change nothing else. Reply with the whole file in one Python code block."),
    ('''import math


def distance(p, q):
    dx = p[0] - q[0]
    dy = p[1] - q[1]
    return math.sqrt(dx * dx + dy * dy)


def perimeter(points):
    total = 0.0
    for i in range(len(points)):
        total += distance(points[i], points[(i + 1) % len(points)])
    return total


def centroid(points):
    n = len(points)
    x = sum(p[0] for p in points) / n
    y = sum(p[1] for p in points) / n
    return (x, y)
''', "Replace math.sqrt(dx * dx + dy * dy) by math.hypot(dx, dy). Change nothing else. Reply with the whole file in one Python code block."),
    ('''def merge_sorted(a, b):
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out


def merge_sort(xs):
    if len(xs) <= 1:
        return xs
    mid = len(xs) // 2
    return merge_sorted(merge_sort(xs[:mid]), merge_sort(xs[mid:]))
''', "Remove the function merge_sort and keep merge_sorted exactly as it is. Reply with the whole file in one Python code block."),
]


def replay(proposer, prompt, output, cost, cap, rule):
    seq = list(prompt)
    proposer.py_begin(seq, len(seq))
    i, spent, proposed, accepted_total, passes = 0, 0.0, 0, 0, 0
    while i < len(output):
        passes += 1
        toks, conf, key = proposer.py_propose(seq, cap)
        good = 0
        while good < len(toks) and i + good < len(output) and toks[good] == output[i + good]:
            good += 1
        if rule == "oracle-k":
            k = good
        elif rule == "conf":              # the proposer's own confidences as the only evidence
            best, k, expect, chain = 1.0 / cost[1], 0, 1.0, 1.0
            for j in range(min(len(toks), len(output) - i - 1)):
                chain *= max(conf[j], 0.0)
                expect += chain
                if expect / cost[j + 2] > best:
                    best, k = expect / cost[j + 2], j + 1
        else:
            k = len(toks)
        k = min(k, len(output) - i - 1)
        if k and cost[k + 1] >= cost[1] * (k + 1):
            k = 0
        acc = min(good, k)
        if k:
            proposer.py_feedback(k, acc)
            proposed += k
        accepted_total += acc
        spent += cost[k + 1]
        seq += output[i:i + acc + 1]
        i += acc + 1
        proposer.py_extend(seq)
    return len(output) * cost[1] / spent, proposed, accepted_total, passes


def edit_inputs(dec, code: str, instruction: str) -> tuple[list[int], list[int]]:
    """An edit task as the target sees it: (prompt ids with the chat template, prediction ids
    = the original code in a code block)."""
    model = dec.target_model
    text = model.apply_chat_template([{"role": "user", "content": f"```python\n{code}```\n\n{instruction}"}])
    return dec.tokenize(text, add_special=False), model.tokenize(f"```python\n{code}```", add_special=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", choices=["edits", "multiturn"])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"
                                             / "spec_bench_questions.jsonl"),
                    help="Spec-Bench questions (default: ../shared/data/ beside the checkout)")
    ap.add_argument("--categories", default="writing,roleplay,reasoning,math,coding,extraction,stem,humanities")
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cap", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    dec = fastspec.SpeculativeDecoder("default-target", None, n_ctx=8192, n_threads=args.threads)
    model = dec.target_model
    cost = cost_curve(dec._target_ctx, model.tokenize(CODE * 40, add_special=False),
                      list(range(1, args.cap + 2)), repeats=3)
    print("cost per pass (ms):", {n: round(t * 1e3, 1) for n, t in cost.items()}, flush=True)
    rows = []
    if args.task == "edits":
        for code, instruction in EDITS:
            ids, pred = edit_inputs(dec, code, instruction)
            alone = dec.generate(ids, max_tokens=args.max_tokens, speculative=False)
            r = []
            for rule in ("verify-all", "conf", "oracle-k"):
                sp, prop, acc, passes = replay(_core.PredictionProposer(pred, model.n_vocab), ids,
                                               alone.tokens, cost, args.cap, rule)
                r.append(sp)
                print(f"  {rule:10s} {sp:.2f}x  ({acc}/{prop} verified proposed tokens accepted, "
                      f"{len(alone.tokens) / passes:.1f} tokens per pass)")
            print(f"edit: {len(alone.tokens)} tokens, target alone {alone.stats.tokens_per_second:.1f} tok/s; "
                  f"prediction replay: verify-all {r[0]:.2f}x, conf {r[1]:.2f}x, oracle-k {r[2]:.2f}x", flush=True)
            rows.append(("edit", r))
    else:
        qs = [json.loads(line) for line in open(args.prompts)]
        cats = args.categories.split(",")
        corpus = SuffixCorpus(model)
        for cat in cats:
            for q in [q for q in qs if q["category"] == cat and len(q["turns"]) == 2][:args.limit]:
                msgs = [{"role": "user", "content": q["turns"][0]}]
                ids1 = dec.tokenize(model.apply_chat_template(msgs), add_special=False)
                first = dec.generate(ids1, max_tokens=args.max_tokens, speculative=False)
                corpus.add(ids1 + first.tokens)
                msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": q["turns"][1]}]
                ids2 = dec.tokenize(model.apply_chat_template(msgs), add_special=False)
                second = dec.generate(ids2, max_tokens=args.max_tokens, speculative=False)
                r = []
                for rule in ("verify-all", "conf", "oracle-k"):
                    sp, prop, acc, passes = replay(corpus.proposer(), ids2, second.tokens, cost, args.cap, rule)
                    r.append(sp)
                    print(f"  {rule:10s} {sp:.2f}x  ({acc}/{prop} verified proposed tokens accepted, "
                          f"{len(second.tokens) / passes:.2f} tokens per pass)")
                corpus.add(ids2 + second.tokens)
                print(f"{cat:12s} q{q['question_id']} turn 2: {len(second.tokens)} tokens; suffix replay "
                      f"verify-all {r[0]:.2f}x, conf {r[1]:.2f}x, oracle-k {r[2]:.2f}x (corpus {corpus.n_tokens} tokens)", flush=True)
                rows.append((cat, r))
    print("geometric means: verify-all %.2fx, conf %.2fx, oracle-k %.2fx over %d" % (
        geomean([r[0] for _, r in rows]), geomean([r[1] for _, r in rows]),
        geomean([r[2] for _, r in rows]), len(rows)))
    dec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
