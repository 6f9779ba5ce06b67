"""Running the benchmark's modes on one decoder per mode and recording each generation."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import time
import warnings
from pathlib import Path

import fastspec
from fastspec.config import GenerationConfig
from fastspec import _core, models
from fastspec.bench.progress import progress
from fastspec.bench.prompts import BenchError, Prompt

MODES = ("target", "draft", "lookup", "combined", "prediction", "corpus")
BASIC_MODES = MODES[:4]           # the default run, plus "prediction" when prompts carry predictions
MODE_KWARGS = {"target": dict(speculative=False), "draft": dict(lookup=False),
               "lookup": dict(lookup=True), "combined": dict(lookup=True),
               "prediction": dict(lookup=False),  # the target + the prompt's prediction, no draft model
               "corpus": dict(lookup=True)}       # draft + lookup + a suffix corpus of earlier generations
NO_DRAFT_MODES = ("lookup", "prediction")


def api_supports(what: str) -> bool:
    """Whether the installed fastspec has ``generate(prediction=)`` ("prediction") or
    ``SpeculativeDecoder(corpus=)`` ("corpus")."""
    import inspect
    fn = fastspec.SpeculativeDecoder.generate if what == "prediction" else fastspec.SpeculativeDecoder.__init__
    return what in inspect.signature(fn).parameters


def unsupported_modes(modes) -> dict[str, str]:
    """mode -> why it cannot run with the installed fastspec."""
    out = {}
    if "prediction" in modes and not api_supports("prediction"):
        out["prediction"] = "this fastspec's SpeculativeDecoder.generate has no 'prediction' argument"
    if "corpus" in modes and not api_supports("corpus"):
        out["corpus"] = "this fastspec's SpeculativeDecoder has no 'corpus' argument"
    return out


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


def busy_cpus(seconds: float = 0.5) -> float | None:
    """How many CPUs' worth of time the machine spent busy (a neighbouring VM's steal
    included) over the next ``seconds``, from /proc/stat (Linux); None where it does not
    say.  Unlike the load average, not still counting work that ended a minute ago (the
    build of a ``pip install`` just before the bench)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]          # all, and idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (os.cpu_count() or 1) * (1.0 - (idle1 - idle0) / (total1 - total0))


def busy_note(env: dict) -> str | None:
    """A note where other work kept more than half the CPUs busy as the run began (from
    ``env["busy_cpus_at_start"]``, else the load average), else None."""
    n = os.cpu_count() or 1
    busy = env.get("busy_cpus_at_start")
    if busy is not None:
        return (f"note: other work kept {busy:.1f} of {n} CPUs busy as the run began; it will distort the timings"
                if busy > 0.5 * n else None)
    load = (env.get("load_average_at_start") or [None])[0]
    if load is None or load <= 0.5 * n:
        return None
    return f"note: system load {load:.1f} on {n} CPUs; other work will distort the timings"


