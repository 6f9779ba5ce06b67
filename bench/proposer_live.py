#!/usr/bin/env python3
"""Measured generations with the prediction proposer (needs the engine's ``proposers=``).

    python bench/proposer_live.py --runs 1

For each held-out code edit of bench/proposer_sim.py: the target alone, n-gram lookup, and
the prediction proposer (prediction = the original code in a code block), greedy, each timed
as a whole generation (tokens/s of the generation; prefill excluded as the stats report it),
and whether the output is identical to the target alone's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastspec  # noqa: E402
from fastspec import _core  # noqa: E402
from fastspec.bench import geomean  # noqa: E402
from proposer_sim import EDITS, edit_inputs  # noqa: E402


def run_with(dec, ids, max_tokens, proposers, lookup=False):
    gen = _core.Generator(dec._target_ctx, None, temperature=0.0, max_tokens=max_tokens, adaptive=True,
                          lookup=lookup, max_verify=dec.max_verify_batch, cost=dec.cost_model,
                          acceptance=dec.acceptance, proposers=proposers)
    dec._start(gen, True, ids)
    t0 = time.perf_counter()
    gen.run()
    dt = time.perf_counter() - t0
    return list(gen.tokens), len(gen.tokens) / dt, gen.stats()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    dec = fastspec.SpeculativeDecoder("default-target", None, n_ctx=8192, n_threads=args.threads)
    model = dec.target_model
    ratios_p, ratios_l = [], []
    for code, instruction in EDITS:
        ids, pred = edit_inputs(dec, code, instruction)
        for _ in range(args.runs):
            ref, tps_alone, _ = run_with(dec, ids, args.max_tokens, [])
            look, tps_look, _ = run_with(dec, ids, args.max_tokens, [], lookup=True)
            out, tps_pred, st = run_with(dec, ids, args.max_tokens,
                                         [_core.PredictionProposer(pred, model.n_vocab)])
            ratios_p.append(tps_pred / tps_alone)
            ratios_l.append(tps_look / tps_alone)
            print(f"edit ({len(ref)} tokens): alone {tps_alone:.1f} tok/s; lookup {tps_look:.1f} "
                  f"({tps_look / tps_alone:.2f}x, identical {look == ref}); prediction {tps_pred:.1f} "
                  f"({tps_pred / tps_alone:.2f}x, identical {out == ref}); "
                  f"accepted by source {st.get('accepted_by_source')}", flush=True)
    print(f"geometric means over {len(ratios_p)}: prediction {geomean(ratios_p):.2f}x, "
          f"lookup {geomean(ratios_l):.2f}x")
    dec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
