#!/usr/bin/env python3
"""What shaping one row's sampling distribution (or the greedy pick) costs, per loop this CPU runs.

    python bench/sampling_cost.py                      # the default target's logits
    python bench/sampling_cost.py --model default-draft --repeats 500

At temperature > 0 every row a speculative pass verifies, every token a draft model samples
and every token of the target alone goes through ``shape_probs`` (temperature, top-k, top-p,
min-p over the whole vocabulary).  This decodes a chat prompt with the model, takes the
logits of its last position, and times that row under the usual settings with each of the
loops of src/fastspec/_vecmath.h this CPU can run (the scalar ones always; AVX2 and AVX-512
where it has them; NEON on 64-bit Arm), the fastest first; the median of --rounds rounds of
--repeats calls each, in microseconds.  The first line is greedy decoding's own work on a
row: the argmax alone (the target alone's pick) and then the argmax with the runner-up's gap
(a verified row's, where the policy tracks the target's certainty), together.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

SETTINGS = [
    dict(temperature=0.7),
    dict(temperature=1.0),
    dict(temperature=0.7, top_p=0.95),
    dict(temperature=0.7, top_k=40),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),      # llama.cpp's defaults
]
PROMPT = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\nThe"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default-target", help="a model name or a GGUF path")
    ap.add_argument("--repeats", type=int, default=200, help="calls per round (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per setting and loop (default 3)")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.rounds < 1:
        ap.error("--repeats and --rounds must be >= 1")
    from fastspec import _core, models

    m = _core.Model(str(models.resolve(a.model)))
    with _core.Context(m, n_ctx=256) as c:
        c.decode(m.tokenize(PROMPT), logits="last")
        row = c.get_logits()
    m.close()
    best, paths = _core._vec_paths()
    paths = [best] + [p for p in reversed(paths) if p != best]

    def timed(call) -> float:
        per = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(a.repeats):
                call()
            per.append((time.perf_counter() - t0) / a.repeats)
        return statistics.median(per)

    rows = [("greedy: argmax, then argmax with gap", lambda: _core._argmax_f32(row))]
    rows += [(", ".join(f"{k} {v}" for k, v in params.items()),
              lambda params=params: _core._shape_probs(row, **params)) for params in SETTINGS]

    print(f"{a.model}: {row.shape[0]} logits; loops this machine runs: {', '.join(paths)} "
          f"({best} by default); microseconds per row")
    print(f"{'setting':48s}" + "".join(f"{p:>10s}" for p in paths))
    try:
        for label, call in rows:
            cells = []
            for p in paths:
                _core._set_vec_path(p)
                cells.append(timed(call) * 1e6)
            print(f"{label:48s}" + "".join(f"{x:10.0f}" for x in cells))
    finally:
        _core._set_vec_path(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
