#!/usr/bin/env python3
"""Run llama.cpp's own tools and fastspec side by side and print tok/s ratios.

Normally started by bench/compare_llama_cpp.sh (which builds the llama.cpp tools).
Every figure compared is generation-only (prefill excluded):
  * llama-speculative-simple: its "decoded N tokens in X seconds" line, timed from
    after the prompt is processed to the end of generation;
  * llama-simple: the "eval time" line of llama_perf_context_print (single-token
    decodes only; its own "decoded ... speed" line includes the prompt decode);
  * llama-bench tg128: avg_ts of the text-generation test (-p 0);
  * fastspec: GenerationStats.tokens_per_second = n_generated / t_generate.
llama.cpp and fastspec runs are interleaved per prompt and setting so that slow
drifts in machine load hit both sides alike.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import fastspec

# Code-writing prompts, wrapped in Qwen's ChatML template (no system turn).
QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome, ignoring case "
    "and non-alphanumeric characters.",
    "Write a Python function `fizzbuzz(n)` that returns a list of strings for the numbers "
    "1 to n following the FizzBuzz rules.",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods, raising "
    "IndexError when popping or peeking an empty stack.",
    "Write a Python function that reads a CSV file and returns the average of the values "
    "in a given column, skipping rows where the value is missing.",
]
PROMPTS = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in QUESTIONS]

# name -> (llama-speculative-simple extra flags or None, fastspec generate kwargs)
SETTINGS = [
    ("target", None, dict(speculative=False)),
    ("n4", ["--spec-draft-n-max", "4"], dict(n_draft=4)),
    ("n8", ["--spec-draft-n-max", "8"], dict(n_draft=8)),
    ("n16 p0.75", ["--spec-draft-n-max", "16", "--spec-draft-p-min", "0.75"], dict(n_draft=16, p_min=0.75)),
    # llama.cpp has no adaptive draft length: compare with its best known setting
    ("auto", "n16 p0.75", dict(n_draft="auto")),
]

RE_SPEC_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
RE_SPEC_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
RE_SPEC_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")
RE_PERF_EVAL = re.compile(r"^\S*\s+eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)", re.M)


class CompareError(Exception):
    pass


def run_tool(cmd: list[str], log_stem: Path, show: bool) -> tuple[str, str]:
    """Run a llama.cpp binary, keep its output, return (stdout, stderr)."""
    if show:
        print("   $ " + shlex.join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log_stem.with_suffix(".out").write_text(p.stdout)
    log_stem.with_suffix(".err").write_text(p.stderr)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.splitlines()[-15:])
        raise CompareError(f"{Path(cmd[0]).name} failed (rc {p.returncode}); log: {log_stem}.err\n{tail}")
    return p.stdout, p.stderr


def llama_bench(bin_dir: Path, model: str, threads: int, n: int, log_stem: Path, depth: int = 0,
                repetitions: int = 3, show: bool = True) -> dict:
    """llama-bench tg<n> after ``depth`` tokens already in the cache (-d): avg and stddev tok/s."""
    cmd = [str(bin_dir / "llama-bench"), "-m", model, "-t", str(threads), "-p", "0", "-n", str(n),
           "-d", str(depth), "-r", str(repetitions), "-o", "json"]
    stdout, _ = run_tool(cmd, log_stem, show)
    rows = json.loads(stdout)
    tg = [r for r in rows if r.get("n_gen") == n and r.get("n_prompt") == 0]
    if not tg:
        raise CompareError(f"llama-bench printed no tg{n} row; log: {log_stem}.out")
    return dict(tok_s=float(tg[0]["avg_ts"]), std=float(tg[0]["stddev_ts"]))


def spec_simple(bin_dir, target, draft, prompt, n, threads, n_ctx, flags, log_stem, show) -> dict:
    # --temp 0 is greedy; --top-k 1 only skips the default top-k 40 partial sort (same tokens).
    # --spec-type draft-simple is required at this commit: with no type, no speculator is
    # created and the tool exits with "failed to initialize speculative decoding".
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", target, "-md", draft, "-p", prompt,
           "-n", str(n), "--temp", "0", "--top-k", "1", "-t", str(threads), "-td", str(threads),
           "-c", str(n_ctx), "--spec-type", "draft-simple", *flags]
    stdout, out = run_tool(cmd, log_stem, show)
    # stdout is the prompt followed by the generated text
    i = stdout.find(prompt)
    text = stdout[i + len(prompt):] if i >= 0 else None
    m = RE_SPEC_DECODED.search(out)
    if not m:
        raise CompareError(f"no 'decoded N tokens in X seconds' line from llama-speculative-simple; see {log_stem}.err")
    drafted, accepted = RE_SPEC_DRAFTED.search(out), RE_SPEC_ACCEPT.search(out)
    nd = int(drafted.group(1)) if drafted else 0
    na = int(accepted.group(1)) if accepted else 0
    return dict(n=int(m.group(1)), secs=float(m.group(2)), tok_s=int(m.group(1)) / float(m.group(2)),
                accept=na / nd if nd else None, text=text)


def llama_simple(bin_dir, target, prompt, n, log_stem) -> dict:
    cmd = [str(bin_dir / "llama-simple"), "-m", target, "-n", str(n), prompt]
    _, out = run_tool(cmd, log_stem, True)
    m = RE_PERF_EVAL.search(out)
    if not m:
        raise CompareError(f"no 'eval time' perf line from llama-simple; see {log_stem}.err")
    ms, runs = float(m.group(1)), int(m.group(2))
    return dict(n=runs, secs=ms / 1e3, tok_s=runs / (ms / 1e3))


def median_run(fn, repeats):
    runs = [fn() for _ in range(repeats)]
    runs.sort(key=lambda r: r["tok_s"])
    out = dict(runs[len(runs) // 2])
    out["all_tok_s"] = [r["tok_s"] for r in runs]
    return out


def fs_generate(dec, prompt, n, kwargs) -> dict:
    if kwargs.get("speculative", True) and dec._draft_ctx is not None:
        # the settings take turns on one decoder: without this the draft would keep the whole
        # prompt from the setting before, a prefill no single request gets for free (fastspec
        # counts its draft's read of the prompt in the generation time; llama.cpp's
        # "decoded ... seconds" leaves its own out, so the ratios against it lean its way)
        dec._draft_ctx.clear()
    r = dec.generate(prompt, max_tokens=n, temperature=0.0, **kwargs)
    s = r.stats
    return dict(n=s.n_generated, secs=s.t_generate, tok_s=s.tokens_per_second,
                accept=s.acceptance_rate if s.n_drafted else None, tokens=list(r.tokens), text=r.text)


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def target_only(a) -> int:
    """fastspec's target alone against llama-bench tg<n>, interleaved: in each round, for
    every prompt, llama-bench decodes n tokens after as many cached tokens as the prompt has
    (-d) and fastspec generates up to n tokens after that prompt, one right after the other
    (the order alternating between rounds), so that the machine's drifts hit both alike.
    Reports the median of the per-pair ratios and the ratio of the medians."""
    n, th, rounds = a.n_predict, a.threads, max(a.repeats, 3)
    dec = fastspec.SpeculativeDecoder(a.target, None, n_ctx=a.n_ctx, n_threads=th)
    try:
        depths = [len(dec.tokenize(p)) for p in PROMPTS]
        print(f"\n{rounds} rounds x {len(PROMPTS)} prompts: llama-bench tg{n} -d <prompt tokens> "
              f"({a.bin_dir}) and fastspec target alone, {th} threads", flush=True)
        dec.generate(PROMPTS[0], max_tokens=16, speculative=False)      # warm-up
        pairs = []
        for k in range(rounds):
            for i, (p, d) in enumerate(zip(PROMPTS, depths)):
                lb_stem = a.results_dir / f"llama-bench-r{k}-p{i}"
                if (k + i) % 2:                       # the order alternates
                    fs = fs_generate(dec, p, n, dict(speculative=False))
                lb = llama_bench(a.bin_dir, a.target, th, n, lb_stem, depth=d, repetitions=1, show=False)
                if not (k + i) % 2:
                    fs = fs_generate(dec, p, n, dict(speculative=False))
                pairs.append(dict(round=k, prompt=i, depth=d, llama_bench=lb["tok_s"], fastspec=fs["tok_s"],
                                  n_fastspec=fs["n"], ratio=fs["tok_s"] / lb["tok_s"]))
                print(f"  round {k + 1} prompt {i + 1} (depth {d}): llama-bench {lb['tok_s']:.2f}, "
                      f"fastspec {fs['tok_s']:.2f} tok/s ({fs['n']} tokens): {fs['tok_s'] / lb['tok_s']:.3f}",
                      flush=True)
    finally:
        dec.close()
    ratio = statistics.median(x["ratio"] for x in pairs)
    med_lb = statistics.median(x["llama_bench"] for x in pairs)
    med_fs = statistics.median(x["fastspec"] for x in pairs)
    print(f"  median of {len(pairs)} paired ratios fastspec/llama-bench: {ratio:.3f} "
          f"(range {min(x['ratio'] for x in pairs):.3f}-{max(x['ratio'] for x in pairs):.3f}); "
          f"medians {med_fs:.2f} vs {med_lb:.2f} tok/s: {med_fs / med_lb:.3f}")
    report = dict(target=a.target, threads=th, n_predict=n, rounds=rounds, pairs=pairs, ratio=ratio,
                  ratio_of_medians=med_fs / med_lb, llama_cpp_commit=fastspec.LLAMA_CPP_COMMIT,
                  loadavg_end=os.getloadavg())
    (a.results_dir / "summary.json").write_text(json.dumps(report, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True, type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=1, help="runs per cell; the median tok/s is kept")
    ap.add_argument("--results-dir", type=Path, default=Path("bench/results/llama_cpp_compare"))
    ap.add_argument("--target-only", action="store_true",
                    help="only llama-bench tg<n> of the target against fastspec's target alone")
    a = ap.parse_args()
    a.results_dir.mkdir(parents=True, exist_ok=True)
    if a.target_only:
        return target_only(a)
    logs = a.results_dir
    n, th = a.n_predict, a.threads
    report: dict = dict(target=a.target, draft=a.draft, threads=th, n_predict=n, n_ctx=a.n_ctx,
                        repeats=a.repeats, fastspec_version=fastspec.__version__,
                        llama_cpp_commit=fastspec.LLAMA_CPP_COMMIT, prompts=PROMPTS)
    t0 = time.time()
    load0 = os.getloadavg()

    # 1. llama-bench tg{n}, target and draft alone
    print(f"\n[1/3] llama-bench tg{n} ({th} threads, 3 repetitions)", flush=True)
    bench = {role: llama_bench(a.bin_dir, m, th, n, logs / f"llama-bench-{role}")
             for role, m in (("target", a.target), ("draft", a.draft))}
    report["llama_bench"] = bench

    # 2. prompts x settings, interleaved
    print(f"\n[2/3] {len(PROMPTS)} prompts x {len(SETTINGS)} settings, greedy, {n} tokens, {th} threads", flush=True)
    dec = fastspec.SpeculativeDecoder(a.target, a.draft, n_ctx=a.n_ctx, n_threads=th, cost_cache=False)
    dft_only = fastspec.SpeculativeDecoder(a.draft, None, n_ctx=a.n_ctx, n_threads=th)
    # warm-up (first-call costs: page faults, thread pool, repacked weights)
    dec.generate(PROMPTS[0], max_tokens=16, n_draft=4)
    dec.generate(PROMPTS[0], max_tokens=16, speculative=False)
    dft_only.generate(PROMPTS[0], max_tokens=16, speculative=False)

    cells = []   # one per (prompt, setting)
    lc_cache: dict = {}
    draft_alone = []
    for pi, prompt in enumerate(PROMPTS):
        ref_tokens = None
        for name, lc_flags, fs_kwargs in SETTINGS:
            lc = None
            if isinstance(lc_flags, list):
                show = pi == 0
                lc = median_run(lambda: spec_simple(a.bin_dir, a.target, a.draft, prompt, n, th, a.n_ctx,
                                                   lc_flags, logs / f"spec-p{pi + 1}-{name.replace(' ', '_').replace('.', '')}",
                                                   show), a.repeats)
                lc_cache[(pi, name)] = lc
            elif isinstance(lc_flags, str):
                lc = lc_cache[(pi, lc_flags)]
            fs = median_run(lambda: fs_generate(dec, prompt, n, fs_kwargs), a.repeats)
            if name == "target":
                ref_tokens, ref_text = fs["tokens"], fs["text"]
                same = None
            else:
                same = fs["tokens"] == ref_tokens
            lc_same = None
            if lc and lc["text"] is not None:
                # llama-speculative-simple may run a few tokens past -n: compare the common prefix
                x, y = lc["text"].rstrip(), ref_text.rstrip()
                k = min(len(x), len(y))
                lc_same = x[:k] == y[:k]
            cell = dict(prompt=pi + 1, setting=name, llama_cpp=lc, fastspec=fs, same_as_target=same,
                        llama_cpp_text_matches_fs_target=lc_same)
            cells.append(cell)
            lc_s = fmt(lc["tok_s"]) if lc else "-"
            print(f"   p{pi + 1} {name:<10} llama.cpp {lc_s:>6} tok/s   fastspec {fs['tok_s']:6.2f} tok/s"
                  f"   ({fs['n']} tokens)", flush=True)
        draft_alone.append(fs_generate(dft_only, prompt, n, dict(speculative=False)))
    for c in cells:
        c["fastspec"].pop("tokens", None)
        c["fastspec"].pop("text", None)
    for d in draft_alone:
        d.pop("tokens", None)
        d.pop("text", None)
    report["cells"] = cells
    report["fastspec_draft_alone"] = draft_alone

    # 3. llama-simple (target alone) on the first prompt
    print(f"\n[3/3] llama-simple, prompt 1 (note: llama-simple has no thread option: it uses "
          f"llama.cpp's default of 4 threads)", flush=True)
    simple = median_run(lambda: llama_simple(a.bin_dir, a.target, PROMPTS[0], n, logs / "simple-p1"), a.repeats)
    report["llama_simple_p1"] = simple
    dec.close()
    dft_only.close()

    # --- tables ---------------------------------------------------------------------
    print("\n" + "=" * 86)
    print(f"Generation-only tok/s, greedy, {n} tokens, {th} threads, n_ctx {a.n_ctx}; "
          f"median of {a.repeats} run(s) per cell")
    print("llama.cpp = llama-speculative-simple ('decoded ... seconds' line); "
          "fastspec = stats.tokens_per_second")
    print("lc/fs n: tokens generated (llama-speculative-simple can overshoot -n by part of a draft)")
    print("'auto' is compared with llama.cpp's n16 p0.75 (no adaptive mode in llama.cpp)")
    hdr = f"{'prompt':<7}{'setting':<11}{'llama.cpp':>10}{'fastspec':>10}{'ratio':>8}{'lc acc%':>9}{'fs acc%':>9}{'lc/fs n':>9}  {'fs==fs tgt':<11}{'lc==fs tgt':<10}"
    print("-" * len(hdr))
    print(hdr)
    print("-" * len(hdr))
    for c in cells:
        lc, fs = c["llama_cpp"], c["fastspec"]
        ratio = fs["tok_s"] / lc["tok_s"] if lc else None
        c["ratio"] = ratio
        yn = lambda v: "-" if v is None else ("yes" if v else "NO")
        same, lc_same = yn(c["same_as_target"]), yn(c["llama_cpp_text_matches_fs_target"])
        ns = f"{lc['n'] if lc else '-'}/{fs['n']}"
        print(f"p{c['prompt']:<6}{c['setting']:<11}{fmt(lc and lc['tok_s']):>10}{fs['tok_s']:>10.2f}"
              f"{fmt(ratio, '{:.3f}'):>8}{fmt(lc and lc['accept'] and 100 * lc['accept'], '{:.1f}'):>9}"
              f"{fmt(fs['accept'] and 100 * fs['accept'], '{:.1f}'):>9}{ns:>9}  {same:<11}{lc_same:<10}")
    print("-" * len(hdr))
    print("means over prompts:")
    hdr2 = f"{'setting':<11}{'llama.cpp':>10}{'fastspec':>10}{'ratio of means':>16}{'geomean ratio':>15}{'fs speed-up vs fs target':>26}"
    print(hdr2)
    fs_target_mean = statistics.mean(c["fastspec"]["tok_s"] for c in cells if c["setting"] == "target")
    summary = {}
    for name, _, _ in SETTINGS:
        cs = [c for c in cells if c["setting"] == name]
        fs_m = statistics.mean(c["fastspec"]["tok_s"] for c in cs)
        lc_vals = [c["llama_cpp"]["tok_s"] for c in cs if c["llama_cpp"]]
        lc_m = statistics.mean(lc_vals) if lc_vals else None
        gm = geomean([c["ratio"] for c in cs]) if lc_vals else None
        summary[name] = dict(llama_cpp=lc_m, fastspec=fs_m, ratio_of_means=fs_m / lc_m if lc_m else None,
                             geomean_ratio=gm, all_same_as_target=all(c["same_as_target"] for c in cs)
                             if name != "target" else None)
        print(f"{name:<11}{fmt(lc_m):>10}{fs_m:>10.2f}{fmt(lc_m and fs_m / lc_m, '{:.3f}'):>16}"
              f"{fmt(gm, '{:.3f}'):>15}{fs_m / fs_target_mean:>26.3f}")
    report["summary"] = summary
    n_same = sum(1 for c in cells if c["same_as_target"])
    n_spec = sum(1 for c in cells if c["same_as_target"] is not None)
    print(f"fastspec speculative output == fastspec target-alone output (greedy): {n_same}/{n_spec} cells")
    lcs = [c["llama_cpp_text_matches_fs_target"] for c in cells if c["llama_cpp_text_matches_fs_target"] is not None]
    print(f"llama.cpp speculative text == fastspec target-alone text (common prefix): {sum(lcs)}/{len(lcs)} cells")

    print("\ntarget / draft alone:")
    fs_dft_mean = statistics.mean(d["tok_s"] for d in draft_alone)
    p1_target = next(c["fastspec"]["tok_s"] for c in cells if c["prompt"] == 1 and c["setting"] == "target")
    rows = [
        ("target", f"llama-bench tg{n}", bench["target"]["tok_s"], f"fastspec target alone, mean of {len(PROMPTS)} prompts", fs_target_mean),
        ("draft", f"llama-bench tg{n}", bench["draft"]["tok_s"], f"fastspec draft alone, mean of {len(PROMPTS)} prompts", fs_dft_mean),
        ("target", "llama-simple p1 (4 thr)", simple["tok_s"], "fastspec target alone, p1", p1_target),
    ]
    for model, lc_name, lc_v, fs_name, fs_v in rows:
        print(f"  {model:<7}{lc_name:<24}{lc_v:>8.2f} tok/s | {fs_name:<44}{fs_v:>8.2f} tok/s | ratio {fs_v / lc_v:.3f}")
    print(f"  (llama-bench stddev: target {bench['target']['std']:.2f}, draft {bench['draft']['std']:.2f} tok/s)")
    load1 = os.getloadavg()
    report["loadavg_start_end"] = [load0, load1]
    print(f"\nwall time of the comparison: {time.time() - t0:.0f} s; load average (1/5/15 min) at start "
          f"{'/'.join(f'{x:.2f}' for x in load0)}, at end {'/'.join(f'{x:.2f}' for x in load1)} "
          f"on {os.cpu_count()} CPUs (other processes make timings noisy)")
    print(f"raw logs and JSON: {logs}")
    (logs / "summary.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
