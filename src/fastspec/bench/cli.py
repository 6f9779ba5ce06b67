"""Benchmark speculative decoding against the target model alone.

Usage::

    python -m fastspec.bench                          # default pair, built-in prompts, all modes
    python -m fastspec.bench --limit 1 --max-tokens 64 --modes target,draft
    python -m fastspec.bench --target T.gguf --draft D.gguf --prompts spec_bench.jsonl --runs 3
    python -m fastspec.bench --show                   # colour one output by where its tokens came from
    python -m fastspec.bench sweep --targets A,B --drafts X,Y --n-draft 2,4,auto   # see fastspec.bench.sweep
    python -m fastspec.bench advise                   # does speculation pay here, and why (fastspec.bench.advise)
    python -m fastspec.bench --prompts spec_bench.jsonl --multi-turn    # turn 2 of each conversation

Modes: ``target`` (the target alone, the baseline), ``draft`` (draft-model proposals),
``lookup`` (n-gram prompt lookup, no draft model), ``combined`` (both), ``prediction`` (the
target with the prompt's ``prediction`` as proposals, no draft model: the built-in ``edit``
prompts, as with OpenAI's Predicted Outputs), ``corpus`` (combined + a suffix corpus of the
decoder's earlier generations; with ``--multi-turn`` it is also given each first turn and
its answer).  The report shows which proposer each emitted token came from.  Each prompt is
formatted with the target's chat template and generated greedily in every mode; every
speculative output is compared token by token with the target-alone output.  The target
alone runs twice per prompt, before and after the other modes (``--no-bracket``: once), so
that a drift of the machine's pace over a prompt's cells moves the baseline too; how far its
second time fell from its first is reported as the run's noise; a prompt whose two times are 5 %
or more apart, or one of whose cells ran its one-token target passes that far from the target
alone's, is measured once more after the run's other prompts (``--no-remeasure``: not), and
a third time where that second set is as noisy; each set's cells are compared with that set's
own target-alone times, the prompt's speed-up taken from its calm sets (the median of all where
none was calm).  A short answer (its first cell generated in under ``--min-cell-seconds``)
is measured in rounds, every mode in turn each round, each cell's rounds pooled (tokens over
seconds): a second-long cell alone moves 5-10 % with the machine's pace.  Reported per category and
overall: tok/s (median, min-max over runs), acceptance, tokens per target pass, speed-up
over the target alone (geometric mean of per-prompt ratios, each against the mean of the
target alone's two times), the Leviathan bound, and efficiency = speed-up / bound.  All raw measurements go to a JSON
file (``--out``), kept also when the run fails or is interrupted.

Prompt files are JSON lines, ``{"prompt": ..., "category": ..., "id": ...}`` (category
and id optional) or Spec-Bench's ``{"question_id": ..., "category": ..., "turns": [...]}``
(first turn used; both with ``--multi-turn``).  A plain line may carry ``"prediction"``.
"""
from __future__ import annotations

import argparse
import codecs
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.text import Text

from fastspec import models
from fastspec.bench.options import add_common_arguments, add_rounds_argument, add_sampling_arguments, list_arg, \
    n_draft_arg, temperature
from fastspec.bench.prompts import BenchError, Prompt, load_prompts, select_prompts, two_turn_prompts
from fastspec.bench.report import SOURCE_STYLES, print_report, summarise
from fastspec.bench import advise, runner, sweep
from fastspec.bench.runner import BASIC_MODES, MODES, NOISY_BRACKET_PCT, check_equality, close_decoders, format_prompt, gen_kwargs, load_average, now

SCHEMA = "fastspec-bench/1"



def run_advice(records: list[dict], costs: dict) -> dict | None:
    """The advisor's reading of this run: its own cost model (the median over its
    generations: advise.run_costs) and acceptance, nothing measured again."""
    if not costs.get("times") or not costs.get("t_draft"):
        return None
    costs = advise.run_costs(records, costs)
    return advise.advise(costs["times"], costs["t_draft"], advise.acceptance_from_records(records),
                         t_catchup=costs.get("t_catchup"), by_category=advise.category_costs(records, costs))


# -- --show --------------------------------------------------------------------
def show(args, prompts: list[Prompt], console: Console) -> None:
    mode = next((m for m in args.modes or ["combined"] if m != "target"), "combined")
    decs = runner.open_decoders(args, [mode])
    try:
        dec = decs[mode]
        text, add_special = format_prompt(dec, prompts[0].text, args.chat_template)
        if mode == "prediction" and prompts[0].prediction is None:
            raise BenchError(f"--show --modes prediction: prompt {prompts[0].id} has no prediction", 2)
        r = dec.generate(text, add_special=add_special, **gen_kwargs(args, mode, 0, prompt=prompts[0]))
        out, utf8 = Text(), codecs.getincrementaldecoder("utf-8")(errors="replace")
        for tok, src in zip(r.tokens, r.sources):
            out.append(utf8.decode(dec.target_model.token_to_piece(tok)), style=SOURCE_STYLES.get(src, ""))
        out.append(utf8.decode(b"", final=True))
    finally:
        close_decoders(decs)
    s = r.stats
    console.print(Text.assemble((prompts[0].id, "bold"), f" ({mode}): {prompts[0].text[:300]}"))
    console.print(out)
    console.print(Text.assemble("legend: ", *[x for src in ("draft", "lookup", "prediction", "suffix")
                                              for x in ((f"accepted {src} token", SOURCE_STYLES[src]), "  ")],
                                "target token"))
    by_source = ", ".join(f"{k} {v}" for k, v in s.emitted_by_source.items())
    console.print(f"acceptance rate {s.acceptance_rate:.0%} ({s.n_accepted}/{s.n_drafted} proposals), "
                  f"{s.mean_accepted_length:.2f} tokens per target pass; tokens from {by_source}")



