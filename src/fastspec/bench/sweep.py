"""Sweep targets × drafts × draft settings × temperatures: a speed-up heatmap.

Usage::

    python -m fastspec.bench sweep --targets default-target --drafts default-draft,smollm2-135m-instruct-q4_1 \\
        --n-draft 2,4,8,auto --p-min 0,0.75 --temperatures 0,0.7 --lookup --limit 1
    python -m fastspec.bench sweep --targets T.gguf --drafts D.gguf --quantize Q8_0,Q4_K_M
    python -m fastspec.bench sweep --config sweep.json         # the same options as JSON keys

For every target the target alone is measured once per prompt and temperature (the
baseline: its tok/s and the outputs compared).  For every draft the pair is loaded (a draft
whose vocabulary differs from the target's is reported as incompatible and skipped), then
every setting (n_draft × p_min; with ``--lookup`` also draft + n-gram lookup, and lookup
alone as an extra column) runs the prompts at every temperature, prompt by prompt, with
the target alone timed again on the same decoder right before a prompt's settings and
right after them.  Speed-up = geometric mean over prompts of the tok/s ratio to the mean of
those two (the machine's pace moves by 10-15 % over minutes: a baseline timed in a block
before every setting measured that as much as the settings); at temperature 0 every output
is also compared token by token with the baseline's.  A prompt whose two target-alone times,
or a setting's one-token passes against them, are 5 % or more apart is measured again after
the column's other prompts (and a third time if still so), as the bench does; its speed-up
comes from its calm sets (``--no-remeasure``: not); a short answer's settings are measured
in rounds, as the bench's cells are (``--min-cell-seconds``).  Where ``auto`` runs beside fixed
lengths, each category's auto speed-up is put against the best fixed length's (a table,
a summary line and ``auto_vs_fixed`` in the JSON).

``--quantize Q8_0,Q4_K_M`` adds quantized variants of each target as extra rows, written
to ``<model cache>/variants/<stem>.<TYPE>.gguf`` and reused while the source is unchanged.
A variant made from an already quantized file is flagged as re-quantized.

Output: a terminal heatmap per temperature (target rows × draft columns, best setting per
cell; red < 1×, yellow ≈ 1×, green > 1×) and one table per setting; the same as a
self-contained HTML file (``--html``, default: the JSON's name with ``.html``); and a JSON
file (``--out``) with every raw measurement, the cells, the settings and the environment,
kept also when the run fails or is interrupted.

A ``--config`` file is a JSON object whose keys are the long options (``n_draft`` or
``n-draft``); list options take JSON lists.  Options given on the command line win.
Relative paths are relative to the current directory.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

import fastspec
from fastspec import _core, models
from fastspec.bench import runner
from fastspec.bench.options import add_common_arguments, add_rounds_argument, add_sampling_arguments, fraction, \
    n_draft_arg, temperature
from fastspec.bench.progress import progress
from fastspec.bench.prompts import BenchError, load_prompts, select_prompts
from fastspec.bench.report import TABLE_STYLE, filters_text, geomean, mode_metrics, prompt_speedups, rate

SCHEMA = "fastspec-sweep/1"
LOOKUP_COLUMN = "lookup alone"

# enum llama_ftype (vendor/llama.cpp/include/llama.h): number -> name, for reporting file types
FTYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}
UNQUANTIZED = {"F32", "F16", "BF16"}
FTYPE_GUESSED = 1024  # llama.cpp ORs this in when the file does not say
# what --quantize accepts: the types that need no importance matrix (the IQ1/IQ2/IQ3 ones and
# Q2_K_S do), plus llama-quantize's short aliases
QUANT_TYPES = {name: num for num, name in FTYPE_NAMES.items()
               if name in ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M",
                           "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")}
QUANT_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# "auto within 10 % of the best fixed setting per category" (issue 11): the share of the best
# fixed draft length's speed-up that auto is reported against, per category
AUTO_WITHIN = 0.90

# heatmap colours (red < 1, yellow ≈ 1, green > 1), full strength at 0.5x / 2x
RED, YELLOW, GREEN, GREY = (0xF4, 0x6D, 0x43), (0xFE, 0xE0, 0x8B), (0x66, 0xBD, 0x63), "#dddddd"
NEUTRAL_BAND = 0.03


# -- plan ----------------------------------------------------------------------
@dataclass
class ModelEntry:
    label: str                          # unique display name
    spec: str                           # as given: registry name or path
    path: str
    file_type: str | None = None        # "F32", "Q4_K_M", ... (None: the file does not say)
    variant: dict | None = None         # for a quantized variant: source, quant, requantized, note
    info: dict = field(default_factory=dict)  # description, n_params, size_bytes once loaded

    @property
    def row_label(self) -> str:
        kind = self.file_type or "type?"
        if self.variant:
            mark = " †" if self.variant["requantized"] else ""
            return f"{self.label} ({kind} from {self.variant['source_file_type'] or 'type?'}{mark})"
        return f"{self.label} ({kind})"


@dataclass(frozen=True)
class Setting:
    mode: str                           # "draft", "combined" (draft + lookup) or "lookup" (alone)
    n_draft: int | str
    p_min: float = 0.0

    @property
    def short(self) -> str:
        """Cell text: what distinguishes settings within one column."""
        s = f"n={self.n_draft}" + (f" p≥{self.p_min:g}" if self.p_min else "")
        return s + ("+lookup" if self.mode == "combined" else "")

    @property
    def title(self) -> str:
        what = {"draft": "draft", "combined": "draft + lookup", "lookup": "lookup alone"}[self.mode]
        return f"{what} n_draft={self.n_draft}" + (f" p_min={self.p_min:g}" if self.p_min else "")


def draft_settings(args) -> list[Setting]:
    modes = ["draft", "combined"] if args.lookup else ["draft"]
    return [Setting(m, n, p) for m in modes for n in args.n_draft for p in args.p_min]


def lookup_settings(args) -> list[Setting]:
    return [Setting("lookup", n) for n in args.n_draft] if args.lookup else []


def columns(args, drafts: list[ModelEntry]) -> list[tuple[str, list[Setting]]]:
    """(column label, its settings): one column per draft, plus lookup alone with --lookup."""
    cols = [(d.label, draft_settings(args)) for d in drafts]
    return cols + ([(LOOKUP_COLUMN, lookup_settings(args))] if args.lookup else [])


# -- models and quantized variants -------------------------------------------------
def quant_type(text: str) -> str:
    """Canonical quantization name from a case-insensitive one; ArgumentTypeError if unknown."""
    name = text.strip().upper()
    name = QUANT_ALIASES.get(name, name)
    if name not in QUANT_TYPES:
        raise argparse.ArgumentTypeError(f"unknown quantization type {text!r} (known: "
                                         f"{', '.join([*QUANT_TYPES, *QUANT_ALIASES])})")
    return name


def file_type(path: str) -> str | None:
    """The GGUF's general.file_type as a name ("Q4_K_M"); None if the file does not say."""
    m = _core.Model(path, vocab_only=True)
    try:
        raw = m.metadata.get("general.file_type")
    finally:
        m.close()
    if raw is None or not raw.strip().lstrip("-").isdigit():
        return None
    num = int(raw) & ~FTYPE_GUESSED
    return FTYPE_NAMES.get(num, f"ftype {num}")


