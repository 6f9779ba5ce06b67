"""Read a bench run's advice again with this checkout's advisor, and set it beside what the
run measured.

    python bench/advice_reread.py results.json [more.json ...]

Each file is a ``python -m fastspec.bench --out`` result.  Nothing is measured: the advice is
re-read from the run's own records (the cost models its generations left, their acceptance)
by ``fastspec.bench.cli.run_advice``, as the run would print it at this code, and so is the
advice the file stored (what the code of that run said).  Per category, the best mode the
advice predicts against the best mode measured (the target alone included); per file the
worst category; over all files the mean |log(predicted / measured)| and how many categories
are more than 10 % and 15 % off (issue 11's bar: within 15 %).  Use it to judge a change to the
advisor on many runs at once instead of one new run's noise.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

from fastspec.bench import cli

MODES = ("draft", "lookup", "combined")
PREDICTED = ("predicted_speedup", "lookup_predicted_speedup", "combined_predicted_speedup")   # the advice's, per mode


def run_end_costs(doc: dict) -> dict | None:
    """The costs the run's advice started from (its cost model as the run ended)."""
    a = doc.get("advice") or {}
    if not a.get("t_target_1") or not a.get("verify_cost"):
        return None
    t1 = a["t_target_1"]
    return dict(times={int(n): r * t1 for n, r in a["verify_cost"].items()}, t_draft=a.get("t_draft"),
                t_catchup=a.get("t_catchup"))


def errors(doc: dict, advice: dict) -> dict[str, float]:
    """log(predicted best / measured best) per category."""
    out = {}
    measured = doc["summary"]["by_category"]
    for cat, v in (advice.get("categories") or {}).items():
        if not isinstance(v, dict) or cat not in measured:
            continue
        preds = [x for x in (v.get(k) for k in PREDICTED) if x]
        if not preds:
            continue
        best = max(x["speedup"] for m, x in measured[cat].items() if m in ("target",) + MODES)
        out[cat] = math.log(max(preds) / best)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="python -m fastspec.bench --out files")
    args = ap.parse_args(argv)
    pooled = {"stored": [], "now": []}
    for path in args.results:
        with open(path) as f:
            doc = json.load(f)
        end = run_end_costs(doc)
        if end is None or not end["t_draft"]:
            print(f"{path}: no advice stored (no draft model, or --no-advice)")
            continue
        line = [path]
        for name, advice in (("stored", doc["advice"]), ("now", cli.run_advice(doc["measurements"], end))):
            e = errors(doc, advice or {})
            if not e:
                continue
            pooled[name] += e.values()
            cat, worst = max(e.items(), key=lambda kv: abs(kv[1]))
            line.append(f"{name}: worst {cat} {math.exp(worst) - 1:+.1%}")
        print("  ".join(line))
    for name, e in pooled.items():
        if e:
            print(f"{name}: {len(e)} categories, mean |log(predicted / measured)| {statistics.mean(map(abs, e)):.4f}, "
                  f"beyond 10 %: {sum(abs(math.exp(x) - 1) > 0.10 for x in e)}, "
                  f"beyond 15 %: {sum(abs(math.exp(x) - 1) > 0.15 for x in e)}")


if __name__ == "__main__":
    main()