def transparent_hugepage() -> str | None:
    """The kernel's transparent huge page mode (always / madvise / never), where it says."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = [w.strip("[]") for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else None


def environment(decoders: dict) -> dict:
    info = dict(fastspec_version=fastspec.__version__, llama_cpp_commit=fastspec.LLAMA_CPP_COMMIT,
                system_info=_core.system_info(), platform=platform.platform(), machine=platform.machine(),
                cpu=cpu_name(), cpu_count=os.cpu_count(), python=platform.python_version(),
                load_average_at_start=load_average(), busy_cpus_at_start=busy_cpus(),
                transparent_hugepage=transparent_hugepage())
    dec = next(iter(decoders.values()), None)
    if dec is not None:
        info["n_threads"] = dec._target_ctx.n_threads
        info["invariant_rows"] = _core.invariant_rows()
        info["zmm_pairs"] = _core.zmm_pairs()
        if dec.batch_invariant:
            info["max_verify_batch"] = dec.max_verify_batch
    for role in ("target", "draft"):
        for m in filter(None, (getattr(d, f"{role}_model") for d in decoders.values())):
            info[role] = dict(path=m.path, description=m.description, n_params=m.n_params,
                              size_bytes=m.size_bytes, use_mmap=m.use_mmap)
    return info



# -- models ------------------------------------------------------------------
def open_decoders(args, modes) -> dict:
    """mode -> decoder.  target/draft/combined share one decoder; lookup alone needs one
    without a draft model (the first one's target model, with contexts of its own)."""
    try:
        target = str(models.resolve(args.target))
        need_draft = any(m in ("draft", "combined", "corpus") for m in modes)
        draft = str(models.resolve(args.draft)) if need_draft else None
        kw = decoder_kwargs(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main_dec = fastspec.SpeculativeDecoder(target, draft, **kw)
            decs = {m: main_dec for m in modes if m not in NO_DRAFT_MODES + ("corpus",)}
            # the other decoders share main_dec's weights (their own contexts): one copy of each
            # model in memory, and every mode runs on the same weights in the same pages
            if any(m in NO_DRAFT_MODES for m in modes):
                alone = main_dec if draft is None else fastspec.SpeculativeDecoder(main_dec.target_model, None, **kw)
                decs.update({m: alone for m in modes if m in NO_DRAFT_MODES})
            if "corpus" in modes:
                decs["corpus"] = fastspec.SpeculativeDecoder(main_dec.target_model, main_dec.draft_model,
                                                             corpus=True, **kw)
    except (OSError, ValueError, RuntimeError, models.ModelFetchError) as e:
        raise BenchError(f"cannot load models: {e}") from None
    return decs


def decoder_kwargs(args) -> dict:
    """SpeculativeDecoder keyword arguments from the command line (shared with the sweep).
    No cost cache: the bench times this machine's costs itself (its cost table, the advice),
    and keeps another run's timings out of both."""
    return dict(n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                batch_invariant=args.batch_invariant,
                draft_vocab=args.draft_vocab, cost_cache=False)


def close_decoders(decoders: dict) -> None:
    # in any order: a Model closed by the decoder that loaded it keeps its weights until the
    # contexts of the decoders that borrowed it are closed too
    for dec in {id(d): d for d in decoders.values()}.values():
        dec.close()


def format_prompt(dec, text: str, use_template: bool, history: list[str] = ()) -> tuple[str, bool]:
    """(prompt, add_special): the chat-formatted prompt, or the raw text if asked or if the
    target has no chat template.  ``history``: earlier turns, user and assistant in turn."""
    if use_template and dec.target_model.chat_template() is not None:
        msgs = [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(history)]
        return dec.target_model.apply_chat_template(msgs + [{"role": "user", "content": text}]), False
    return "\n\n".join([*history, text]), True


def gen_kwargs(args, mode: str, run: int, max_tokens: int | None = None, prompt: Prompt | None = None) -> dict:
    kw = dict(max_tokens=max_tokens or args.max_tokens, temperature=args.temperature, seed=1234 + run,
              **{k: getattr(args, k, getattr(GenerationConfig, k)) for k in ("top_k", "top_p", "min_p")},
              n_draft=args.n_draft, p_min=getattr(args, "p_min", 0.0), **MODE_KWARGS[mode])
    if mode == "prediction":
        kw["prediction"] = prompt.prediction
    if getattr(args, "trace", False) and mode != "target":
        kw["trace"] = True      # every pass as the policy saw it, in the record's stats.trace
    return kw



# -- measuring ---------------------------------------------------------------
def measure(dec, prompt: Prompt, formatted: tuple[str, bool], mode: str, run: int, args,
            max_tokens: int | None = None) -> dict:
    text, add_special = formatted
    t0 = time.perf_counter()
    r = dec.generate(text, add_special=add_special, **gen_kwargs(args, mode, run, max_tokens, prompt))
    wall = time.perf_counter() - t0
    out = dict(prompt_id=prompt.id, category=prompt.category, mode=mode, run=run, time=now(),
               n_prompt=prompt_length(dec, text, add_special),
               tokens_per_second=r.stats.tokens_per_second, wall_seconds=wall, n_tokens=len(r.tokens),
               finish_reason=r.finish_reason, text=r.text, tokens=r.tokens, stats=r.stats.to_dict(),
               policy=policy_record(r.stats.raw), identical_to_target=None, first_difference=None)
    if mode == "target" or (out["policy"]["one_token"]["n"] or 0) < PACE_MIN_PASSES:
        probe = pace_probe(dec)
        if probe is not None:
            out["pace_probe"] = dict(n=PACE_PROBE_PASSES, seconds=probe)
    return out


def pace_probe(dec, n: int | None = None) -> float | None:
    """The machine's pace as a cell ends: the mean seconds of ``n`` (PACE_PROBE_PASSES)
    one-token target passes right after the generation, each at the end of its context and
    taken back (the decoder's state, and so what follows, unchanged); None where the context
    has no room for one more token or cannot take one back.  (A cell that runs few one-token
    passes of its own, as the speculative modes do where they propose at every pass, has no
    pace to read otherwise: a slow spell in it would pass for the mode's speed.)"""
    ctx = getattr(dec, "_target_ctx", None)
    if ctx is None:
        return None
    pos = ctx.n_past
    if pos < 1 or pos + 1 >= ctx.n_ctx:
        return None
    tok = [int(dec.tokenize(" the", add_special=False)[-1])]
    n = n or PACE_PROBE_PASSES
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            ctx.decode(tok)
            ctx.remove_from(pos)
    except RuntimeError:        # a memory that cannot drop its tail (a recurrent model): no probe
        return None             # (the next generation clears the context whatever it holds)
    return (time.perf_counter() - t0) / n


def prompt_length(dec, text: str, add_special: bool) -> int:
    """Tokens of a formatted prompt (what the draft model has to read before its first draft)."""
    return len(dec.tokenize(text, add_special=add_special))


def policy_record(raw: dict) -> dict:
    """What the policy saw in one generation, beyond the stats' counts (why it chose what it
    did): each proposer's calibration within the generation, the draft's looks, its passes
    and those of them that proposed nothing (a decode for no token), and the draft's
    acceptance as the policy reckoned it at the end (None without a draft model), the
    answer's copies from a prompt stretch a windowed draft skipped, whether the draft then
    read the whole prompt, and the share of it the draft left unread at the end; and the
    cost model as the generation left it (a one-token pass in seconds, each size measured so
    far and a draft token as multiples of it, the attention's seconds per query per cached
    token), which moves with every pass and so explains choices that the costs at the run's
    end do not; and the one-token target passes it ran, measured (how many, their mean
    seconds): the machine's pace during the generation, whatever was speculated."""
    times = raw.get("t_verify_est") or {}
    t1 = times.get(1) or 0.0
    td = raw.get("t_draft_token_est") or 0.0
    costs = dict(t1=t1 or None, verify={str(n): t / t1 for n, t in sorted(times.items())} if t1 else {},
                 draft=td / t1 if t1 and td else None, attn=raw.get("attn_time") or 0.0)
    return dict(calibration=dict(raw.get("calibration_by_source", {})),
                draft_looked=raw.get("n_draft_looked", 0), draft_steps=raw.get("n_draft_steps", 0),
                draft_empty=raw.get("n_draft_empty", 0),
                draft_expected=raw.get("draft_expected"), copied_unread=raw.get("n_copied_unread", 0),
                draft_read_all=bool(raw.get("draft_read_all", 0)), draft_read_all_at=raw.get("draft_read_all_at", -1),
                draft_first_at=raw.get("draft_first_at", -1),
                draft_unread=raw.get("draft_unread", 0.0),
                costs=costs, one_token=dict(n=raw.get("n_one_token", 0), seconds=raw.get("t_one_token")))


def compare_outputs(baseline: list[int], other: list[int]) -> int | None:
    """Index of the first token where ``other`` differs from ``baseline``; None if identical."""
    for i, (a, b) in enumerate(zip(baseline, other)):
        if a != b:
            return i
    return None if len(baseline) == len(other) else min(len(baseline), len(other))


def set_key(r: dict) -> tuple:
    """(prompt id, run, set): the measurements a record belongs with (a prompt measured again
    has a set of its own for each time, with its own target-alone times)."""
    return r["prompt_id"], r.get("run", 0), r.get("remeasure", 0)


def first_target_records(records: list[dict]) -> dict:
    """{(prompt id, run): the first target-alone record of it} (a second one, with
    ``repeat``, is the target alone timed again after the other modes)."""
    first: dict = {}
    for r in records:
        if r["mode"] == "target":
            first.setdefault((r["prompt_id"], r["run"]), r)
    return first


def check_equality(records: list[dict]) -> None:
    """Mark every speculative record against the target-alone record of its prompt and run
    (the first one: a second, timed after the other modes, is marked against it too, which
    checks that the target alone repeats itself)."""
    base = first_target_records(records)
    for r in records:
        ref = base.get((r["prompt_id"], r["run"]))
        if ref is not None and r is not ref:
            r["first_difference"] = compare_outputs(ref["tokens"], r["tokens"])
            r["identical_to_target"] = r["first_difference"] is None


def applies(mode: str, prompt: Prompt) -> bool:
    """Prediction mode runs only on prompts that carry a prediction."""
    return mode != "prediction" or prompt.prediction is not None


def first_turns(decoders, prompts, modes, args, say=lambda text: None) -> dict:
    """--multi-turn: the target alone answers each conversation's first turn (greedy, the
    same for every mode, so that turn-2 outputs stay comparable); a corpus decoder is given
    the first turn and its answer.  Returns prompt id -> the turn-2 (prompt, add_special)."""
    out = {}
    dec = decoders[modes[0]]
    for p in prompts:
        say(f"turn 1 {p.id}")
        first = format_prompt(dec, p.turns[0], args.chat_template)
        r = dec.generate(first[0], add_special=first[1], max_tokens=args.max_tokens, temperature=0.0,
                         speculative=False)
        if "corpus" in decoders and getattr(decoders["corpus"], "corpus", None) is not None:
            decoders["corpus"].corpus.add(first[0] + r.text)
        out[p.id] = format_prompt(dec, p.turns[1], args.chat_template, [p.turns[0], r.text])
    return out


def forget_warm_up(decoders) -> None:
    """Make each decoder forget what the warm-up generations taught it besides the
    machine's costs: the acceptance seen (the first prompt's opening tokens, the hardest to
    guess, would count twice against its proposers) and a corpus's documents (the warm-up's
    own output)."""
    for dec in decoders:
        dec.acceptance.reset()
        if getattr(dec, "corpus", None) is not None:
            dec.corpus.clear()


def brackets(modes, args) -> bool:
    """Whether each prompt's target-alone cell is timed twice, before and after the other
    modes (their speed-ups then compare with the mean of the two)."""
    return getattr(args, "bracket", True) and "target" in modes and len(modes) > 1


# A prompt whose two target-alone times (before and after its other cells) differ by more
# than this, as |log| of their ratio (about 5 %), ran while the machine's pace moved; so did
# one where a cell's one-token target passes (PACE_MIN_PASSES or more) ran that far from the
# target alone's: its cells are measured once more, after the run's other prompts.  (At 8 %
# a short answer's cell whose passes ran 5-6 % slow, with a lookup or two missed, read 0.90x;
# a calm machine's two times lie within 3-5 %, so 5 % flags about one prompt more in 21.)
NOISY_BRACKET = 0.05
NOISY_BRACKET_PCT = round(100 * (math.exp(NOISY_BRACKET) - 1))    # as the report and --help say it
PACE_MIN_PASSES = 8
# A cell with fewer one-token passes of its own than that is followed by this many (pace_probe),
# and so is each target-alone cell: the two compared as the passes are.
PACE_PROBE_PASSES = 6
# A prompt measured again whose second set was noisy too is measured a third time (no more):
# the median of three sets' speed-ups then leaves out the one farthest off, which the median
# of two (their mean) cannot.
MAX_REMEASURES = 2

# A prompt whose target-alone answer takes less than this many seconds to generate (a short
# answer: a translation, a one-line fact) is timed over about a second, in which this
# machine's pace moves by 5-10 % from one second to the next: its cells are measured in
# rounds, every mode in turn each round (with the bracket's second target-alone time), until
# the target alone's first cells add up to this (at most MAX_ROUNDS); each cell's rounds pool
# into one time, their tokens over their seconds (``pooled_rate``).
MIN_CELL_SECONDS = 2.5
MAX_ROUNDS = 4


def rounds_for(seconds: float | None, min_seconds: float = MIN_CELL_SECONDS) -> int:
    """Rounds for a prompt whose first cell generated in ``seconds`` (1: ``min_seconds`` 0,
    or no time measured)."""
    if not min_seconds or not seconds or seconds <= 0:
        return 1
    return max(1, min(MAX_ROUNDS, math.ceil(min_seconds / seconds - 1e-9)))


def policy_evidence(decoders) -> list:
    """(decoder, a copy of its acceptance model) for each of ``decoders`` (any iterable)."""
    return [(d, d.acceptance.copy()) for d in {id(d): d for d in decoders}.values()
            if getattr(d, "acceptance", None) is not None]


def restore_evidence(saved: list) -> None:
    """Put back what ``policy_evidence`` copied: a round after the first is measured from
    the evidence the first started from (not from what the same prompt just taught the
    policy, which no single request has), and the prompts after it find what one round
    would have left."""
    for d, acc in saved:
        d.acceptance.restore(acc)


def from_evidence(saved: list, decoders, fn) -> None:
    """``fn()`` from the policy's evidence ``saved`` (``policy_evidence``), ``decoders`` (any
    iterable) then holding what they held before.  A set measured again measures the same
    cells as the prompt's first set, so it starts from the evidence that set found, not from
    what the prompts after it taught the policy: after the edits' 128-token answers, a
    29-token translation's draft was started on its 52-token prompt where its first set had
    run the target alone (the sixty-second session's newcomer run: 0.84-0.91x against 1.0x)."""
    now = policy_evidence(decoders)
    restore_evidence(saved)
    try:
        fn()
    finally:
        restore_evidence(now)


def measure_in_rounds(decoders, one_round, min_seconds: float, on_rounds=lambda n: None) -> None:
    """``one_round(n)`` (it measures round n of a prompt's cells and returns the round's
    first record, or None) for n = 0, 1, ... up to ``rounds_for`` the first record's
    generation time (``on_rounds(n_rounds)`` once that is known); each round after the first
    from the evidence the first started from, and afterwards ``decoders`` hold what the
    first left (``from_evidence``)."""
    decoders = list(decoders)
    start = policy_evidence(decoders)
    first = one_round(0)
    if first is None:
        return
    n_rounds = rounds_for(first["stats"]["t_generate"], min_seconds)
    on_rounds(n_rounds)
    for n in range(1, n_rounds):
        from_evidence(start, decoders, lambda: one_round(n))


def cell_key(r: dict) -> tuple:
    """What one cell of a set is: its mode (and a sweep's setting), and whether it is the
    bracket's second target-alone time; a cell measured in rounds has one record a round."""
    return r["mode"], r.get("setting"), bool(r.get("repeat"))


def pooled_rate(rs: list[dict]) -> float | None:
    """Tokens per second of one cell over its rounds' records: their tokens over their
    seconds (one record: its own rate); None where none has a rate."""
    rs = [r for r in rs if r["tokens_per_second"]]
    if len(rs) <= 1:
        return rs[0]["tokens_per_second"] if rs else None
    n = [max(1, len(r.get("tokens") or ())) for r in rs]
    return sum(n) / sum(k / r["tokens_per_second"] for k, r in zip(n, rs))


def set_cells(records: list[dict]) -> dict:
    """{set_key: {cell_key: [records, one a round]}}."""
    out: dict = {}
    for r in records:
        out.setdefault(set_key(r), {}).setdefault(cell_key(r), []).append(r)
    return out


def one_token_seconds(rs: list[dict]) -> float | None:
    """The mean one-token target pass of some records (a cell's rounds; a category's cells,
    for the advice), where they ran PACE_MIN_PASSES of them or more."""
    ones = [(r.get("policy") or {}).get("one_token") or {} for r in rs]
    ones = [(o.get("n") or 0, o.get("seconds")) for o in ones]
    n = sum(k for k, t in ones if k and t)
    return sum(k * t for k, t in ones if k and t) / n if n >= PACE_MIN_PASSES else None


def _probe_seconds(rs: list[dict]) -> float | None:
    """The mean of a cell's records' pace probes (``pace_probe``), None without one."""
    ps = [r["pace_probe"]["seconds"] for r in rs if (r.get("pace_probe") or {}).get("seconds")]
    return sum(ps) / len(ps) if ps else None


def cell_pace(rs: list[dict], kind: str | None = None) -> tuple[str, float] | None:
    """What says how fast the machine ran one cell (its rounds' records): ("passes", the
    mean of its one-token target passes) where it ran PACE_MIN_PASSES of them, else
    ("probe", its pace probes' mean), else None; ``kind`` "passes" or "probe": that one
    only."""
    t = one_token_seconds(rs) if kind in (None, "passes") else None
    if t:
        return "passes", t
    t = _probe_seconds(rs) if kind in (None, "probe") else None
    return ("probe", t) if t else None


def _off_pace(ref: list, paces) -> bool:
    """Whether any of ``paces`` (seconds, or None) lies more than NOISY_BRACKET from the mean
    of ``ref``, the two target-alone cells' (False unless both are there)."""
    if len(ref) != 2 or not all(ref):
        return False
    pace = sum(ref) / 2
    return any(p and abs(math.log(p / pace)) > NOISY_BRACKET for p in paces)


def noisy_prompts(records: list[dict], run: int, measured_set: int = 0) -> list[str]:
    """Ids of the prompts of ``run`` whose bracket's two target-alone times differ by more
    than NOISY_BRACKET, or one of whose cells ran its one-token passes that far from the
    bracket's, or, a cell with too few of them, whose pace probe read that far from the
    bracket's probes, in ``measured_set`` (0: the first measurements; n: the n-th time
    measured again); a cell measured in rounds counts as its rounds pooled."""
    sets = set_cells([r for r in records if r["run"] == run and r.get("remeasure", 0) == measured_set])
    out = []
    for (pid, _, _), cells in sets.items():
        # (the first time, then the bracket's second)
        ts = [pooled_rate(rs) for key, rs in sorted(cells.items(), key=lambda kv: kv[0][2]) if key[0] == "target"]
        if len(ts) != 2 or not all(ts):
            continue
        moved = abs(math.log(ts[1] / ts[0])) > NOISY_BRACKET
        # each cell's pace by its one-token passes (the target-alone cells' own among them), or,
        # a cell with too few of them, by its probe against the target-alone cells' probes
        paces = {key: one_token_seconds(rs) for key, rs in cells.items()}
        probes = {key: _probe_seconds(rs) for key, rs in cells.items() if key[0] != "target" and not paces[key]}
        targets = [key for key in cells if key[0] == "target"]
        moved = (moved or _off_pace([paces[k] for k in targets], paces.values())
                 or _off_pace([_probe_seconds(cells[k]) for k in targets], probes.values()))
        if moved:
            out.append(pid)
    return out


def mark_noisy(records: list[dict], run: int, measured_set: int) -> set[str]:
    """``noisy_prompts`` of ``run``'s ``measured_set``, their records there marked ``noisy``
    (``report.prompt_speedups`` leaves such a set out where a calm one was measured)."""
    noisy = set(noisy_prompts(records, run, measured_set))
    for r in records:
        if r["run"] == run and r.get("remeasure", 0) == measured_set and r["prompt_id"] in noisy:
            r["noisy"] = 1
    return noisy


def measure_noisy_again(records: list[dict], run: int, prompts, cells, on_again=lambda again: None) -> None:
    """After ``run``'s first set: the prompts noisy there (``mark_noisy`` over ``records``,
    which ``cells`` extends) measured again by ``cells(prompt, n)``, set n = 1 ..
    MAX_REMEASURES, each time those still noisy in the set before; ``on_again(prompts)``
    before each set (progress totals).  The last set's noisy records are marked too."""
    for n in range(1, MAX_REMEASURES + 1):
        noisy = mark_noisy(records, run, n - 1)
        again = [p for p in prompts if p.id in noisy]
        on_again(again)
        for p in again:
            cells(p, n)
    mark_noisy(records, run, MAX_REMEASURES)


def remeasures(modes, args) -> bool:
    """Whether noisy prompts are measured again: with a bracket, and not where a decoder keeps
    a corpus of its earlier outputs (it would find the prompt's own answer there)."""
    return brackets(modes, args) and getattr(args, "remeasure", True) and "corpus" not in modes


def template_head(dec, use_template: bool) -> list[int]:
    """The tokens every formatted prompt opens with (the chat template's system turn and the
    user turn's opening, as an empty message formats them; nothing much for raw text): what a
    decoder's draft cache holds of a prompt after another one."""
    text, add_special = format_prompt(dec, "", use_template)
    return dec.tokenize(text, add_special=add_special)


def forget_prompt(decoders, head=()) -> None:
    """Leave the draft cache of each of ``decoders`` (any iterable) holding what a prompt finds
    there after another prompt: its common prefix with ``head`` (``template_head``), nothing else.  The cells of a prompt
    take turns on one decoder (draft then combined mode), and a prompt measured again may
    follow itself: without this a cell would find the draft's reading of its prompt done by
    the cell before, a prefill no single request gets for free."""
    for dec in {id(d): d for d in decoders}.values():
        ctx = getattr(dec, "_draft_ctx", None)
        if ctx is not None:
            ctx.keep_prefix(list(head))


def run_bench(decoders, prompts, modes, args, records, on_prompt) -> None:
    """Per run and prompt, every mode in turn on one decoder each; with ``brackets``, the
    target alone once more after the others.  A machine whose pace drifts over the half
    minute a prompt's cells take then moves the baseline with the cells it is compared
    with, and the two target-alone times show how far one cell moves by the machine alone.
    With ``remeasures``, the prompts whose two times differ by more than NOISY_BRACKET, or
    with a cell whose one-token passes ran that far from them (``noisy_prompts``), are
    measured again after the run's other prompts (records marked ``remeasure``: 1), and those
    still noisy there once more (``remeasure``: 2, up to MAX_REMEASURES), each time from the
    policy's evidence as the prompt's first set found it; the records of a set found noisy
    are marked ``noisy``.  A short answer's set is measured in rounds
    (``rounds_for``; each cell's rounds pooled).  Each prompt's speed-up is then the median of its
    calm sets' (of all its sets' where none was calm), each set's cells against that set's
    own target-alone times (``report.prompt_speedups``)."""
    multi = getattr(args, "multi_turn", False)
    twice = brackets(modes, args)
    total = len(modes) * (1 + args.runs * len(prompts)) + (len(prompts) if multi else 0) \
        + (args.runs * len(prompts) if twice else 0)
    with progress("fastspec.bench", 36, args.quiet) as bar:
        task = bar.add_task("warm-up", total=total)
        # warm-up: load weights into caches, let threads spin up, measure the costs (on the
        # first turn: with --multi-turn, nothing measured later is generated here)
        for mode in modes:
            bar.update(task, description=f"warm-up {mode}")
            first = next((p for p in prompts if applies(mode, p)), None)
            if first is not None:
                measure(decoders[mode], first, format_prompt(decoders[mode], first.text, args.chat_template),
                        mode, 0, args, min(16, args.max_tokens))
            bar.advance(task)
        forget_warm_up(set(decoders.values()))
        if multi:
            formatted = first_turns(decoders, prompts, modes, args,
                                    lambda text: (bar.update(task, description=text), bar.advance(task)))
        else:
            formatted = {p.id: format_prompt(decoders[modes[0]], p.text, args.chat_template) for p in prompts}

        head = template_head(decoders[modes[0]], args.chat_template)

        order = [(m, False) for m in modes] + ([("target", True)] if twice else [])
        shared = [decoders[m] for m in modes]
        # no rounds where a decoder keeps a corpus of its earlier outputs (a round would find
        # the prompt's own answer there, as a set measured again would: ``remeasures``)
        min_seconds = getattr(args, "min_cell_seconds", MIN_CELL_SECONDS) if "corpus" not in modes else 0.0

        def cells(p: Prompt, run: int, label: str, **marks) -> None:
            """The prompt's cells: every mode, then (with a bracket) the target alone again;
            each finds the draft's cache as after another prompt (``forget_prompt``).  A
            short answer's cells (``rounds_for`` its first cell's generation time) are
            measured in rounds, each round every cell in that order (records marked
            ``round``: 1, 2, ...), each round from the policy's evidence as the first
            found it, the prompts after it finding what the first left (``restore_evidence``)."""
            def one_round(n):
                first = None
                for mode, repeat in order:
                    again = f" round {n + 1}" if n else ""
                    bar.update(task, description=f"{label} {p.id} {'target again' if repeat else mode}{again}")
                    if applies(mode, p):
                        forget_prompt([decoders[mode]], head)
                        rec = measure(decoders[mode], p, formatted[p.id], mode, run, args)
                        rec.update(marks)
                        if repeat:
                            rec["repeat"] = 1
                        if n:
                            rec["round"] = n
                        if multi:
                            rec["turn"] = 2
                        records.append(rec)
                        first = first or rec
                    bar.advance(task)
                return first

            def more_rounds(n_rounds):
                nonlocal total
                total += (n_rounds - 1) * len(order)
                bar.update(task, total=total)
            measure_in_rounds(shared, one_round, min_seconds, more_rounds)
            if args.temperature == 0:
                check_equality(records)
            on_prompt()

        corpus = getattr(decoders.get("corpus"), "corpus", None)
        first_docs = corpus.documents if corpus is not None else None
        for run in range(args.runs):
            label = f"run {run + 1}/{args.runs}"
            if run and corpus is not None:
                # each run starts from the first turns alone: the runs before would have left
                # every prompt's own answer in the corpus
                corpus.clear()
                for doc in first_docs:
                    corpus.add(doc)
            again_too = remeasures(modes, args)
            first_found = {}
            for p in prompts:
                if again_too:
                    first_found[p.id] = policy_evidence(shared)
                cells(p, run, label)
            if again_too:
                def more(again):
                    nonlocal total
                    total += len(again) * len(order)
                    bar.update(task, total=total)

                def cells_again(p: Prompt, n: int) -> None:
                    from_evidence(first_found[p.id], shared, lambda: cells(
                        p, run, f"{label} again" if n == 1 else f"{label} again ({n})", remeasure=n))
                measure_noisy_again(records, run, prompts, cells_again, more)
