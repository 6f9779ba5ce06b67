#!/usr/bin/env python3
"""What a verification batch costs on this machine, and how far batched logits are
from one-token logits.

    python bench/verify_cost.py                       # default target, 2 threads
    python bench/verify_cost.py --model default-draft --sizes 1,2,4,8
    python bench/verify_cost.py --drift               # also the batch-vs-single logit drift
    GGML_CPU_TILED_MM=0 python bench/verify_cost.py --no-repack --drift
                                                      # ggml's one-token kernels at every size
    python bench/verify_cost.py --sizes 1,2,4,8,16 --drift --both
                                                      # unpatched kernels, then the patched default
    python bench/verify_cost.py --sizes 1,2,4,8 --context 200,1000,2000
                                                      # the curve after 200, 1000, 2000 cached tokens
    python bench/verify_cost.py --sizes 1,2,4,8,16 --repeats 30 --cores /tmp/old/_core.so,/tmp/new/_core.so
                                                      # two builds side by side in one process

Cost: after a 200-token context (--context: other lengths), decode n tokens at once with
logits at every position (what a verification pass does), remove them again; each round
times every size once, in an order turned round each round, so that all sizes meet the same
minutes of the machine's pace; the median of the rounds is printed per n, and beside it the
median of the round's t(n)/t(1) (each ratio of two passes a few hundred milliseconds apart: a
pace that moves over the run moves both).  Attention makes each row's cost grow with the
cached tokens while the weights are read once per pass whatever the batch, so on a CPU the
ratios to a one-token pass grow with the context (a long prompt verifies dearer than the
bench's short ones).  On a CPU the curve is not smooth: ggml multiplies 4 rows at a time
with repacked weights, so a batch of 4 can cost less than a batch of 3.

ggml's CPU backend switches kernels with the batch size: repacked weights take a 4-row
gemm from 4 rows, and K-quant tensors a tiled kernel from 8 rows (GGML_CPU_TILED_MM=0
turns that one off).  With both off (--no-repack and that variable), every batch size
runs the one-token kernels, the drift is zero, and the cost curve shows what exactness
at every batch size costs.

With patches/*.patch (the default build), a batch of up to GGML_CPU_INVARIANT_ROWS (16)
rows runs every row through the one-token kernels and larger batches keep ggml's; the
variable, read once per process, set to 0 gives ggml's kernels at every size (--both runs
the script under each setting).

Drift: decode the prompt, generate 128 tokens greedily one at a time, keeping the logits;
then decode the same prompt batch and the same tokens in chunks of 2/3/4/8/16 and report the largest |difference| over the vocabulary
per position (median, 99th percentile, max), and how close the one-token top-2 logits
came (the margins below which a batched verification may pick the other token).

Two builds (--cores A,B: each a built fastspec/_core*.so, e.g. one saved before a patch): both are
loaded in this one process, each with its own ggml and its own copy of the model, and each pass size
is timed on one build and then on the other, the order turned round each repeat; per build the
median time, the median of its ratio to the first build's pass timed just beside it, and t(n)/t(1).
The machine's pace moves from minute to minute (and a process started right after another ran
5-8 % slower here, whichever build it held): ratios of passes side by side are what compares.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

_core = models = None   # fastspec's, imported in main (after --core has picked the build to load)

CODE = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"
QUESTION = ("<|im_start|>user\nWrite a Python function that checks whether a string is a palindrome, "
            "ignoring case and non-alphanumeric characters.<|im_end|>\n<|im_start|>assistant\n")


def _load_build(name: str, path: str, flag: str):
    """The compiled core at ``path`` (a built fastspec/_core*.so) imported as module ``name``."""
    import importlib.util
    if not os.path.isfile(path):
        raise SystemExit(f"{flag} {path}: no such file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{flag} {path}: not a loadable extension module")
    mod = importlib.util.module_from_spec(spec)
    if name == "fastspec._core":
        sys.modules[name] = mod              # before fastspec imports its own
    spec.loader.exec_module(mod)
    return mod


def load_core(path: str | None) -> None:
    """Import fastspec with its compiled core taken from ``path`` (another build's _core*.so) when
    given, else the installed one; binds this module's ``_core`` and ``models``."""
    global _core, models
    if path:
        _load_build("fastspec._core", path, "--core")
    from fastspec import _core as core, models as m
    _core, models = core, m


def open_passes(core, path: str, args, longest: int, error):
    """(model, context, tokens) for timing passes with build ``core``: a context that holds
    ``longest`` tokens (the cached ones and a pass), tokens enough of repeated code for it;
    ``error(message)`` where the model's training context is shorter."""
    model = core.Model(path, repack=not args.no_repack, n_gpu_layers=args.n_gpu_layers)
    if longest > model.n_ctx_train:
        n_train = model.n_ctx_train
        model.close()
        error(f"--context plus a pass of --sizes' largest is {longest} tokens, more than the model's "
              f"training context ({n_train} tokens)")
    ctx = core.Context(model, n_ctx=max(2048, longest + 16), n_threads=args.threads, flash_attn=True)
    per_copy = max(1, len(model.tokenize(CODE, add_special=False)))
    return model, ctx, model.tokenize(CODE * (40 + longest // per_copy), add_special=False)


def timed_pass(ctx, tokens: list[int], base: int, n: int) -> float:
    """Seconds of one pass of n tokens with logits at every position after ``base`` cached
    tokens, taken back out of the cache afterwards."""
    t0 = time.perf_counter()
    ctx.decode(tokens[base:base + n], logits="all")
    secs = time.perf_counter() - t0
    ctx.remove_from(base)
    return secs


def compare_builds(cores: list[str], sizes: list[int], base: int, args, error) -> int:
    """--cores: every build loaded in this one process (each its own module, its own ggml), the
    same passes timed build after build, the order turned round each repeat; per build the median
    time of each size, the median of its ratio to the first build's pass just beside it, and the
    ratio of its medians to its smallest batch's."""
    builds = [_load_build(f"fastspec_build_{i}._core", path, "--cores") for i, path in enumerate(cores)]
    path = str(models.resolve(args.model))   # a GGUF path as given, or a model's name
    runs = []
    for core in builds:
        runs.append(open_passes(core, path, args, base + max(sizes), error))
        runs[-1][1].decode(runs[-1][2][:base])
    times = [{n: [] for n in sizes} for _ in builds]
    for r in range(args.repeats + 1):
        for n in sizes:
            for k in [(r + j) % len(builds) for j in range(len(builds))]:
                _, ctx, tokens = runs[k]
                times[k][n].append(timed_pass(ctx, tokens, base, n))
    print(f"{os.path.basename(path)}, {args.threads} threads, {len(builds)} builds in one process, passes "
          f"alternated, {args.repeats} repeats after {base} cached tokens")
    small = min(sizes)
    for k, core in enumerate(cores):
        print(f"== {core}")
        print(f" n   ms/pass   x first build (pass beside it)   x n={small}")
        med = {n: statistics.median(times[k][n][1:]) for n in sizes}      # the first repeat warms caches
        for n in sizes:
            rel = statistics.median([b / a for a, b in zip(times[0][n][1:], times[k][n][1:])])
            print(f"{n:2d}  {med[n] * 1000:8.2f}   {rel:6.3f}                           {med[n] / med[small]:5.2f}")
    for model, ctx, _ in runs:
        ctx.close()
        model.close()
    return 0


def cost_curve(ctx: _core.Context, tokens: list[int], sizes: list[int], repeats: int,
               base: int = 200) -> tuple[dict[int, float], dict[int, float]]:
    """Per size the median seconds of a pass over ``repeats`` rounds (each round every size
    once, the order turned round each round; a first round warms caches and is not counted),
    and, where 1 is among the sizes, the median of each round's t(n)/t(1)."""
    ctx.clear()
    ctx.decode(tokens[:base])
    times = {n: [] for n in sizes}
    for r in range(repeats + 1):
        for j in range(len(sizes)):
            n = sizes[(r + j) % len(sizes)]
            times[n].append(timed_pass(ctx, tokens, base, n))
    out = {n: statistics.median(t[1:]) for n, t in times.items()}
    ratio = {}
    if 1 in times:
        ratio = {n: statistics.median([a / b for a, b in zip(t[1:], times[1][1:])]) for n, t in times.items()}
    return out, ratio


def drift(ctx: _core.Context, model: _core.Model, chunks: list[int], n_gen: int = 128) -> None:
    prompt = model.tokenize(QUESTION, add_special=False, parse_special=True)
    ctx.clear()
    ctx.decode(prompt)
    logits = ctx.get_logits()
    gen, ref = [], []          # ref[i]: the one-token logits after decoding gen[i]
    for _ in range(n_gen):
        tok = int(np.argmax(logits))
        gen.append(tok)
        ctx.decode([tok])
        logits = ctx.get_logits()
        ref.append(logits.copy())
    top2 = np.sort(np.stack(ref), axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    for chunk in chunks:
        # the same prompt batch as above, so both start from the same KV cache (a prompt of a
        # different length would take other kernels and differ before any verification)
        ctx.clear()
        ctx.decode(prompt)
        diffs = []
        for i in range(0, n_gen, chunk):
            ctx.decode(gen[i:i + chunk], logits="all")
            for j in range(min(chunk, n_gen - i)):
                diffs.append(float(np.max(np.abs(ctx.get_logits(j) - ref[i + j]))))
        d = np.array(diffs)
        print(f"chunks of {chunk:2d}: max |batched - one-token logit| per position: median {np.median(d):.3f}, "
              f"p99 {np.quantile(d, 0.99):.3f}, max {d.max():.3f}; positions bit-identical: "
              f"{int((d == 0).sum())}/{len(d)}")
    print(f"one-token top-2 margins over {n_gen} positions: < 0.1: {(margins < 0.1).sum()}, "
          f"< 0.5: {(margins < 0.5).sum()}, < 1: {(margins < 1).sum()}; smallest {margins.min():.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default-target", help="model name or GGUF path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="1,2,3,4,5,6,7,8,9,12,16,17,24,32")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--context", default="200",
                    help="cached tokens before each measured pass; several (200,1000,2000) give a curve each")
    ap.add_argument("--no-repack", action="store_true", help="load without repacked weights")
    ap.add_argument("--n-gpu-layers", type=int, default=-1,
                    help="layers on a GPU backend where the build has one (-1: all, 0: the CPU alone)")
    ap.add_argument("--drift", action="store_true", help="also measure batch-vs-single logit drift")
    ap.add_argument("--chunks", default="2,3,4,8,16", help="chunk sizes for --drift")
    ap.add_argument("--both", action="store_true",
                    help="run twice, without (GGML_CPU_INVARIANT_ROWS=0) and with the batch-invariant "
                         "verification rows of patches/*.patch")
    ap.add_argument("--core", help="load this build of fastspec's compiled core (a _core*.so) instead of the installed one")
    ap.add_argument("--cores", help="two or more builds' _core*.so, comma-separated: each loaded in this process, "
                                    "the same passes timed build after build")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        contexts = [int(c) for c in args.context.split(",")]
    except ValueError:
        ap.error("--sizes and --context want comma-separated whole numbers")
    if min(sizes) < 1 or min(contexts) < 1:
        ap.error("--sizes and --context want numbers >= 1")
    if args.cores:
        cores = args.cores.split(",")
        if len(cores) < 2 or args.drift or args.both or len(contexts) > 1:
            ap.error("--cores wants two or more builds, one --context, and neither --drift nor --both")
        missing = [c for c in cores if not os.path.isfile(c)]
        if missing:
            ap.error(f"--cores: no such file: {', '.join(missing)}")
        load_core(None)
        return compare_builds(cores, sizes, contexts[0], args, ap.error)
    if args.both:
        argv = [a for a in sys.argv[1:] if a != "--both"]
        for label, rows in (("ggml's kernels (GGML_CPU_INVARIANT_ROWS=0)", "0"),
                            ("batch-invariant verification rows (patched default)", None)):
            env = dict(os.environ)
            env.pop("GGML_CPU_INVARIANT_ROWS", None)
            if rows is not None:
                env["GGML_CPU_INVARIANT_ROWS"] = rows
            print(f"== {label}", flush=True)
            rc = subprocess.run([sys.executable, __file__, *argv], env=env).returncode
            if rc:
                return rc
        return 0
    load_core(args.core)
    path = str(models.resolve(args.model))   # a GGUF path as given, or a model's name
    model, ctx, tokens = open_passes(_core, path, args, max(contexts) + max(sizes), ap.error)
    tiled = os.environ.get("GGML_CPU_TILED_MM", "1") not in ("0", "")
    rows = os.environ.get("GGML_CPU_INVARIANT_ROWS")
    print(f"{os.path.basename(path)}, {args.threads} threads, repack {'off' if args.no_repack else 'on'}, "
          f"tiled K-quant kernel {'on' if tiled else 'off (GGML_CPU_TILED_MM=0)'}, "
          f"GGML_CPU_INVARIANT_ROWS={rows if rows is not None else 'default (16 when patched)'}, "
          f"AVX-512 two-blocks kernels {('off', 'on', 'for one row')[_core.zmm_pairs()]} (GGML_CPU_ZMM_PAIRS), "
          f"--n-gpu-layers {args.n_gpu_layers}")
    print(f"backends: {_core.system_info().strip()}")
    for base in contexts:
        curve, ratio = cost_curve(ctx, tokens, sizes, args.repeats, base)
        if len(contexts) > 1:
            print(f"-- after {base} cached tokens")
        print(" n   ms/pass   x one-token pass (in the same round)   ms per token")
        for n, secs in curve.items():
            rel = f"{ratio[n]:5.2f}" if ratio else "  -  "
            print(f"{n:2d}  {secs * 1000:8.1f}   {rel}                                {secs * 1000 / n:6.1f}")
    if args.drift:
        drift(ctx, model, [int(c) for c in args.chunks.split(",")])
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
