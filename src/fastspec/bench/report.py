"""Summaries of the measurements (per mode, per category) and the terminal report."""
from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

import fastspec
from fastspec.config import GenerationConfig
from fastspec.bench.runner import MODES, NOISY_BRACKET_PCT, cell_pace, pooled_rate, set_cells

SOURCE_STYLES = {"draft": "bold green", "lookup": "bold magenta", "prediction": "bold cyan", "suffix": "bold yellow",
                 "target": ""}


TABLE_STYLE = dict(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)



# -- summary -----------------------------------------------------------------
def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def prompt_speedups(recs: list[dict], base: list[dict], paced: bool = False) -> dict:
    """prompt id -> median, over its runs and sets, of each cell's tok/s over the mean of the
    target-alone times measured beside it (the same prompt, run and set: with the bracket the
    times before and after it).  A cell compares with what the machine did while it ran, not
    with another set's times, which a moved pace put elsewhere; a cell with no such times
    (none were taken in its set) compares with all of its prompt's.  A cell measured in
    rounds (a short answer's) is its rounds pooled, tokens over seconds, and so is each
    target-alone time.  Where a prompt was measured again, the sets the bench found noisy
    (records marked ``noisy``: the pace moved while they ran, whatever the modes did) are
    left out if a calm one is there.

    ``paced``: each cell's ratio also times its pace over its set's target alone's
    (``pace_factor``): what the cell would have read had the machine kept the target alone's
    pace while it ran (the bench's second read, beside the plain one)."""
    times: dict = {}
    paces: dict = {}
    for key, cells in set_cells(base).items():
        for rs in cells.values():
            rate = pooled_rate(rs)
            if rate:
                times.setdefault(key, []).append(rate)
                times.setdefault(key[0], []).append(rate)
                paces.setdefault(key, []).append(rs)
    ratios: dict = {}
    for key, cells in set_cells(recs).items():
        ref = times.get(key) or times.get(key[0])
        for rs in cells.values():
            rate = pooled_rate(rs)
            if ref and rate:
                f = pace_factor(cell_pace(rs), paces.get(key) or []) if paced else 1.0
                ratios.setdefault(key[0], []).append((f * rate / statistics.mean(ref),
                                                      any(r.get("noisy") for r in rs)))
    out = {}
    for pid, xs in ratios.items():
        calm = [x for x, noisy in xs if not noisy]
        out[pid] = statistics.median(calm or [x for x, _ in xs])
    return out


def pace_factor(pace: tuple | None, ref: list) -> float:
    """How much slower than the target alone's (the mean over its set's target-alone cells
    ``ref``, each a list of records) a cell's one-token target passes ran (its ``pace``, a
    ``runner.cell_pace``): >1 where the machine was slower while the cell ran.  Passes
    compare with passes and probes with probes; 1.0 where the two cannot be compared."""
    if not pace:
        return 1.0
    ref = [t for t in (cell_pace(rs, pace[0]) for rs in ref) if t]
    return pace[1] / statistics.mean(t[1] for t in ref) if ref else 1.0


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
    speedup = geomean(list(prompt_speedups(recs, base).values())) if base else None
    paced = geomean(list(prompt_speedups(recs, base, paced=True).values())) if base else None
    bound = geomean([record_bound(r) for r in recs])
    drafted = sum(r["stats"]["n_drafted"] for r in recs)
    passes = sum(r["stats"]["n_target_passes"] for r in recs)
    compared = [r for r in recs if r["identical_to_target"] is not None]
    emitted: dict[str, int] = {}
    for r in recs:
        for src, n in (r["stats"].get("emitted_by_source") or {}).items():
            emitted[src] = emitted.get(src, 0) + n
    n_emitted = sum(emitted.values())
    return dict(emitted_share={k: v / n_emitted for k, v in emitted.items() if v} if n_emitted else {},
                tokens_per_second=statistics.median(per_run) if per_run else None,
                tokens_per_second_min=min(per_run, default=None),
                tokens_per_second_max=max(per_run, default=None),
                speedup=speedup, speedup_paced=paced, theoretical_speedup=bound,
                efficiency=speedup / bound if speedup and bound else None,
                acceptance_rate=sum(r["stats"]["n_accepted"] for r in recs) / drafted if drafted else None,
                mean_accepted_length=sum(r["stats"]["n_generated"] for r in recs) / passes if passes else None,
                n_identical=sum(r["identical_to_target"] for r in compared), n_compared=len(compared))