def _source_signature(path: str) -> dict:
    st = os.stat(path)
    return dict(source=str(Path(path).resolve()), source_size=st.st_size, source_mtime_ns=st.st_mtime_ns)


def quantize_variant(src: str, quant: str, *, source_type: str | None = None, n_threads: int = 0) -> dict:
    """Make (or reuse) the ``quant`` variant of GGUF ``src`` in ``<cache>/variants/``.

    Returns a dict: path, quant, source, source_file_type, requantized (True when the source
    is already quantized, None when its type is unknown), reused, note.  The file is written
    under a temporary name and renamed; a sidecar ``.json`` records which source it came
    from, and a variant whose source has changed since is made again."""
    quant = quant_type(quant)
    if source_type is None:
        source_type = file_type(src)
    requantized = None if source_type is None else source_type not in UNQUANTIZED
    folder = models.cache_dir() / "variants"
    dst = folder / f"{Path(src).stem}.{quant}.gguf"
    sidecar = dst.with_name(dst.name + ".json")
    signature = _source_signature(src)
    try:
        reused = dst.is_file() and {k: v for k, v in json.loads(sidecar.read_text()).items()
                                    if k in signature} == signature
    except (OSError, ValueError):
        reused = False
    if not reused:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
        try:
            _core.quantize(src, str(tmp), QUANT_TYPES[quant], n_threads=n_threads, allow_requantize=True)
            sidecar.unlink(missing_ok=True)
            os.replace(tmp, dst)
            sidecar.write_text(json.dumps(dict(signature, quant=quant, source_file_type=source_type)) + "\n")
        except (RuntimeError, ValueError, OSError) as e:
            raise BenchError(f"cannot quantize {src} to {quant}: {e}") from None
        finally:
            tmp.unlink(missing_ok=True)
    if requantized:
        note = (f"re-quantized from an already quantized {source_type} file: its quality is not what a "
                f"fresh {quant} quantization of the F16/F32 original would give")
    elif requantized is None:
        note = (f"the source file does not record its type: if it is already quantized, this {quant} "
                "variant is a re-quantization (lower quality than one made from F16)")
    else:
        note = f"quantized from {source_type}"
    return dict(path=str(dst), quant=quant, source=str(src), source_file_type=source_type,
                requantized=requantized, reused=reused, note=note)


def resolve_entries(specs: list[str], role: str) -> list[ModelEntry]:
    entries, seen = [], {}
    for spec in specs:
        try:
            path = str(models.resolve(spec))
            ftype = file_type(path)
        except (OSError, ValueError, RuntimeError, models.ModelFetchError) as e:
            raise BenchError(f"cannot use {role} model {spec!r}: {e}", 2) from None
        is_path = Path(spec).expanduser().is_file()
        label = Path(path).stem if is_path else spec
        seen[label] = seen.get(label, 0) + 1
        entries.append(ModelEntry(label if seen[label] == 1 else f"{label}#{seen[label]}", spec, path, ftype))
    return entries


def add_variants(targets: list[ModelEntry], quants: list[str], n_threads: int, say) -> list[ModelEntry]:
    """Targets with each one's quantized variants right after it."""
    out = []
    for t in targets:
        out.append(t)
        for q in quants:
            if t.file_type == q:
                say(f"note: {t.label} is already {q}: no {q} variant made", "yellow")
                continue
            v = quantize_variant(t.path, q, source_type=t.file_type, n_threads=n_threads)
            entry = ModelEntry(f"{Path(t.path).stem}.{q}", v["path"], v["path"], file_type(v["path"]), v)
            if v["requantized"] is not False:
                say(f"note: {entry.label}: {v['note']}", "bold yellow")
            out.append(entry)
    return out