# -- command line --------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastspec.bench", description=__doc__.split("\n\n")[0],
                                epilog="python -m fastspec.bench sweep --help: targets x drafts x settings")
    p.add_argument("--target", default=models.DEFAULT_PAIR[0], help="target model name or GGUF path")
    p.add_argument("--draft", default=models.DEFAULT_PAIR[1], help="draft model name or GGUF path")
    add_common_arguments(p)
    p.add_argument("--temperature", type=temperature, default=0.0, help="> 0 skips the greedy equality check")
    add_sampling_arguments(p)
    p.add_argument("--modes", type=list_arg(MODES), help="subset of " + ",".join(MODES) + " (default: "
                   + ",".join(BASIC_MODES) + ", + prediction where prompts carry a prediction, + corpus with "
                   "--multi-turn; --show: the first speculative one, else combined)")
    p.add_argument("--multi-turn", action="store_true",
                   help="prompts with two turns (Spec-Bench): the target answers turn 1, every mode is measured "
                        "on turn 2 with the conversation so far; the corpus mode's suffix corpus gets turn 1")
    p.add_argument("--no-advice", dest="advice", action="store_false",
                   help="do not print the advisor's reading of this run (python -m fastspec.bench advise)")
    p.add_argument("--n-draft", type=n_draft_arg, default="auto", help="tokens drafted per pass, or 'auto'")
    p.add_argument("--no-bracket", dest="bracket", action="store_false",
                   help="time the target alone once per prompt (default: before and after the other modes, "
                        "each speed-up against the mean of the two, and their spread reported)")
    p.add_argument("--no-remeasure", dest="remeasure", action="store_false",
                   help=f"do not measure again the prompts whose two target-alone times, or a cell's one-token passes against "
                        f"them, are {NOISY_BRACKET_PCT} %% or more apart (default: once more after the run's other "
                        "prompts, a third time if still so; each set against its own target-alone times, each "
                        "speed-up from the calm sets)")
    add_rounds_argument(p)
    p.add_argument("--out", help="results JSON (default: bench-results-<timestamp>.json)")
    p.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, else a line per step on stderr) or tables, only the verdict")
    p.add_argument("--show", action="store_true", help="generate once and colour tokens by source")
    p.add_argument("--trace", action="store_true",
                   help="record every target pass of the speculative modes (the policy's choice, what it "
                        "promised, what came of it) in the results JSON, as each measurement's stats.trace")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:
        return sweep.main(argv[1:])
    if argv[:1] == ["advise"]:
        return advise.main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    err, console = Console(stderr=True, soft_wrap=True, highlight=False), Console()
    try:
        prompts = select_prompts(load_prompts(args.prompts), args.categories, args.limit)
        if args.multi_turn:
            prompts = two_turn_prompts(prompts)
    except BenchError as e:
        err.print(f"fastspec.bench: error: {e}", markup=False, highlight=False)
        return e.code
    wanted = args.modes or [*BASIC_MODES, *(["prediction"] if any(p.prediction for p in prompts) else []),
                            *(["corpus"] if args.multi_turn else [])]
    skipped = runner.unsupported_modes(wanted)
    for mode, why in skipped.items():
        err.print(f"fastspec.bench: note: skipping the {mode} mode: {why}", markup=False, highlight=False)
    modes = [m for m in MODES if m in wanted and m not in skipped]  # canonical order, target first
    out = Path(args.out or time.strftime("bench-results-%Y%m%d-%H%M%S.json")).expanduser()
    records: list[dict] = []
    report = dict(schema=SCHEMA, status="starting", started_at=now(), finished_at=None,
                  settings={k: v for k, v in vars(args).items() if k not in ("show", "quiet")},
                  environment={}, prompts=[], measurements=records, summary=None)
    report["settings"]["modes"] = modes
    report["settings"]["skipped_modes"] = skipped
    decoders: dict = {}
    costs: dict = {}
    try:
        if not prompts:
            raise BenchError("no prompts left after --categories/--limit"
                             + (" with two turns (--multi-turn; the built-in prompts have one turn: pass a "
                                "JSONL file whose prompts have two, e.g. Spec-Bench's questions, with --prompts)"
                                if args.multi_turn else ""), 2)
        if not modes:
            raise BenchError("no mode left to run", 2)
        if args.show:
            show(args, prompts, console)
            return 0
        runner.check_writable(out)
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
        report["advice"] = run_advice(records, costs)
        runner.write_json(out, report)

    try:
        decoders = runner.open_decoders(args, modes)
        report["settings"]["chat_template"] = not format_prompt(decoders[modes[0]], "x", args.chat_template)[1]
        report["environment"] = runner.environment(decoders)
        note = runner.busy_note(report["environment"])
        if note:
            err.print(f"fastspec.bench: {note}")
        if report["environment"].get("max_verify_batch", 2) <= 1:
            err.print("fastspec.bench: note: --batch-invariant: no verification batch larger than 1 token is "
                      "bit-identical on this build, so every mode runs the target alone")
        report["status"] = "running"
        runner.run_bench(decoders, prompts, modes, args, records, save)
        dec = decoders.get("draft") or decoders.get("combined")
        if dec is not None:
            costs.update(times=dict(dec.cost_model.verify_times), t_draft=dec.cost_model.draft_time,
                         t_catchup=dec.cost_model.catchup_time)
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
    if args.advice and not args.quiet and report.get("advice"):
        advise.print_advice(console, report["advice"])
    if not args.quiet:
        console.print(Text(f"results: {out}", style="dim"))
    return 0

