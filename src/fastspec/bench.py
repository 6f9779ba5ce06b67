"""Benchmark speculative decoding against the target model alone.

Usage::

    python -m fastspec.bench                          # default pair, built-in prompts, all modes
    python -m fastspec.bench --limit 1 --max-tokens 64 --modes target,draft
    python -m fastspec.bench --target T.gguf --draft D.gguf --prompts spec_bench.jsonl --runs 3
    python -m fastspec.bench --show                   # colour one output by where its tokens came from
    python -m fastspec.bench sweep --targets A,B --drafts X,Y --n-draft 2,4,auto   # see fastspec.sweep

Modes: ``target`` (the target alone, the baseline), ``draft`` (draft-model proposals),
``lookup`` (n-gram prompt lookup, no draft model), ``combined`` (both).  Each prompt is
formatted with the target's chat template and generated greedily in every mode; every
speculative output is compared token by token with the target-alone output.  Reported
per category and overall: tok/s (median, min-max over runs), acceptance, tokens per
target pass, speed-up over the target alone (geometric mean of per-prompt ratios), the
Leviathan bound, and efficiency = speed-up / bound.  All raw measurements go to a JSON
file (``--out``), kept also when the run fails or is interrupted.

Prompt files are JSON lines, ``{"prompt": ..., "category": ..., "id": ...}`` (category
and id optional) or Spec-Bench's ``{"question_id": ..., "category": ..., "turns": [...]}``
(first turn used).
"""
from __future__ import annotations

import argparse
import codecs
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

import fastspec
from fastspec import _core, models

MODES = ("target", "draft", "lookup", "combined")
MODE_KWARGS = {"target": dict(speculative=False), "draft": dict(lookup=False),
               "lookup": dict(lookup=True), "combined": dict(lookup=True)}
SOURCE_STYLES = {"draft": "bold green", "lookup": "bold magenta", "target": ""}
SCHEMA = "fastspec-bench/1"
TABLE_STYLE = dict(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)