def repeat_ratios(records: list[dict]) -> list[tuple[str, str, float]]:
    """(prompt id, category, tok/s of the target alone timed again after the other modes /
    tok/s of its first time) for each prompt and run that has both (and again for a prompt
    measured again: its own two times; a short answer's measured in rounds: each pooled)."""
    out = []
    for (pid, _, _), cells in set_cells([r for r in records if r["mode"] == "target"]).items():
        first = [rs for key, rs in cells.items() if not key[2]]
        again = [rs for key, rs in cells.items() if key[2]]
        if first and again:
            a, b = pooled_rate(first[0]), pooled_rate(again[0])
            if a and b:
                out.append((pid, first[0][0]["category"], b / a))
    return out


def repeat_spread(ratios: list[tuple[str, str, float]]) -> dict | None:
    """How far the target alone's second time moved from its first: what one cell moves by
    the machine alone (median, min and max of the ratios, and the prompt of the farthest)."""
    if not ratios:
        return None
    xs = [x for _, _, x in ratios]
    far = max(ratios, key=lambda t: abs(math.log(t[2])))
    return dict(n=len(xs), median=statistics.median(xs), min=min(xs), max=max(xs),
                farthest_prompt=far[0], farthest=far[2])


# A cell whose target passes ran this much slower than the run's median ran in a slow spell
# (in the runs looked at, a neighbour's load): its speed-up measures that as much as the mode.
SLOW_CELL = 1.25


def slow_cells(records: list[dict]) -> dict | None:
    """The cells whose one-token target passes (the cost model's t1 at the cell's end) took
    SLOW_CELL times the run's median or more: [prompt id, mode, run, ms], and the median."""
    t1s = [(r, ((r.get("policy") or {}).get("costs") or {}).get("t1")) for r in records]
    t1s = [(r, t) for r, t in t1s if isinstance(t, (int, float)) and t > 0]
    if len(t1s) < 4:
        return None
    med = statistics.median(t for _, t in t1s)
    cells = [[r["prompt_id"], r["mode"], r["run"], round(t * 1e3, 1)] for r, t in t1s if t >= SLOW_CELL * med]
    return dict(median_ms=round(med * 1e3, 1), cells=cells)


def summarise(records: list[dict], modes) -> dict:
    def group(rs):
        base = [r for r in rs if r["mode"] == "target"]
        return {m: mode_metrics([r for r in rs if r["mode"] == m], base) for m in modes
                if any(r["mode"] == m for r in rs)}
    cats = sorted({r["category"] for r in records})
    mism = [dict(prompt_id=r["prompt_id"], mode=r["mode"], run=r["run"], first_difference=r["first_difference"])
            for r in records if r["identical_to_target"] is False]
    ratios = repeat_ratios(records)
    return dict(overall=group(records), by_category={c: group([r for r in records if r["category"] == c])
                                                     for c in cats}, mismatches=mism,
                target_repeat=dict(overall=repeat_spread(ratios),
                                   by_category={c: repeat_spread([t for t in ratios if t[1] == c]) for c in cats}),
                slow_cells=slow_cells(records),
                remeasured=sorted({r["prompt_id"] for r in records if r.get("remeasure")}),
                remeasured_twice=sorted({r["prompt_id"] for r in records if (r.get("remeasure") or 0) > 1}),
                rounds=rounds_by_prompt(records))


def rounds_by_prompt(records: list[dict]) -> dict:
    """{prompt id: the most rounds any of its sets was measured in}, for those measured in
    rounds (short answers: runner.rounds_for)."""
    out: dict = {}
    for r in records:
        if r.get("round"):
            out[r["prompt_id"]] = max(out.get(r["prompt_id"], 1), r["round"] + 1)
    return dict(sorted(out.items()))