# -- measuring ----------------------------------------------------------------------
def open_decoder(target: ModelEntry, draft: ModelEntry | None, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fastspec.SpeculativeDecoder(target.path, draft.path if draft else None, **runner.decoder_kwargs(args))


def model_info(m) -> dict:
    return dict(description=m.description, n_params=m.n_params, size_bytes=m.size_bytes)


def gen_args(args, temperature: float, setting: Setting | None) -> argparse.Namespace:
    """The namespace runner.measure expects, for one temperature and setting."""
    return argparse.Namespace(**{**vars(args), "temperature": temperature,
                                 "n_draft": setting.n_draft if setting else "auto",
                                 "p_min": setting.p_min if setting else 0.0})


class Sweep:
    """Runs the plan, filling ``records`` (raw measurements) and ``pair_status``."""

    def __init__(self, args, prompts, targets, drafts, records, on_progress, say=lambda text, style="": None):
        self.args, self.prompts, self.targets, self.drafts = args, prompts, targets, drafts
        self.records, self.on_progress, self.say = records, on_progress, say
        self.pair_status: dict[tuple[str, str], str] = {}
        self.n_threads = None
        self.n_remeasured = 0           # cells measured again (noisy prompts) or in rounds, for the progress bar

    def total(self) -> int:
        per = len(self.args.temperatures) * self.args.runs * len(self.prompts)
        cols = columns(self.args, self.drafts)
        n_settings = sum(len(s) + 2 for _, s in cols)      # + the target alone before and after
        return len(self.targets) * (per * (1 + n_settings) + 1 + len(self.drafts)) + self.n_remeasured

    def _measure(self, dec, target, column, setting, temperature, run, prompt, formatted, bar, task,
                 repeat=None, remeasure=0, round_=0):
        mode = setting.mode if setting else "target"
        bar.update(task, description=f"{target.label[:16]} {column[:16] if column else 'baseline'} "
                                     f"{setting.short if setting else ''} T={temperature:g} {prompt.id}")
        rec = runner.measure(dec, prompt, formatted, mode, run, gen_args(self.args, temperature, setting))
        rec.update(target=target.label, draft=column or None, temperature=temperature,
                   setting=setting.title if setting else "target alone",
                   n_draft=setting.n_draft if setting else None, p_min=setting.p_min if setting else None)
        if repeat is not None:
            rec["repeat"] = repeat
        if remeasure:
            rec["remeasure"] = remeasure
        if round_:
            rec["round"] = round_
        self.records.append(rec)
        bar.advance(task)
        return rec

    def _warm_up(self, dec, formatted, setting):
        p = self.prompts[0]
        runner.measure(dec, p, formatted[p.id], setting.mode if setting else "target", 0,
                      gen_args(self.args, 0.0, setting), min(16, self.args.max_tokens))
        runner.forget_warm_up([dec])

    def _run_settings(self, dec, target, column, settings, formatted, bar, task):
        """Every setting at every temperature; settings interleaved per prompt so that slow
        drift of the machine's speed spreads over all of them.  For a column (draft or lookup),
        each prompt's settings come between two timings of the target alone on the same
        decoder, which are that column's baseline (see compute_cells); a prompt whose pace
        moved while its settings ran (``runner.noisy_prompts``: the two timings apart, or a
        setting's one-token passes far from them) is measured again after the others, from the
        policy's evidence as its first set found it, as the bench does (``--no-remeasure``:
        not), and its noisy sets are left out of its speed-up where a calm one was measured."""
        head = runner.template_head(dec, self.args.chat_template)

        min_seconds = getattr(self.args, "min_cell_seconds", runner.MIN_CELL_SECONDS) if column else 0.0

        def prompt_cells(p, temperature, run, remeasure=0):
            """A prompt's settings between its two target-alone times; a short answer's in
            rounds, as the bench measures them (``runner.rounds_for`` the first cell's time;
            records marked ``round``; each round from the evidence the first started from)."""
            def one_round(n):
                first = None
                if column:
                    first = self._measure(dec, target, column, None, temperature, run, p, formatted[p.id], bar,
                                          task, 0, remeasure, n)
                for s in settings:
                    # the settings take turns on one decoder: without this the draft would keep
                    # the whole prompt from the setting before, a prefill no single request
                    # gets for free
                    if s is not None:
                        runner.forget_prompt([dec], head)
                    rec = self._measure(dec, target, column, s, temperature, run, p, formatted[p.id], bar, task,
                                        remeasure=remeasure, round_=n)
                    first = first or rec
                if column:
                    self._measure(dec, target, column, None, temperature, run, p, formatted[p.id], bar, task, 1,
                                  remeasure, n)
                return first

            def more_rounds(n_rounds):
                self.n_remeasured += (n_rounds - 1) * (len(settings) + (2 if column else 0))
                bar.update(task, total=self.total())
            runner.measure_in_rounds([dec], one_round, min_seconds, more_rounds)

        for temperature in self.args.temperatures:
            for run in range(self.args.runs):
                again_too = column and getattr(self.args, "remeasure", True)
                first_found = {}
                for p in self.prompts:
                    if again_too:
                        first_found[p.id] = runner.policy_evidence([dec])
                    prompt_cells(p, temperature, run)
                if not again_too:
                    continue
                mine = [r for r in self.records if r["target"] == target.label and r["draft"] == column
                        and r["temperature"] == temperature]

                def again(p, n):
                    # from the evidence its first set found (runner.from_evidence)
                    k = len(self.records)
                    runner.from_evidence(first_found[p.id], [dec], lambda: prompt_cells(p, temperature, run, n))
                    mine.extend(self.records[k:])

                def more(prompts):
                    self.n_remeasured += len(prompts) * (len(settings) + 2)
                    bar.update(task, total=self.total())
                runner.measure_noisy_again(mine, run, self.prompts, again, more)

    def run(self, bar, task) -> None:
        args = self.args
        per = len(args.temperatures) * args.runs * len(self.prompts)
        for t in self.targets:
            try:
                dec = open_decoder(t, None, args)
            except (OSError, ValueError, RuntimeError) as e:
                for col, settings in columns(args, self.drafts):
                    self.pair_status[(t.label, col)] = f"failed: cannot load the target: {e}"
                    bar.advance(task, per * len(settings) + (col != LOOKUP_COLUMN))
                bar.advance(task, per + 1)
                continue
            try:
                t.info = model_info(dec.target_model)
                if args.batch_invariant:
                    t.info["max_verify_batch"] = dec.max_verify_batch
                    if dec.max_verify_batch <= 1:
                        self.say(f"note: --batch-invariant: no verification batch larger than 1 token is "
                                 f"bit-identical for {t.label} on this build: its drafts run as the target alone",
                                 "yellow")
                self.n_threads = self.n_threads or dec._target_ctx.n_threads
                formatted = {p.id: runner.format_prompt(dec, p.text, args.chat_template) for p in self.prompts}
                self._warm_up(dec, formatted, None)
                bar.advance(task)
                self._run_settings(dec, t, "", [None], formatted, bar, task)  # the baseline
                if args.lookup:
                    self._run_settings(dec, t, LOOKUP_COLUMN, lookup_settings(args), formatted, bar, task)
                    self.pair_status[(t.label, LOOKUP_COLUMN)] = "ok"
            finally:
                dec.close()
            self.on_progress()
            for d in self.drafts:
                settings = draft_settings(args)
                try:
                    dec = open_decoder(t, d, args)
                except ValueError as e:  # vocabulary differs, recurrent model, ...
                    head, *details = [x.strip() for x in str(e).splitlines() if x.strip()]
                    reason = head + (" " + "; ".join(details) if details else "")
                    self.pair_status[(t.label, d.label)] = f"incompatible: {reason}"
                    bar.advance(task, per * len(settings) + 1)
                    continue
                except (OSError, RuntimeError) as e:
                    self.pair_status[(t.label, d.label)] = f"failed: {e}"
                    bar.advance(task, per * len(settings) + 1)
                    continue
                try:
                    d.info = d.info or model_info(dec.draft_model)
                    self._warm_up(dec, formatted, settings[0])
                    bar.advance(task)
                    self._run_settings(dec, t, d.label, settings, formatted, bar, task)
                    self.pair_status[(t.label, d.label)] = "ok"
                finally:
                    dec.close()
                self.on_progress()


# -- results ------------------------------------------------------------------------
def mark_equality(records: list[dict]) -> None:
    """At temperature 0, compare every speculative output with the baseline of its target,
    prompt and run."""
    base = {(r["target"], r["prompt_id"], r["run"]): r["tokens"] for r in records
            if r["mode"] == "target" and r["temperature"] == 0 and r["draft"] is None}
    for r in records:
        ref = base.get((r["target"], r["prompt_id"], r["run"]))
        if r["mode"] != "target" and r["temperature"] == 0 and ref is not None:
            r["first_difference"] = runner.compare_outputs(ref, r["tokens"])
            r["identical_to_target"] = r["first_difference"] is None


METRIC_KEYS = ("speedup", "tokens_per_second", "acceptance_rate", "mean_accepted_length", "theoretical_speedup",
               "efficiency", "n_identical", "n_compared")


def records_by_cell(records) -> dict[tuple, list[dict]]:
    """(target, column, setting, temperature) -> its records."""
    by_key: dict[tuple, list[dict]] = {}
    for r in records:
        by_key.setdefault((r["target"], r["draft"], r["setting"], r["temperature"]), []).append(r)
    return by_key


def compute_cells(records, targets, cols, temperatures, pair_status) -> list[dict]:
    """One cell per (target, column, setting, temperature), measured or not."""
    by_key = records_by_cell(records)
    cells = []
    for t in targets:
        for temperature in temperatures:
            first = by_key.get((t.label, None, "target alone", temperature), [])
            base_tps = mode_metrics(first, [])["tokens_per_second"] if first else None
            for col, settings in cols:
                # the column's own timings of the target alone, around each prompt's settings;
                # the first baseline where there are none (a run interrupted before any)
                base = by_key.get((t.label, col, "target alone", temperature)) or first
                pair = pair_status.get((t.label, col))
                for s in settings:
                    recs = by_key.get((t.label, col, s.title, temperature), [])
                    if pair is None or pair == "ok":  # "partial": interrupted while measuring this pair
                        status = ("ok" if pair else "partial") if recs else "not measured"
                    else:
                        status = pair
                    cell = dict(target=t.label, draft=col, mode=s.mode, n_draft=s.n_draft, p_min=s.p_min,
                                temperature=temperature, setting=s.title, label=s.short, status=status,
                                baseline_tokens_per_second=base_tps, n_prompts=len({r["prompt_id"] for r in recs}))
                    metrics = mode_metrics(recs, base) if recs and base else {}
                    cell.update({k: metrics.get(k) for k in METRIC_KEYS})
                    if recs and not base:
                        cell["status"] = "not measured: no baseline"
                    cells.append(cell)
    return cells


def auto_against_fixed(records, targets, cols, temperatures) -> list[dict]:
    """Per target, column, temperature and category: the speed-up of each ``auto`` setting
    and of the best fixed draft length of the same mode and p_min (each category's figure
    the geometric mean of its prompts' speed-ups, as a cell's is), and auto's share of the
    best fixed one's and of the best of it and the target alone (1.0); a row "all" per
    group for every prompt together.  Empty where no auto setting sits beside a fixed one."""
    by_key = records_by_cell(records)
    rows = []
    for t in targets:
        for temperature in temperatures:
            for col, settings in cols:
                base = by_key.get((t.label, col, "target alone", temperature)) or \
                    by_key.get((t.label, None, "target alone", temperature), [])
                for auto in [s for s in settings if s.n_draft == "auto"]:
                    fixed = [s for s in settings if s.n_draft != "auto" and s.mode == auto.mode and s.p_min == auto.p_min]
                    if not fixed or not base:
                        continue
                    speed = {}          # setting -> {prompt id: speed-up}
                    for s in [auto] + fixed:
                        speed[s] = prompt_speedups(by_key.get((t.label, col, s.title, temperature), []), base)
                    if not speed[auto]:
                        continue
                    category = {r["prompt_id"]: r["category"] for r in base}
                    groups = sorted({category.get(pid, "") for pid in speed[auto]}) + ["all"]
                    for g in groups:
                        mean = {s: geomean([x for pid, x in xs.items() if g == "all" or category.get(pid) == g])
                                for s, xs in speed.items()}
                        a = mean[auto]
                        scored = [(mean[s], s) for s in fixed if mean[s]]
                        if a is None or not scored:
                            continue
                        best, bs = max(scored, key=lambda xs: xs[0])
                        rows.append(dict(target=t.label, draft=col, temperature=temperature, setting=auto.title,
                                         category=g, auto=a, best_fixed=best, best_fixed_setting=bs.short,
                                         share=a / best, share_with_target=a / max(best, 1.0)))
    return rows


def auto_summary(rows: list[dict]) -> list[str]:
    """One line per target, column, temperature and auto setting: in how many categories
    auto came within AUTO_WITHIN of the best fixed length, and the lowest."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["category"] != "all":
            groups.setdefault((r["target"], r["draft"], r["temperature"], r["setting"]), []).append(r)
    out = []
    for (tgt, col, temperature, setting), rs in groups.items():
        ok = sum(r["share"] >= AUTO_WITHIN for r in rs)
        low = min(rs, key=lambda r: r["share"])
        out.append(f"{tgt} + {col}, {setting}, temperature {temperature:g}: auto within "
                   f"{round(100 * (1 - AUTO_WITHIN))} % of the best fixed length in {ok} of {len(rs)} categories "
                   f"(lowest {low['category']}: {low['auto']:.2f}× against {low['best_fixed']:.2f}× at "
                   f"{low['best_fixed_setting']}, {low['share']:.2f})")
    return out


def auto_tables(rows: list[dict]) -> list:
    """Terminal tables of auto_against_fixed's rows: one per target, column, temperature and
    auto setting."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["target"], r["draft"], r["temperature"], r["setting"]), []).append(r)
    out = []
    for (tgt, col, temperature, setting), rs in groups.items():
        t = Table(title=f"auto against the best fixed draft length, per category: {tgt} + {col}, {setting}, "
                        f"temperature {temperature:g}", **TABLE_STYLE)
        for name in ("category", "auto", "best fixed", "auto / best", "auto / max(best, 1)"):
            t.add_column(name, justify="left" if name in ("category", "best fixed") else "right")
        for r in rs:
            low = r["share"] < AUTO_WITHIN
            t.add_row(r["category"], f"{r['auto']:.2f}×", f"{r['best_fixed']:.2f}× {r['best_fixed_setting']}",
                      Text(f"{r['share']:.2f}", style="bold red" if low else ""), f"{r['share_with_target']:.2f}")
        out.append(t)
    return out


def best_cells(cells: list[dict]) -> dict:
    """temperature -> target -> column -> the cell with the highest speed-up (or the first
    cell, carrying the status, if none was measured)."""
    best: dict = {}
    for c in cells:
        slot = best.setdefault(str(c["temperature"]), {}).setdefault(c["target"], {})
        cur = slot.get(c["draft"])
        if cur is None or (c["speedup"] is not None and (cur["speedup"] is None or c["speedup"] > cur["speedup"])):
            slot[c["draft"]] = c
    return best


# -- rendering ------------------------------------------------------------------------
def speedup_colour(x: float | None) -> str:
    """Background colour for a speed-up: yellow within ±3% of 1×, then from a pale tint to full
    red (at 0.5× and below) or green (at 2× and above), on a log scale."""
    if x is None or x <= 0:
        return GREY
    v = math.log2(x)
    if abs(x - 1) <= NEUTRAL_BAND:
        rgb = YELLOW
    else:
        end, f = (GREEN if v > 0 else RED), 0.4 + 0.6 * min(1.0, abs(v))
        rgb = tuple(round(a + (b - a) * f) for a, b in zip(YELLOW, end))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def cell_lines(c: dict, with_setting: bool) -> tuple[str, str]:
    """(headline, detail) texts for a cell."""
    if c["speedup"] is None:
        word = c["status"].split(":")[0] if c["status"] != "ok" else "no data"
        return word, ""
    head = f"{c['speedup']:.2f}×" + (f" {c['label']}" if with_setting else "")
    detail = [f"acc {c['acceptance_rate']:.0%}" if c["acceptance_rate"] is not None else ""]
    if c["n_compared"]:
        detail.append(f"{c['n_identical']}/{c['n_compared']} same")
    return head, " ".join(x for x in detail if x)


def _rich_cell(c: dict | None, with_setting: bool):
    if c is None:
        return Text("–", style="dim")
    head, detail = cell_lines(c, with_setting)
    text = Text(head, style=f"black on {speedup_colour(c['speedup'])}")
    if detail:
        differs = c["n_compared"] and c["n_identical"] != c["n_compared"]
        text.append("\n" + detail, style="bold red" if differs else "dim")
    return text


def measured_settings(cells, cols) -> list[Setting]:
    """The settings with at least one measured cell (a table of only 'incompatible' says nothing
    the heatmap does not)."""
    seen = {c["setting"] for c in cells if c["speedup"] is not None}
    return [s for s in dict.fromkeys(s for _, ss in cols for s in ss) if s.title in seen]


def terminal_tables(cells, targets, cols, temperatures, summary_line) -> list:
    out = []
    by_t = {}
    for c in cells:
        by_t.setdefault(c["temperature"], []).append(c)
    best = best_cells(cells)
    for temperature in temperatures:
        tc = by_t.get(temperature, [])
        t = Table(title=f"Speed-up over the target alone at temperature {temperature:g}: best setting per cell "
                        f"({summary_line})", **TABLE_STYLE)
        t.add_column("target \\ draft")
        t.add_column("target tok/s", justify="right")
        for col, _ in cols:
            t.add_column(col, justify="left")
        for tgt in targets:
            base = next((c["baseline_tokens_per_second"] for c in tc if c["target"] == tgt.label), None)
            row = best.get(str(temperature), {}).get(tgt.label, {})
            t.add_row(Text(tgt.row_label), rate(base), *[_rich_cell(row.get(col), True) for col, _ in cols])
        out.append(t)
        for s in measured_settings(tc, cols):
            used = [col for col, ss in cols if s in ss]
            st = Table(title=f"temperature {temperature:g} · {s.title}", **TABLE_STYLE)
            st.add_column("target \\ draft")
            for col in used:
                st.add_column(col)
            for tgt in targets:
                found = {c["draft"]: c for c in tc if c["target"] == tgt.label and c["setting"] == s.title}
                st.add_row(Text(tgt.label), *[_rich_cell(found.get(col), False) for col in used])
            out.append(st)
    return out


def notes(targets, pair_status) -> list[tuple[str, str]]:
    """(text, style) lines: variants' provenance and pairs that were not measured."""
    lines = []
    for t in targets:
        if t.variant and t.variant["requantized"] is not False:
            lines.append((f"† {t.label}: {t.variant['note']}", "bold yellow"))
    grouped: dict[tuple[str, str], list[str]] = {}  # (column, status) -> targets
    for (tgt, col), status in pair_status.items():
        if status != "ok":
            grouped.setdefault((col, status), []).append(tgt)
    for (col, status), tgts in grouped.items():
        lines.append((f"{col} with {', '.join(tgts)}: {status}", "red"))
    return lines


def render_html(report: dict, cells, targets, cols, temperatures) -> str:
    e = html.escape
    best = best_cells(cells)
    env, st = report.get("environment") or {}, report["settings"]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>fastspec sweep</title>",
        "<style>"
        "body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "th,td{border:1px solid #bbb;padding:4px 8px;vertical-align:top}"
        "th{background:#f2f2f2;text-align:left}"
        "td.num{text-align:right}"
        "td .d{display:block;font-size:80%;color:#333}"
        "td .bad{color:#b00;font-weight:bold}"
        ".note{color:#8a6d00}.err{color:#b00}.meta{color:#555}"
        ".sw{display:inline-block;padding:2px 8px;margin-right:4px;border:1px solid #bbb}"
        "</style></head><body>",
        "<h1>fastspec sweep</h1>",
        f'<p class="meta">{e(report["started_at"] or "")} → {e(report.get("finished_at") or "")}, '
        f'status {e(report["status"])}; {len(report["prompts"])} prompts × {st["runs"]} run(s), max '
        f'{st["max_tokens"]} tokens, {st.get("threads") or env.get("n_threads") or "default"} threads'
        f'{", batch-invariant" if st.get("batch_invariant") else ""}; {e(str(env.get("cpu", "")))}, '
        f'fastspec {e(str(env.get("fastspec_version", "")))}</p>',
        '<p>Speed-up = geometric mean over prompts of tok/s relative to the target alone at the same '
        'temperature, timed on the same decoder right before and after each prompt\'s settings. Colours: '
        + "".join(f'<span class="sw" style="background:{speedup_colour(x)}">{x:g}×</span>'
                  for x in (0.5, 0.8, 1.0, 1.25, 1.5, 2.0))
        + f'<span class="sw" style="background:{GREY}">not measured</span></p>',
    ]

    def td(c, with_setting):
        if c is None:
            return "<td>–</td>"
        head, detail = cell_lines(c, with_setting)
        bad = c["n_compared"] and c["n_identical"] != c["n_compared"]
        title = e(c["status"] if c["speedup"] is None else c["setting"], quote=True)
        d = f'<span class="d{" bad" if bad else ""}">{e(detail)}</span>' if detail else ""
        return f'<td style="background:{speedup_colour(c["speedup"])}" title="{title}">{e(head)}{d}</td>'

    for temperature in temperatures:
        tc = [c for c in cells if c["temperature"] == temperature]
        parts.append(f"<h2>Temperature {temperature:g}</h2><h3>Best setting per cell</h3><table>")
        parts.append("<tr><th>target \\ draft</th><th>target tok/s</th>"
                     + "".join(f"<th>{e(col)}</th>" for col, _ in cols) + "</tr>")
        for tgt in targets:
            base = next((c["baseline_tokens_per_second"] for c in tc if c["target"] == tgt.label), None)
            row = best.get(str(temperature), {}).get(tgt.label, {})
            parts.append(f"<tr><th>{e(tgt.row_label)}</th><td class=\"num\">{e(rate(base))}</td>"
                         + "".join(td(row.get(col), True) for col, _ in cols) + "</tr>")
        parts.append("</table><h3>Per setting</h3>")
        for s in measured_settings(tc, cols):
            used = [col for col, ss in cols if s in ss]
            parts.append(f"<h4>{e(s.title)}</h4><table><tr><th>target \\ draft</th>"
                         + "".join(f"<th>{e(col)}</th>" for col in used) + "</tr>")
            for tgt in targets:
                found = {c["draft"]: c for c in tc if c["target"] == tgt.label and c["setting"] == s.title}
                parts.append(f"<tr><th>{e(tgt.label)}</th>" + "".join(td(found.get(col), False) for col in used)
                             + "</tr>")
            parts.append("</table>")
    rows = report.get("auto_vs_fixed") or []
    if rows:
        parts.append("<h2>auto against the best fixed draft length, per category</h2><table><tr>"
                     + "".join(f"<th>{x}</th>" for x in ("target + draft", "temperature", "setting", "category",
                                                          "auto", "best fixed", "auto / best",
                                                          "auto / max(best, 1)")) + "</tr>")
        for r in rows:
            low = ' class="err"' if r["share"] < AUTO_WITHIN else ""
            parts.append(f"<tr><td>{e(r['target'])} + {e(r['draft'])}</td><td class=\"num\">{r['temperature']:g}</td>"
                         f"<td>{e(r['setting'])}</td><td>{e(r['category'])}</td>"
                         f"<td class=\"num\">{r['auto']:.2f}×</td>"
                         f"<td>{r['best_fixed']:.2f}× {e(r['best_fixed_setting'])}</td>"
                         f"<td class=\"num\"{low}>{r['share']:.2f}</td>"
                         f"<td class=\"num\">{r['share_with_target']:.2f}</td></tr>")
        parts.append("</table>" + "".join(f"<p>{e(x)}</p>" for x in auto_summary(rows)))
    if report.get("remeasured"):
        parts.append(f'<p class="meta">measured again (the machine\'s pace moved while they ran): '
                     f'{e(", ".join(report["remeasured"]))}</p>')
    lines = notes(targets, report.get("pair_status_map", {}))
    if lines:
        parts.append("<h2>Notes</h2><ul>" + "".join(
            f'<li class="{"err" if style == "red" else "note"}">{e(text)}</li>' for text, style in lines) + "</ul>")
    parts.append("<h2>Models</h2><table><tr><th>role</th><th>label</th><th>type</th><th>path</th></tr>")
    for role, entries in (("target", report["targets"]), ("draft", report["drafts"])):
        for m in entries:
            parts.append(f"<tr><td>{role}</td><td>{e(m['label'])}</td><td>{e(str(m['file_type']))}</td>"
                         f"<td>{e(m['path'])}</td></tr>")
    parts.append("</table></body></html>\n")
    return "\n".join(parts)


# -- command line ---------------------------------------------------------------------
def list_of(item_type, what: str):
    def parse(text: str) -> list:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        out = []
        for x in items:
            v = item_type(x)
            if v not in out:
                out.append(v)
        return out
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastspec.bench sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", metavar="FILE.json", help="JSON file with any of these options as keys (lists as JSON lists)")
    p.add_argument("--targets", metavar="MODELS", type=list_of(str, "model names or paths"), help="target models (comma-separated)")
    p.add_argument("--drafts", metavar="MODELS", type=list_of(str, "model names or paths"), default=[],
                   help="draft models (comma-separated)")
    p.add_argument("--n-draft", metavar="N,...", type=list_of(n_draft_arg, "integers 1-32 or 'auto'"), default=["auto"],
                   help="tokens drafted per pass, e.g. 2,4,8,auto (default: auto)")
    p.add_argument("--p-min", metavar="P,...", type=list_of(fraction, "numbers from 0 to 1"), default=[0.0],
                   help="stop drafting below this draft probability, e.g. 0,0.75 (default: 0)")
    p.add_argument("--temperatures", metavar="T,...", type=list_of(temperature, "numbers >= 0"), default=[0.0],
                   help="e.g. 0,0.7 (default: 0); outputs are compared with the baseline at 0 only")
    add_sampling_arguments(p)
    p.add_argument("--lookup", action="store_true",
                   help="also n-gram lookup alone (an extra column) and draft + lookup settings")
    p.add_argument("--quantize", metavar="TYPE,...", type=list_of(quant_type, "quantization types"), default=[],
                   help="add quantized variants of each target, e.g. Q8_0,Q4_K_M,F16 (case-insensitive)")
    add_common_arguments(p)
    p.add_argument("--no-remeasure", dest="remeasure", action="store_false",
                   help=f"do not measure again a prompt whose two target-alone times around its settings, or a "
                        f"setting's one-token passes against them, are {runner.NOISY_BRACKET_PCT} %% or more apart "
                        "(default: once more after the column's other prompts, a third time if still so; each "
                        "prompt's speed-up from its calm sets)")
    add_rounds_argument(p)
    p.add_argument("--out", help="results JSON (default: sweep-results-<timestamp>.json)")
    p.add_argument("--html", help="HTML report (default: the JSON's path with .html)")
    p.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, else a line per step on stderr) or tables, only the summary line")
    return p


