#!/usr/bin/env python3
"""What a draft token costs on this machine: a bare one-token decode of the draft model with
every logit and with the leading ids only, what adding an id beyond them costs, and a
drafted token inside the loop (a fixed draft length, draft_vocab None and "auto"); then the
target alone against an adaptive generation that drafts nothing, alternately, on one decoder.

    python bench/draft_cost.py                                   # the default pair
    python bench/draft_cost.py --target T.gguf --draft D.gguf --tokens 256

The loop figure is the drafting time per drafted token (the draft's decodes, sampling and
bookkeeping), next to the bare decode: the difference is what the loop adds.  The last line
checks the baseline: the target alone and an adaptive generation whose policy never drafts
run the same passes, so their speeds should agree within the machine's noise.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

from fastspec import SpeculativeDecoder, _core, models

PROMPT = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"


def bare_decodes(path: str, threads: int, n_gpu_layers: int) -> None:
    model = _core.Model(path, n_gpu_layers=n_gpu_layers)
    ctx = _core.Context(model, n_ctx=1024, n_threads=threads, flash_attn=True)
    try:
        toks = model.tokenize(PROMPT * 40, add_special=False)[:140]
        lead = min(32768, model.n_vocab)
        far = list(range(model.n_vocab - 300, model.n_vocab - 100)) if model.n_vocab > lead + 300 else []

        def timed(label, n, extra=()):
            covered = ctx.set_n_logits(n, extra)
            ctx.clear()
            ctx.decode(toks[:100])
            times = []
            for i in range(40):
                t0 = time.perf_counter()
                ctx.decode([toks[100 + i % 40]])
                times.append(time.perf_counter() - t0)
                ctx.remove_from(100)
            print(f"bare one-token draft decode, {label} ({covered} ids): median "
                  f"{statistics.median(times[5:]) * 1e3:.3f} ms")

        timed("every logit", None)
        timed(f"leading {lead}", lead)
        if far:
            timed(f"leading {lead} + {len(far)} ids beyond", lead, far)
            t0 = time.perf_counter()
            for j in range(10):          # one new id each time: the extra rows are rebuilt
                ctx.set_n_logits(lead, far[:len(far) - 10 + j])
            print(f"adding an id beyond the leading {lead} (with ~{len(far)} there): "
                  f"{(time.perf_counter() - t0) / 10 * 1e3:.3f} ms a time")
    finally:
        ctx.close()
        model.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--draft", default="default-draft")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    args = ap.parse_args()
    if args.tokens < 8:
        ap.error("--tokens wants at least 8")
    target = str(models.resolve(args.target))
    draft = str(models.resolve(args.draft))
    print(f"backends: {_core.system_info().strip()}")
    bare_decodes(draft, args.threads or 2, args.n_gpu_layers)
    tps = lambda r: r.stats.tokens_per_second
    warnings.simplefilter("ignore")
    for dv in (None, "auto"):
        with SpeculativeDecoder(target, draft, draft_vocab=dv, n_threads=args.threads,
                                n_gpu_layers=args.n_gpu_layers) as dec:
            dec.generate(PROMPT, max_tokens=16)                   # calibrates
            r = dec.generate(PROMPT, max_tokens=args.tokens, n_draft=4)
            s = r.stats
            print(f"draft_vocab={dv!r} (leading {dec.draft_vocab}): n_draft=4, {s.n_drafted} drafted: "
                  f"{s.t_draft / max(1, s.n_drafted) * 1e3:.3f} ms a drafted token in the loop, "
                  f"{s.t_verify / s.n_target_passes * 1e3:.3f} ms a verification pass; the cost model "
                  f"holds {dec.cost_model.draft_time * 1e3:.3f} ms a draft token")
            if dv == "auto":
                order = []
                for _ in range(3):
                    a = dec.generate(PROMPT, max_tokens=args.tokens, speculative=False)
                    b = dec.generate(PROMPT, max_tokens=args.tokens, n_draft="auto")
                    order.append(f"{tps(a):.1f}/{tps(b):.1f} ({b.stats.n_drafted} drafted)")
                print("target alone / adaptive, alternately, tok/s: " + ", ".join(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