# -- report ------------------------------------------------------------------
def fmt(x, spec=".2f", suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


def rate(x) -> str:
    return fmt(x, ".0f" if x is not None and x >= 100 else ".1f")


def share_text(share: dict | None) -> str:
    """Each proposer's share of the emitted tokens, e.g. 'target 62% draft 38%'."""
    if not share:
        return "–"
    return " ".join(f"{k} {v:.0%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1]))


def overall_table(summary: dict, title: str) -> Table:
    t = Table(title=title, **TABLE_STYLE)
    for col in ("mode", "tok/s", "min–max", "speed-up", "paced", "bound", "effic.", "accept", "tok/pass", "same"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, m in summary["overall"].items():
        same = "–" if not m["n_compared"] else f"{m['n_identical']}/{m['n_compared']}"
        t.add_row(mode, rate(m["tokens_per_second"]),
                  f"{rate(m['tokens_per_second_min'])}–{rate(m['tokens_per_second_max'])}",
                  fmt(m["speedup"], ".2f", "x"), fmt(m.get("speedup_paced") if mode != "target" else None, ".2f", "x"),
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


# A category's paced speed-up this far from its plain one (|log| of their ratio, ~3 %) is named
# in the report: the machine's pace moved that much between the mode's cells and the target's.
PACED_APART = 0.03


def paced_line(summary: dict) -> str | None:
    """What the paced column is, and the categories whose paced speed-up lies PACED_APART or
    more from the plain one where either is below 1 (slower than the target alone, or the
    machine's pace)."""
    over = summary.get("overall") or {}
    if not any(m.get("speedup_paced") for k, m in over.items() if k != "target"):
        return None
    apart = []
    for cat, group in (summary.get("by_category") or {}).items():
        for mode, m in group.items():
            s, p = m.get("speedup"), m.get("speedup_paced")
            if mode != "target" and s and p and min(s, p) < 1.0 and abs(math.log(p / s)) >= PACED_APART:
                apart.append(f"{cat} {mode} {s:.2f}x → {p:.2f}x")
    return ("paced: each cell's speed-up times how much slower its one-token target passes (or its "
            "pace probe) ran than its set's target alone's; the machine's pace taken out, not the "
            "mode's work (the speed-up column is the plain one)"
            + (f"; below 1x in one and {PACED_APART:.0%} or more apart: {', '.join(apart)}" if apart else "") + ".")


def repeat_line(summary: dict) -> str | None:
    """What the target alone's two times per prompt say about this run's noise."""
    rep = (summary.get("target_repeat") or {}).get("overall")
    if not rep:
        return None
    return (f"the target alone timed again after the other modes ran at {rep['min']:.2f}–{rep['max']:.2f}x "
            f"its first time (median {rep['median']:.2f}x, {rep['n']} prompts; farthest: "
            f"{rep['farthest_prompt']}): one cell moves that much by the machine alone. Speed-ups are "
            f"against the mean of the two.")


def remeasured_line(summary: dict) -> str | None:
    """The prompts measured a second time, if any."""
    again = summary.get("remeasured")
    if not again:
        return None
    twice = set(summary.get("remeasured_twice") or ())
    names = ", ".join(p + (" (twice)" if p in twice else "") for p in again)
    return (f"measured again, their target-alone times (or a cell's one-token passes against them) "
            f"{NOISY_BRACKET_PCT} % or more apart (once more where the second set was as far apart; each speed-up "
            f"from the calm sets, each against its own target alone, or the median of all where none was calm): "
            f"{names}")


def rounds_line(summary: dict) -> str | None:
    """The short answers measured in rounds, if any."""
    rounds = summary.get("rounds")
    if not rounds:
        return None
    names = ", ".join(f"{p} ({n})" for p, n in rounds.items())
    return (f"short answers, each mode measured in rounds (their number in brackets) and each cell's rounds "
            f"pooled, as a second-long cell moves with the machine's pace: {names}")


def slow_cells_line(summary: dict) -> str | None:
    """The cells that ran in a slow spell of the machine, if any."""
    slow = summary.get("slow_cells")
    if not slow or not slow["cells"]:
        return None
    cells = ", ".join(f"{p} {m}" + (f" (run {run + 1})" if run else "") + f" {ms:g} ms"
                      for p, m, run, ms in slow["cells"][:6])
    more = f" and {len(slow['cells']) - 6} more" if len(slow["cells"]) > 6 else ""
    return (f"cells whose one-token target passes ran {SLOW_CELL:g}x or more the run's median "
            f"({slow['median_ms']:g} ms): {cells}{more}: the target itself ran slower in those cells, "
            f"so their speed-ups measure that as much as the mode.")


def mismatch_table(summary: dict) -> Table:
    t = Table(title="[bold red]Outputs that differ from the target alone[/]", **TABLE_STYLE)
    for col in ("prompt", "mode", "run", "first differing token"):
        t.add_column(col)
    for m in summary["mismatches"]:
        t.add_row(Text(m["prompt_id"]), m["mode"], str(m["run"] + 1), str(m["first_difference"]), style="red")
    return t


def filters_text(args) -> str:
    """The sampling filters that are on, as the options name them ("top-k 40, min-p 0.05")."""
    on = []
    for name in ("top_k", "top_p", "min_p"):
        v, off = getattr(args, name, None), getattr(GenerationConfig, name)
        if v is not None and v != off:
            on.append(f"{name.replace('_', '-')} {v:g}")
    return ", ".join(on)


def sampling_text(args) -> str:
    """"temperature 0.8 > 0" and the sampling filters that are on."""
    filters = filters_text(args)
    return f"temperature {args.temperature:g} > 0" + (f", {filters}" if filters else "")


def verdict(summary: dict, args) -> tuple[str, bool]:
    """One line, and whether it is good news (no mismatches)."""
    over = summary["overall"]
    spec = [m for m in ("draft", "combined", "lookup", "prediction", "corpus") if m in over]  # headline first
    if not spec:
        return "only the target alone was measured: nothing to compare", True
    if "target" not in over:
        return "no target-alone baseline (add 'target' to --modes): speed-up and equality not measured", True
    draft_name = Path(args.draft).stem if os.sep in str(args.draft) else args.draft
    label = {"draft": f"draft {draft_name} with n_draft={args.n_draft}", "lookup": "n-gram lookup",
             "combined": f"draft {draft_name} + lookup with n_draft={args.n_draft}",
             "prediction": "the prompts' predictions", "corpus": f"draft {draft_name} + lookup + suffix corpus"}
    head, m = spec[0], over[spec[0]]
    s = m["speedup"] or 0.0
    line = (f"{label[head]}: " + (f"{s:.2f}x faster than target alone" if s >= 1 else
                                  f"slower than target alone, {s:.2f}x")
            + f" (bound {fmt(m['theoretical_speedup'], '.2f', 'x')}, "
              f"acceptance {fmt(m['acceptance_rate'], '.0%')})")
    line += "".join(f"; {k} {fmt(over[k]['speedup'], '.2f', 'x')}" for k in MODES if k in spec[1:])
    if args.temperature > 0:
        return line + f"; outputs not compared ({sampling_text(args)})", True
    n_same = sum(over[k]["n_identical"] for k in spec)
    n_all = sum(over[k]["n_compared"] for k in spec)
    line += f"; {n_same}/{n_all} outputs identical to target alone"
    t = over["target"]
    if t["n_compared"] and t["n_identical"] != t["n_compared"]:
        # the bracket's second target-alone run is checked against the first
        line += (f"; the target alone differed from itself on {t['n_compared'] - t['n_identical']} of "
                 f"{t['n_compared']} prompts (not deterministic here: the equality check says little)")
        return line, False
    return line, n_same == n_all


def print_report(console: Console, summary: dict, modes, args, n_prompts: int) -> None:
    if not args.quiet:
        console.print(overall_table(summary, f"Overall: {n_prompts} prompts × {args.runs} run(s), "
                                             f"max {args.max_tokens} tokens"))
        console.print(Text("tokens emitted, by proposer: " + "; ".join(
            f"{mode}: {share_text(m.get('emitted_share'))}" for mode, m in summary["overall"].items())))
        console.print(category_table(summary, modes))
        for line in (paced_line(summary), repeat_line(summary), rounds_line(summary), remeasured_line(summary),
                     slow_cells_line(summary)):
            if line:
                console.print(Text(line, style="dim"))
        if summary["mismatches"]:
            console.print(mismatch_table(summary))
            console.print("[dim]Mismatches can come from numerical near-ties (batched vs single-token "
                          "kernels); --batch-invariant (SpeculativeDecoder(batch_invariant=True)) "
                          "rules that out.[/]")
    if args.temperature > 0 and not args.quiet:
        console.print(f"[yellow]{sampling_text(args)}: greedy equality check skipped[/]")
    line, ok = verdict(summary, args)
    console.print(Text(line, style="bold green" if ok else "bold red"))