def config_defaults(parser: argparse.ArgumentParser, path: str) -> dict:
    """Parser defaults from a JSON config file, validated by the options' own parsers."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise BenchError(f"cannot read config file {path}: {e.strerror or e}", 2) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BenchError(f"config file {path} is not valid JSON: {e}", 2) from None
    if not isinstance(data, dict):
        raise BenchError(f"config file {path}: expected a JSON object", 2)
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    flags = {a.option_strings[0].lstrip("-").replace("-", "_"): a for a in actions.values()}
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        act = flags.get(name) or actions.get(name)
        if act is None:
            raise BenchError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(flags))})", 2)
        if act.nargs == 0:  # a flag: "lookup": true, "no_chat_template": true or "chat_template": false
            if not isinstance(value, bool):
                raise BenchError(f"config file {path}: {key} must be true or false", 2)
            out[act.dest] = value if name == act.dest or act.const is True else not value
            continue
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                           for v in value):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value)
        else:
            raise BenchError(f"config file {path}: {key} must be a string, a number or a list of them", 2)
        try:
            out[act.dest] = act.type(text) if act.type else text
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise BenchError(f"config file {path}: {key}: {e}", 2) from None
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**config_defaults(parser, known.config))
    args = parser.parse_args(argv)
    if not args.targets:
        raise BenchError("no targets: give --targets (or 'targets' in --config)", 2)
    if not args.drafts and not args.lookup:
        raise BenchError("nothing to compare: give --drafts and/or --lookup", 2)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    err, console = Console(stderr=True, soft_wrap=True, highlight=False), Console(highlight=False)

    def fail(e: BenchError) -> int:
        err.print(f"fastspec.bench sweep: error: {e}", markup=False, highlight=False)
        return e.code

    try:
        args = parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    except BenchError as e:
        return fail(e)
    out = Path(args.out or time.strftime("sweep-results-%Y%m%d-%H%M%S.json")).expanduser()
    html_out = Path(args.html).expanduser() if args.html else out.with_suffix(".html")

    def say(text, style=""):
        if not args.quiet or "yellow" in style:
            err.print(Text(text, style=style))

    records: list[dict] = []
    report = dict(schema=SCHEMA, status="starting", started_at=runner.now(), finished_at=None,
                  settings={k: v for k, v in vars(args).items() if k != "quiet"},
                  environment={}, prompts=[], targets=[], drafts=[], pairs=[], cells=[], best={},
                  auto_vs_fixed=[], remeasured=[], measurements=records)
    report["settings"].update(out=str(out), html=str(html_out))
    try:
        prompts = select_prompts(load_prompts(args.prompts), args.categories, args.limit)
        if not prompts:
            raise BenchError("no prompts left after --categories/--limit", 2)
        targets = resolve_entries(args.targets, "target")
        drafts = resolve_entries(args.drafts, "draft")
        for path in (out, html_out):
            runner.check_writable(path)
        targets = add_variants(targets, args.quantize, args.threads or 0, say)
    except BenchError as e:
        return fail(e)
    except KeyboardInterrupt:
        return 130
    report["prompts"] = [asdict(p) for p in prompts]
    cols = columns(args, drafts)
    sweep = Sweep(args, prompts, targets, drafts, records, lambda: save(), say)

    def save():
        report["finished_at"], report["load_average_at_end"] = runner.now(), runner.load_average()
        report["environment"]["n_threads"] = sweep.n_threads
        report["targets"] = [asdict(t) for t in targets]
        report["drafts"] = [asdict(d) for d in drafts]
        report["pairs"] = [dict(target=t, draft=d, status=s) for (t, d), s in sweep.pair_status.items()]
        mark_equality(records)
        report["cells"] = compute_cells(records, targets, cols, args.temperatures, sweep.pair_status)
        report["auto_vs_fixed"] = auto_against_fixed(records, targets, cols, args.temperatures)
        report["remeasured"] = sorted({r["prompt_id"] for r in records if r.get("remeasure")})
        report["best"] = {temp: {t: {d: dict(setting=c["setting"], label=c["label"], speedup=c["speedup"],
                                             status=c["status"]) for d, c in row.items()}
                                 for t, row in per_t.items()}
                          for temp, per_t in best_cells(report["cells"]).items()}
        runner.write_json(out, report)
        page = render_html(dict(report, pair_status_map=sweep.pair_status), report["cells"], targets, cols,
                           args.temperatures)
        tmp = html_out.with_name(html_out.name + ".partial")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, html_out)

    try:
        report["environment"] = runner.environment({})
        note = runner.busy_note(report["environment"])
        if note:
            say(note, "yellow")
        report["status"] = "running"
        with progress("fastspec.bench sweep", 48, args.quiet) as bar:
            task = bar.add_task("loading", total=sweep.total())
            sweep.run(bar, task)
        report["status"] = "complete"
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        err.print(f"fastspec.bench sweep: interrupted; partial results in {out}", markup=False)
        return 130
    except BaseException as e:
        report["status"] = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        save()

    cells = report["cells"]
    summary_line = f"{len(prompts)} prompts × {args.runs} run(s), max {args.max_tokens} tokens"
    if any(t > 0 for t in args.temperatures) and filters_text(args):
        summary_line += f"; sampling with {filters_text(args)}"
    if not args.quiet:
        for table in terminal_tables(cells, targets, cols, args.temperatures, summary_line):
            console.print(table)
        for text, style in notes(targets, sweep.pair_status):
            console.print(Text(text, style=style))
        for table in auto_tables(report["auto_vs_fixed"]):
            console.print(table)
        for text in auto_summary(report["auto_vs_fixed"]):
            console.print(Text(text))
        if report["remeasured"]:
            console.print(Text(f"measured again (the machine's pace moved while they ran): "
                               f"{', '.join(report['remeasured'])}", style="dim"))
    measured = [c for c in cells if c["speedup"] is not None]
    if measured:
        top = max(measured, key=lambda c: c["speedup"])
        line = (f"best: {top['target']} + {top['draft']} ({top['setting']}) at temperature {top['temperature']:g}: "
                f"{top['speedup']:.2f}× the target alone")
        n_same = sum(c["n_identical"] or 0 for c in measured)
        n_all = sum(c["n_compared"] or 0 for c in measured)
        if n_all:
            line += f"; {n_same}/{n_all} greedy outputs identical to the target alone"
        console.print(Text(line, style="bold green" if n_same == n_all else "bold red"))
    else:
        console.print(Text("nothing measured: no compatible target/draft pair", style="bold red"))
    if not args.quiet:
        console.print(Text(f"results: {out}  report: {html_out}", style="dim"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
