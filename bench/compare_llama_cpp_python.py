#!/usr/bin/env python3
"""fastspec against llama-cpp-python on llama-cpp-python's own ground: the target alone and
prompt lookup (``LlamaPromptLookupDecoding``, its only speculative mode), greedy, the same
model, prompts, token ids and thread count, side by side.

llama-cpp-python lives in an interpreter of its own (``--lcp-python``; its stock llama.cpp
and fastspec's patched one are never loaded into one process), e.g.::

    python3 -m venv /tmp/lcp && CMAKE_ARGS="-DLLAVA_BUILD=OFF" \\
        /tmp/lcp/bin/pip install llama-cpp-python==0.3.36
    python bench/compare_llama_cpp_python.py --lcp-python /tmp/lcp/bin/python

(0.3.36 is the release whose sdist carries the llama.cpp commit fastspec vendors; on Linux it
builds for the installing CPU, as fastspec does.)  Each side runs in a worker process of its
own that keeps its models loaded (one ``Llama`` per setting; one fastspec decoder per mode,
as a user would keep one); the driver hands both the same prompt token ids (the built-in
bench prompts in the target's chat template), setting by setting and prompt by prompt, the
two sides taking turns so that the machine's pace hits both alike.  A warm-up generation
on every setting comes first and is not kept.

What is timed, the same way on both sides and from outside the library: the wall time from
the first generated token's arrival to the last's, over the tokens after the first (the
prompt's processing is left out: it is not what either side speculates on).  Both stop at
the first end-of-generation token (not counted) or at ``--max-tokens``.  The tokens of each
side's every setting are checked against its own target alone (greedy: they must be the
same), and fastspec's against llama-cpp-python's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The llama-cpp-python worker: JSON lines in, JSON lines out.
LCP_WORKER = r"""
import json, sys, time
from llama_cpp import Llama, llama_vocab_is_eog
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
path, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llms = {}
def get(setting):
    if setting not in llms:
        draft = None
        if setting != "target":
            draft = LlamaPromptLookupDecoding(num_pred_tokens=int(setting.split("-")[1]))
        llms[setting] = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                              draft_model=draft, verbose=False)
    return llms[setting]
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    llm = get(req["setting"])
    llm.reset()
    out, stamps = [], []
    for tok in llm.generate(req["tokens"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        stamps.append(time.perf_counter())
        if llama_vocab_is_eog(llm._model.vocab, tok):
            break
        out.append(int(tok))
        if len(out) >= req["max_tokens"]:
            break
    print(json.dumps({"tokens": out, "t_first": stamps[0], "t_last": stamps[len(out) - 1] if out else stamps[0],
                      "n_first": 1}), flush=True)
"""

# The fastspec worker: the same protocol.
FASTSPEC_WORKER = r"""
import json, sys, time
import fastspec
path, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dec = fastspec.SpeculativeDecoder(path, None, n_ctx=n_ctx, n_threads=threads)
eog = set()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    kw = dict(speculative=False) if req["setting"] == "target" else dict(lookup=True)
    out, t_first, n_first, t_last = [], None, 0, None
    for piece in dec.stream(req["tokens"], max_tokens=req["max_tokens"], add_special=False, **kw):
        now = time.perf_counter()
        if not piece.tokens:
            continue
        out += list(piece.tokens)
        if t_first is None:
            t_first, n_first = now, len(piece.tokens)
        t_last = now
    print(json.dumps({"tokens": out, "t_first": t_first, "t_last": t_last, "n_first": n_first}), flush=True)
"""


class Worker:
    """A worker process speaking the JSON-lines protocol above."""

    def __init__(self, name: str, python: str, code: str, model: str, n_ctx: int, threads: int):
        self.name = name
        self.proc = subprocess.Popen([python, "-c", code, model, str(n_ctx), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            self.proc.wait(timeout=60)
            raise SystemExit(f"error: the {name} worker did not start ({python}; its error above)")

    def run(self, setting: str, tokens: list[int], max_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"setting": setting, "tokens": tokens, "max_tokens": max_tokens}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"error: the {self.name} worker stopped (setting {setting})")
        r = json.loads(line)
        n_after = len(r["tokens"]) - r["n_first"]
        secs = (r["t_last"] - r["t_first"]) if r["t_first"] is not None else 0.0
        r["tok_s"] = n_after / secs if n_after > 0 and secs > 0 else float("nan")
        return r

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return statistics.geometric_mean(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lcp-python", required=True, help="an interpreter with llama-cpp-python installed")
    ap.add_argument("--target", default=None, help="GGUF path or fastspec model name (default: the default target)")
    ap.add_argument("--lookup-tokens", default="10,2",
                    help="LlamaPromptLookupDecoding num_pred_tokens to try (its default 10; its docs advise 2 on CPUs)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1, help="times each prompt is run per setting and side")
    ap.add_argument("--categories", default=None, help="only these built-in categories (comma-separated)")
    ap.add_argument("--out", default=None, help="write every measurement here (JSON)")
    args = ap.parse_args()

    import fastspec
    from fastspec import models
    from fastspec.bench.prompts import load_prompts

    target = args.target or models.DEFAULT_PAIR[0]
    path = target if os.path.exists(target) else str(models.resolve(target))
    model = fastspec._core.Model(path)
    prompts = load_prompts(None)
    if args.categories:
        keep = set(args.categories.split(","))
        prompts = [p for p in prompts if p.category in keep]
    toks = {p.id: model.tokenize(model.apply_chat_template([{"role": "user", "content": p.text}],
                                                           add_assistant=True),
                                 add_special=False, parse_special=True)
            for p in prompts}
    model.close()

    lookups = [f"lookup-{int(n)}" for n in args.lookup_tokens.split(",") if n.strip()]
    sides = {"fastspec": Worker("fastspec", sys.executable, FASTSPEC_WORKER, path, args.ctx, args.threads),
             "llama-cpp-python": Worker("llama-cpp-python", args.lcp_python, LCP_WORKER, path, args.ctx, args.threads)}
    # (setting label, fastspec setting, llama-cpp-python settings)
    plan = [("target", "target", ["target"]), ("lookup", "lookup", lookups)]
    rows = []
    try:
        first = prompts[0]
        for _, fs, lcps in plan:     # warm-up, not kept
            sides["fastspec"].run(fs, toks[first.id], 16)
            for s in lcps:
                sides["llama-cpp-python"].run(s, toks[first.id], 16)
        for rnd in range(args.rounds):
            for p in prompts:
                for label, fs, lcps in plan:
                    runs = [("fastspec", fs)] + [("llama-cpp-python", s) for s in lcps]
                    if (rnd + len(rows)) % 2:
                        runs.reverse()         # neither side always first
                    for side, setting in runs:
                        r = sides[side].run(setting, toks[p.id], args.max_tokens)
                        rows.append(dict(prompt=p.id, category=p.category, round=rnd, side=side,
                                         setting=setting, tok_s=r["tok_s"], n_tokens=len(r["tokens"]),
                                         tokens=r["tokens"]))
                        print(f"{p.id:18s} {side:17s} {setting:10s} {r['tok_s']:6.1f} tok/s  {len(r['tokens'])} tokens",
                              flush=True)
    finally:
        for w in sides.values():
            w.close()

    def cell(side, setting):
        return [r for r in rows if r["side"] == side and r["setting"] == setting]

    def ratio(a, b):
        """Geometric mean over prompts and rounds of a's tok/s over b's, paired."""
        pb = {(r["prompt"], r["round"]): r["tok_s"] for r in b}
        return geomean([r["tok_s"] / pb[(r["prompt"], r["round"])] for r in a if (r["prompt"], r["round"]) in pb])

    fs_t, lcp_t = cell("fastspec", "target"), cell("llama-cpp-python", "target")
    fs_l = cell("fastspec", "lookup")
    same = lambda a, b: sum(1 for x in a for y in b if (x["prompt"], x["round"]) == (y["prompt"], y["round"])
                            and x["tokens"] == y["tokens"])
    print()
    print(f"{len(prompts)} prompts x {args.rounds} round(s), max {args.max_tokens} tokens, {args.threads} threads, "
          f"{os.path.basename(path)}; tok/s after the first token, geometric means of paired ratios")
    print(f"target alone: fastspec / llama-cpp-python {ratio(fs_t, lcp_t):.3f}x "
          f"(medians {statistics.median(r['tok_s'] for r in fs_t):.1f} / {statistics.median(r['tok_s'] for r in lcp_t):.1f} tok/s); "
          f"the same tokens on {same(fs_t, lcp_t)}/{len(fs_t)}")
    print(f"fastspec lookup against its target alone {ratio(fs_l, fs_t):.3f}x; the same tokens on {same(fs_l, fs_t)}/{len(fs_l)}")
    for s in lookups:
        c = cell("llama-cpp-python", s)
        n = s.split("-")[1]
        print(f"llama-cpp-python prompt lookup (num_pred_tokens={n}) against its target alone {ratio(c, lcp_t):.3f}x; "
              f"fastspec lookup against it {ratio(fs_l, c):.3f}x; its tokens the same as its target alone's on "
              f"{same(c, lcp_t)}/{len(c)}")
    cats = sorted({r["category"] for r in rows})
    print("by category, fastspec lookup / llama-cpp-python lookup (" + ", ".join(f"n={s.split('-')[1]}" for s in lookups)
          + "), and each against its own target alone:")
    for cat in cats:
        f = [r for r in fs_l if r["category"] == cat]
        ft = [r for r in fs_t if r["category"] == cat]
        lt = [r for r in lcp_t if r["category"] == cat]
        parts = []
        for s in lookups:
            c = [r for r in cell("llama-cpp-python", s) if r["category"] == cat]
            parts.append(f"{ratio(f, c):.2f}x (theirs {ratio(c, lt):.2f}x)")
        print(f"  {cat:14s} fastspec lookup {ratio(f, ft):.2f}x its target; against llama-cpp-python: " + "; ".join(parts))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(args=vars(args), rows=rows), fh)
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