class BenchError(Exception):
    """Bad input: reported as one line on stderr, with exit code ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Prompt:
    id: str
    category: str
    text: str


# -- prompts -----------------------------------------------------------------
def parse_prompt_line(line: str, lineno: int, source: str) -> Prompt:
    """One JSON line (plain or Spec-Bench format) -> Prompt; BenchError naming the line."""
    where = f"{source}, line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BenchError(f"{where}: not valid JSON ({e.msg})", 2) from None
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object", 2)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0]:
            raise BenchError(f"{where}: 'turns' must be a non-empty list of strings", 2)
        text = turns[0]
    elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
        text = obj["prompt"]
    else:
        raise BenchError(f"{where}: needs a non-empty string 'prompt' or a list 'turns'", 2)
    category = str(obj.get("category") or "uncategorised")
    pid = obj.get("id", obj.get("question_id"))
    return Prompt(str(pid) if pid is not None else f"{category}-{lineno}", category, text)


def load_prompts(path: str | None) -> list[Prompt]:
    try:
        if path is None:
            source = "bench_prompts.jsonl"
            content = resources.files("fastspec").joinpath(source).read_text(encoding="utf-8")
        else:
            source = path
            content = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read prompts file {path}: {getattr(e, 'strerror', None) or e}", 2) from None
    prompts = [parse_prompt_line(line, n, source)
               for n, line in enumerate(content.splitlines(), 1) if line.strip()]
    if not prompts:
        raise BenchError(f"no prompts in {source}", 2)
    return prompts


def select_prompts(prompts: list[Prompt], categories: list[str] | None, limit: int | None) -> list[Prompt]:
    if categories:
        unknown = set(categories) - {p.category for p in prompts}
        if unknown:
            known = ", ".join(sorted({p.category for p in prompts}))
            raise BenchError(f"unknown categories: {', '.join(sorted(unknown))} (available: {known})", 2)
        prompts = [p for p in prompts if p.category in categories]
    if limit is not None:
        kept, seen = [], {}
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= limit:
                kept.append(p)
        prompts = kept
    return prompts


# -- output file -------------------------------------------------------------
def check_writable(path: Path) -> None:
    """Fail now, not after an hour of measuring, if the results cannot be written."""
    if path.is_dir() or not path.parent.is_dir():
        raise BenchError(f"cannot write the output file {path}: " + (
            "it is a directory" if path.is_dir() else f"no directory {path.parent}"))
    probe = path.with_name(path.name + ".partial")
    try:
        probe.touch()
        probe.unlink()
        if path.exists():
            open(path, "a").close()
    except OSError as e:
        raise BenchError(f"cannot write the output file {path}: {e.strerror or e}") from None


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def environment(decoders: dict) -> dict:
    info = dict(fastspec_version=fastspec.__version__, llama_cpp_commit=fastspec.LLAMA_CPP_COMMIT,
                system_info=_core.system_info(), platform=platform.platform(), machine=platform.machine(),
                cpu=cpu_name(), cpu_count=os.cpu_count(), python=platform.python_version(),
                load_average_at_start=load_average())
    dec = next(iter(decoders.values()), None)
    if dec is not None:
        info["n_threads"] = dec._target_ctx.n_threads
        if dec.batch_invariant:
            info["max_verify_batch"] = dec.max_verify_batch
    for role in ("target", "draft"):
        for m in filter(None, (getattr(d, f"{role}_model") for d in decoders.values())):
            info[role] = dict(path=m.path, description=m.description, n_params=m.n_params,
                              size_bytes=m.size_bytes)
    return info


# -- models ------------------------------------------------------------------
def open_decoders(args, modes) -> dict:
    """mode -> decoder.  target/draft/combined share one decoder; lookup alone needs one
    without a draft model (a second load of the target)."""
    try:
        target = str(models.resolve(args.target))
        need_draft = any(m in ("draft", "combined") for m in modes)
        draft = str(models.resolve(args.draft)) if need_draft else None
        kw = decoder_kwargs(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main_dec = fastspec.SpeculativeDecoder(target, draft, **kw)
            decs = {m: main_dec for m in modes if m != "lookup"}
            if "lookup" in modes:
                decs["lookup"] = main_dec if draft is None else fastspec.SpeculativeDecoder(target, None, **kw)
    except (OSError, ValueError, RuntimeError, models.ModelFetchError) as e:
        raise BenchError(f"cannot load models: {e}") from None
    return decs


def decoder_kwargs(args) -> dict:
    """SpeculativeDecoder keyword arguments from the command line (shared with the sweep)."""
    return dict(n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                batch_invariant=args.batch_invariant)


def close_decoders(decoders: dict) -> None:
    for dec in set(decoders.values()):
        dec.close()


def format_prompt(dec, text: str, use_template: bool) -> tuple[str, bool]:
    """(prompt, add_special): the chat-formatted prompt, or the raw text if asked or if the
    target has no chat template."""
    if use_template and dec.target_model.chat_template() is not None:
        return dec.target_model.apply_chat_template([{"role": "user", "content": text}]), False
    return text, True


def gen_kwargs(args, mode: str, run: int, max_tokens: int | None = None) -> dict:
    return dict(max_tokens=max_tokens or args.max_tokens, temperature=args.temperature, seed=1234 + run,
                n_draft=args.n_draft, p_min=getattr(args, "p_min", 0.0), **MODE_KWARGS[mode])


# -- measuring ---------------------------------------------------------------
def measure(dec, prompt: Prompt, formatted: tuple[str, bool], mode: str, run: int, args,
            max_tokens: int | None = None) -> dict:
    text, add_special = formatted
    t0 = time.perf_counter()
    r = dec.generate(text, add_special=add_special, **gen_kwargs(args, mode, run, max_tokens))
    wall = time.perf_counter() - t0
    return dict(prompt_id=prompt.id, category=prompt.category, mode=mode, run=run, time=now(),
                tokens_per_second=r.stats.tokens_per_second, wall_seconds=wall, n_tokens=len(r.tokens),
                finish_reason=r.finish_reason, text=r.text, tokens=r.tokens, stats=r.stats.to_dict(),
                identical_to_target=None, first_difference=None)


def compare_outputs(baseline: list[int], other: list[int]) -> int | None:
    """Index of the first token where ``other`` differs from ``baseline``; None if identical."""
    for i, (a, b) in enumerate(zip(baseline, other)):
        if a != b:
            return i
    return None if len(baseline) == len(other) else min(len(baseline), len(other))


def check_equality(records: list[dict]) -> None:
    """Mark every speculative record against the target-alone record of its prompt and run."""
    base = {(r["prompt_id"], r["run"]): r["tokens"] for r in records if r["mode"] == "target"}
    for r in records:
        ref = base.get((r["prompt_id"], r["run"]))
        if r["mode"] != "target" and ref is not None:
            r["first_difference"] = compare_outputs(ref, r["tokens"])
            r["identical_to_target"] = r["first_difference"] is None


def run_bench(decoders, prompts, modes, args, records, on_prompt) -> None:
    formatted = {p.id: format_prompt(decoders[modes[0]], p.text, args.chat_template) for p in prompts}
    total = len(modes) * (1 + args.runs * len(prompts))
    with Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), disable=args.quiet, transient=True) as bar:
        task = bar.add_task("warm-up", total=total)
        for mode in modes:  # warm-up: load weights into caches, let threads spin up
            bar.update(task, description=f"warm-up {mode}")
            first = prompts[0]
            measure(decoders[mode], first, formatted[first.id], mode, 0, args, min(16, args.max_tokens))
            bar.advance(task)
        for run in range(args.runs):
            for p in prompts:
                for mode in modes:
                    bar.update(task, description=f"run {run + 1}/{args.runs} {p.id} {mode}")
                    records.append(measure(decoders[mode], p, formatted[p.id], mode, run, args))
                    bar.advance(task)
                if args.temperature == 0:
                    check_equality(records)
                on_prompt()


# -- summary -----------------------------------------------------------------
def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def median_by_prompt(recs: list[dict]) -> dict:
    """prompt id -> median tokens/s over runs."""
    return {pid: statistics.median(r["tokens_per_second"] for r in recs if r["prompt_id"] == pid)
            for pid in {r["prompt_id"] for r in recs}}


def record_bound(r: dict) -> float | None:
    """The Leviathan bound of one measurement; for lookup alone (no draft model, so no
    measured cost ratio) with c = 0, as proposing from the n-gram index costs ~nothing."""
    s = r["stats"]
    if s["theoretical_speedup"] is None and r["mode"] == "lookup" and s["n_drafted"]:
        return fastspec.leviathan_speedup(s["alpha"], s["n_drafted"] / s["n_target_passes"], 0.0)
    return s["theoretical_speedup"]


def mode_metrics(recs: list[dict], base: list[dict]) -> dict:
    runs = sorted({r["run"] for r in recs})
    per_run = [sum(r["stats"]["n_generated"] for r in recs if r["run"] == k)
               / max(1e-9, sum(r["stats"]["t_generate"] for r in recs if r["run"] == k)) for k in runs]
    mine, ref = median_by_prompt(recs), median_by_prompt(base)
    speedup = geomean([mine[p] / ref[p] for p in mine if ref.get(p)]) if base else None
    bound = geomean([record_bound(r) for r in recs])
    drafted = sum(r["stats"]["n_drafted"] for r in recs)
    passes = sum(r["stats"]["n_target_passes"] for r in recs)
    compared = [r for r in recs if r["identical_to_target"] is not None]
    return dict(tokens_per_second=statistics.median(per_run) if per_run else None,
                tokens_per_second_min=min(per_run, default=None),
                tokens_per_second_max=max(per_run, default=None),
                speedup=speedup, theoretical_speedup=bound,
                efficiency=speedup / bound if speedup and bound else None,
                acceptance_rate=sum(r["stats"]["n_accepted"] for r in recs) / drafted if drafted else None,
                mean_accepted_length=sum(r["stats"]["n_generated"] for r in recs) / passes if passes else None,
                n_identical=sum(r["identical_to_target"] for r in compared), n_compared=len(compared))


def summarise(records: list[dict], modes) -> dict:
    def group(rs):
        base = [r for r in rs if r["mode"] == "target"]
        return {m: mode_metrics([r for r in rs if r["mode"] == m], base) for m in modes
                if any(r["mode"] == m for r in rs)}
    cats = sorted({r["category"] for r in records})
    mism = [dict(prompt_id=r["prompt_id"], mode=r["mode"], run=r["run"], first_difference=r["first_difference"])
            for r in records if r["identical_to_target"] is False]
    return dict(overall=group(records), by_category={c: group([r for r in records if r["category"] == c])
                                                     for c in cats}, mismatches=mism)


# -- report ------------------------------------------------------------------
def fmt(x, spec=".2f", suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


def rate(x) -> str:
    return fmt(x, ".0f" if x is not None and x >= 100 else ".1f")


def overall_table(summary: dict, title: str) -> Table:
    t = Table(title=title, **TABLE_STYLE)
    for col in ("mode", "tok/s", "min–max", "speed-up", "bound", "effic.", "accept", "tok/pass", "same"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, m in summary["overall"].items():
        same = "–" if not m["n_compared"] else f"{m['n_identical']}/{m['n_compared']}"
        t.add_row(mode, rate(m["tokens_per_second"]),
                  f"{rate(m['tokens_per_second_min'])}–{rate(m['tokens_per_second_max'])}",
                  fmt(m["speedup"], ".2f", "x"),
                  fmt(m["theoretical_speedup"], ".2f", "x"), fmt(m["efficiency"], ".0%"),
                  fmt(m["acceptance_rate"], ".0%"), fmt(m["mean_accepted_length"]),
                  same if m["n_identical"] == m["n_compared"] else f"[bold red]{same}[/]")
    return t


def category_table(summary: dict, modes) -> Table:
    t = Table(title="By category", **TABLE_STYLE)
    t.add_column("category")
    for mode in modes:
        t.add_column("target tok/s" if mode == "target" else f"{mode} speed-up (accept)", justify="right")
    for cat, group in summary["by_category"].items():
        cells = []
        for mode in modes:
            m = group.get(mode)
            if m is None:
                cells.append("–")
            elif mode == "target":
                cells.append(rate(m["tokens_per_second"]))
            else:
                red = m["n_identical"] != m["n_compared"]
                cell = f"{fmt(m['speedup'], '.2f', 'x')} ({fmt(m['acceptance_rate'], '.0%')})"
                cells.append(f"[bold red]{cell} ≠[/]" if red else cell)
        t.add_row(Text(cat), *cells)
    return t


def mismatch_table(summary: dict) -> Table:
    t = Table(title="[bold red]Outputs that differ from the target alone[/]", **TABLE_STYLE)
    for col in ("prompt", "mode", "run", "first differing token"):
        t.add_column(col)
    for m in summary["mismatches"]:
        t.add_row(Text(m["prompt_id"]), m["mode"], str(m["run"] + 1), str(m["first_difference"]), style="red")
    return t


def verdict(summary: dict, args) -> tuple[str, bool]:
    """One line, and whether it is good news (no mismatches)."""
    over = summary["overall"]
    spec = [m for m in ("draft", "combined", "lookup") if m in over]  # headline first
    if not spec:
        return "only the target alone was measured: nothing to compare", True
    if "target" not in over:
        return "no target-alone baseline (add 'target' to --modes): speed-up and equality not measured", True
    draft_name = Path(args.draft).stem if os.sep in str(args.draft) else args.draft
    label = {"draft": f"draft {draft_name} with n_draft={args.n_draft}", "lookup": "n-gram lookup",
             "combined": f"draft {draft_name} + lookup with n_draft={args.n_draft}"}
    head, m = spec[0], over[spec[0]]
    s = m["speedup"] or 0.0
    line = (f"{label[head]}: " + (f"{s:.2f}x faster than target alone" if s >= 1 else
                                  f"slower than target alone, {s:.2f}x")
            + f" (bound {fmt(m['theoretical_speedup'], '.2f', 'x')}, "
              f"acceptance {fmt(m['acceptance_rate'], '.0%')})")
    line += "".join(f"; {k} {fmt(over[k]['speedup'], '.2f', 'x')}" for k in MODES if k in spec[1:])
    if args.temperature > 0:
        return line + f"; outputs not compared (temperature {args.temperature} > 0)", True
    n_same = sum(over[k]["n_identical"] for k in spec)
    n_all = sum(over[k]["n_compared"] for k in spec)
    line += f"; {n_same}/{n_all} outputs identical to target alone"
    return line, n_same == n_all


def print_report(console: Console, summary: dict, modes, args, n_prompts: int) -> None:
    if not args.quiet:
        console.print(overall_table(summary, f"Overall: {n_prompts} prompts × {args.runs} run(s), "
                                             f"max {args.max_tokens} tokens"))
        console.print(category_table(summary, modes))
        if summary["mismatches"]:
            console.print(mismatch_table(summary))
            console.print("[dim]Mismatches can come from numerical near-ties (batched vs single-token "
                          "kernels); --batch-invariant (SpeculativeDecoder(batch_invariant=True)) "
                          "rules that out.[/]")
    if args.temperature > 0 and not args.quiet:
        console.print(f"[yellow]temperature {args.temperature} > 0: greedy equality check skipped[/]")
    line, ok = verdict(summary, args)
    console.print(Text(line, style="bold green" if ok else "bold red"))


# -- --show --------------------------------------------------------------------
def show(args, prompts: list[Prompt], console: Console) -> None:
    mode = next((m for m in args.modes or ["combined"] if m != "target"), "combined")
    decs = open_decoders(args, [mode])
    try:
        dec = decs[mode]
        text, add_special = format_prompt(dec, prompts[0].text, args.chat_template)
        r = dec.generate(text, add_special=add_special, **gen_kwargs(args, mode, 0))
        out, utf8 = Text(), codecs.getincrementaldecoder("utf-8")(errors="replace")
        for tok, src in zip(r.tokens, r.sources):
            out.append(utf8.decode(dec.target_model.token_to_piece(tok)), style=SOURCE_STYLES[src])
        out.append(utf8.decode(b"", final=True))
    finally:
        close_decoders(decs)
    s = r.stats
    console.print(Text.assemble((prompts[0].id, "bold"), f" ({mode}): {prompts[0].text[:300]}"))
    console.print(out)
    console.print(Text.assemble("legend: ", ("accepted draft token", SOURCE_STYLES["draft"]), "  ",
                                ("accepted lookup token", SOURCE_STYLES["lookup"]), "  target token"))
    by_source = ", ".join(f"{k} {v}" for k, v in s.emitted_by_source.items())
    console.print(f"acceptance rate {s.acceptance_rate:.0%} ({s.n_accepted}/{s.n_drafted} proposals), "
                  f"{s.mean_accepted_length:.2f} tokens per target pass; tokens from {by_source}")


# -- command line --------------------------------------------------------------
def n_draft_arg(text: str):
    if text == "auto" or (text.isdigit() and 1 <= int(text) <= 32):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"must be 'auto' or an integer from 1 to 32, got {text!r}")


def list_arg(choices=None):
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items or any(choices and x not in choices for x in items):
            raise argparse.ArgumentTypeError("expected a comma-separated list"
                                             + (f" of {', '.join(choices)}" if choices else ""))
        return items
    return parse


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by the bench and ``bench sweep``: prompts, limits, decoder settings."""
    p.add_argument("--prompts", help="JSONL prompt file (default: the built-in set)")
    p.add_argument("--categories", type=list_arg(), help="only these categories (comma-separated)")
    p.add_argument("--limit", type=positive, help="at most N prompts per category")
    p.add_argument("--max-tokens", type=positive, default=128)
    p.add_argument("--threads", type=positive, default=None)
    p.add_argument("--n-gpu-layers", type=int, default=-1)
    p.add_argument("--ctx", type=positive, default=4096, help="context size")
    p.add_argument("--runs", type=positive, default=1, help="repeat every measurement N times")
    p.add_argument("--batch-invariant", action="store_true",
                   help="SpeculativeDecoder(batch_invariant=True): verify at most max_verify_batch tokens "
                        "at once, so greedy output is bit-identical to the target alone (slower)")
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="feed the prompt text as is")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastspec.bench", description=__doc__.split("\n\n")[0],
                                epilog="python -m fastspec.bench sweep --help: targets x drafts x settings")
    p.add_argument("--target", default=models.DEFAULT_PAIR[0], help="target model name or GGUF path")
    p.add_argument("--draft", default=models.DEFAULT_PAIR[1], help="draft model name or GGUF path")
    add_common_arguments(p)
    p.add_argument("--temperature", type=float, default=0.0, help="> 0 skips the greedy equality check")
    p.add_argument("--modes", type=list_arg(MODES), help="subset of " + ",".join(MODES) + " (default: all; "
                   "--show: the first speculative one, else combined)")
    p.add_argument("--n-draft", type=n_draft_arg, default="auto", help="tokens drafted per pass, or 'auto'")
    p.add_argument("--out", help="results JSON (default: bench-results-<timestamp>.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or tables, only the verdict")
    p.add_argument("--show", action="store_true", help="generate once and colour tokens by source")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:
        from fastspec import sweep
        return sweep.main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    modes = [m for m in MODES if m in (args.modes or MODES)]  # canonical order, target first
    err, console = Console(stderr=True, soft_wrap=True, highlight=False), Console()
    out = Path(args.out or time.strftime("bench-results-%Y%m%d-%H%M%S.json")).expanduser()
    records: list[dict] = []
    report = dict(schema=SCHEMA, status="starting", started_at=now(), finished_at=None,
                  settings={k: v for k, v in vars(args).items() if k not in ("show", "quiet")},
                  environment={}, prompts=[], measurements=records, summary=None)
    report["settings"]["modes"] = modes
    decoders: dict = {}
    try:
        prompts = select_prompts(load_prompts(args.prompts), args.categories, args.limit)
        if not prompts:
            raise BenchError("no prompts left after --categories/--limit", 2)
        if args.show:
            show(args, prompts, console)
            return 0
        check_writable(out)
    except BenchError as e:
        err.print(f"fastspec.bench: error: {e}", markup=False, highlight=False)
        return e.code
    except KeyboardInterrupt:
        return 130
    report["prompts"] = [asdict(p) for p in prompts]

    def save():
        report["finished_at"], report["load_average_at_end"] = now(), load_average()
        if args.temperature == 0:
            check_equality(records)
        report["summary"] = summarise(records, modes) if records else None
        write_json(out, report)

    try:
        decoders = open_decoders(args, modes)
        report["settings"]["chat_template"] = not format_prompt(decoders[modes[0]], "x", args.chat_template)[1]
        report["environment"] = environment(decoders)
        busy = report["environment"]["load_average_at_start"]
        if busy and busy[0] > 0.5 * (os.cpu_count() or 1):
            err.print(f"fastspec.bench: note: system load {busy[0]:.1f} on {os.cpu_count()} CPUs; "
                      "other work will distort the timings")
        if report["environment"].get("max_verify_batch", 2) <= 1:
            err.print("fastspec.bench: note: --batch-invariant: no verification batch larger than 1 token is "
                      "bit-identical on this build, so every mode runs the target alone")
        report["status"] = "running"
        run_bench(decoders, prompts, modes, args, records, save)
        report["status"] = "complete"
    except BenchError as e:
        err.print(f"fastspec.bench: error: {e}", markup=False, highlight=False)
        return e.code
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        err.print(f"fastspec.bench: interrupted; partial results in {out}", markup=False)
        return 130
    except BaseException as e:
        report["status"] = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        close_decoders(decoders)
        if report["status"] != "starting":  # nothing measured yet: leave no file
            save()
    print_report(console, report["summary"], modes, args, len(prompts))
    if not args.quiet:
        console.print(Text(f"results: {out}", style="dim"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
