"""python -m fastspec.bench on tiny models: the JSON it writes, prompt formats, the greedy
equality check, --show, and bad input (clear message, non-zero exit, nothing measured)."""
import json
import os
import re

import pytest

import fastspec
from fastspec import bench
from fastspec.bench import cli, report, runner

SPEC_BENCH = {"question_id": 81, "category": "writing", "turns": ["hello world the quick brown fox", "again"]}
PLAIN = {"prompt": "once upon a time there was", "category": "story"}
BARE = {"prompt": "the dog is not amused"}


def write_jsonl(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


@pytest.fixture
def prompts_file(tmp_path):
    return write_jsonl(tmp_path / "small.jsonl", [SPEC_BENCH, "", PLAIN, BARE])


@pytest.fixture
def base_args(bpe_pair, prompts_file):
    target, same, _ = bpe_pair
    # --no-remeasure: a tiny model's cells are so short that timing noise would have some
    # prompts measured again (test_a_prompt_whose_target_times_moved_is_measured_again);
    # --min-cell-seconds 0: and every one measured in rounds (test_a_short_answer_is_measured_in_rounds)
    return ["--target", str(target), "--draft", str(same), "--prompts", str(prompts_file),
            "--max-tokens", "16", "--threads", "1", "--ctx", "512", "--no-remeasure", "--min-cell-seconds", "0"]


def test_end_to_end_writes_complete_json(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    # a fixed draft length: with "auto", a draft as slow as its target (these twins) is not run
    assert bench.main(base_args + ["--out", str(out), "--quiet", "--runs", "2", "--n-draft", "4"]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == bench.SCHEMA and data["status"] == "complete"
    assert data["started_at"] and data["finished_at"] and "load_average_at_end" in data
    assert "busy_cpus_at_start" in data["environment"]
    assert data["settings"]["max_tokens"] == 16 and data["settings"]["modes"] == list(runner.BASIC_MODES)
    env = data["environment"]
    for key in ("fastspec_version", "llama_cpp_commit", "system_info", "platform", "cpu_count", "target",
                "draft", "n_threads"):
        assert env[key], key
    assert isinstance(env["target"]["use_mmap"], bool) and isinstance(env["draft"]["use_mmap"], bool)
    assert env["transparent_hugepage"] in ("always", "madvise", "never", None)
    assert [p["id"] for p in data["prompts"]] == ["81", "story-3", "uncategorised-4"]
    meas = data["measurements"]
    # every mode per prompt and run, then the target alone once more (the bracket)
    assert len(meas) == 3 * (len(runner.BASIC_MODES) + 1) * 2
    assert [m["mode"] for m in meas[:5]] == [*runner.BASIC_MODES, "target"] and meas[4]["repeat"] == 1
    for m in meas:
        assert m["n_tokens"] == len(m["tokens"]) > 0 and m["tokens_per_second"] > 0
        assert m["stats"]["n_generated"] == m["n_tokens"] and isinstance(m["text"], str)
        # the first target-alone output is the reference; the repeat is checked against it
        assert m["identical_to_target"] is (None if m["mode"] == "target" and not m.get("repeat") else True)
        assert set(m["policy"]["calibration"]) >= {"draft", "lookup"}
        assert all(0.0 < c <= 1.0 for c in m["policy"]["calibration"].values())
        e = m["policy"]["draft_expected"]
        assert (e is None) if m["mode"] in ("target", "lookup", "prediction") else (0.0 < e < 1.0)
        assert m["policy"]["copied_unread"] >= 0 and isinstance(m["policy"]["draft_read_all"], bool)
        assert (m["policy"]["draft_read_all_at"] >= 0) == m["policy"]["draft_read_all"]
        # the draft model first ran at some token, where it ran at all
        assert (m["policy"]["draft_first_at"] >= 0) == (m["policy"]["draft_steps"] > 0)
        one = m["policy"]["one_token"]       # the target alone's passes are all one-token passes
        assert (one["n"] == m["stats"]["n_target_passes"]) if m["mode"] == "target" else (one["n"] >= 0)
        assert (one["seconds"] > 0) if one["n"] else one["seconds"] is None
        costs = m["policy"]["costs"]
        if m["mode"] != "target":   # an adaptive generation: the costs it ended with
            assert costs["t1"] > 0 and costs["verify"]["1"] == 1.0
            assert all(r > 0 for r in costs["verify"].values())
            assert (costs["draft"] is None) if m["mode"] in ("lookup", "prediction") else costs["draft"] > 0
    # the identical draft has every proposal accepted
    draft = data["summary"]["overall"]["draft"]
    assert draft["acceptance_rate"] == 1.0 and draft["mean_accepted_length"] > 1.5
    assert draft["n_identical"] == draft["n_compared"] == 6 and draft["speedup"] > 0
    assert set(data["summary"]["by_category"]) == {"writing", "story", "uncategorised"}
    assert data["summary"]["mismatches"] == []
    rep = data["summary"]["target_repeat"]
    assert rep["overall"]["n"] == 6 and rep["overall"]["min"] <= rep["overall"]["median"] <= rep["overall"]["max"]
    assert rep["overall"]["farthest_prompt"] in {"81", "story-3", "uncategorised-4"}
    assert {c: r["n"] for c, r in rep["by_category"].items()} == {"writing": 2, "story": 2, "uncategorised": 2}
    assert "18/18 outputs identical" in capsys.readouterr().out


def test_speedups_are_against_both_target_times(tmp_path):
    """With the bracket, a prompt's baseline is the mean of its two target-alone times, and the
    spread of the two is reported; without a repeat there is nothing to report."""
    def rec(mode, tps, repeat=0):
        r = dict(prompt_id="p", category="c", mode=mode, run=0, tokens=[1, 2], tokens_per_second=tps,
                 identical_to_target=None, first_difference=None,
                 stats=dict(n_generated=2, t_generate=2 / tps, n_drafted=0, n_accepted=0, n_target_passes=2,
                            theoretical_speedup=None, alpha=None))
        if repeat:
            r["repeat"] = 1
        return r
    recs = [rec("target", 10.0), rec("draft", 12.0), rec("target", 14.0, repeat=1)]
    summary = bench.summarise(recs, ["target", "draft"])
    assert summary["overall"]["draft"]["speedup"] == pytest.approx(1.0)      # 12 against (10 + 14) / 2
    assert summary["target_repeat"]["overall"] == dict(n=1, median=1.4, min=1.4, max=1.4,
                                                       farthest_prompt="p", farthest=1.4)
    assert "1.40–1.40x its first time" in report.repeat_line(summary)
    single = bench.summarise(recs[:2], ["target", "draft"])
    assert single["overall"]["draft"]["speedup"] == pytest.approx(1.2)
    assert single["target_repeat"]["overall"] is None and report.repeat_line(single) is None


def test_the_paced_read_takes_the_machines_pace_out():
    """Beside the plain speed-up, the paced one: each cell's ratio times how much slower its
    one-token target passes ran than its set's target alone's (a cell with too few of them:
    its pace probe against theirs; neither: the plain ratio); the report names a category
    where the two lie 3 % or more apart and either is below 1x."""
    def rec(pid, mode, tps, ms=None, n=20, probe=None, repeat=0):
        r = dict(prompt_id=pid, category="c", mode=mode, run=0, tokens=[1] * 20, tokens_per_second=tps,
                 identical_to_target=None, first_difference=None,
                 policy=dict(one_token=dict(n=n, seconds=ms and ms / 1e3)),
                 stats=dict(n_generated=20, t_generate=20 / tps, n_drafted=0, n_accepted=0, n_target_passes=20,
                            theoretical_speedup=None, alpha=None))
        if probe:
            r["pace_probe"] = dict(n=runner.PACE_PROBE_PASSES, seconds=probe / 1e3)
        if repeat:
            r["repeat"] = 1
        return r
    recs = [rec("p", "target", 10.0, 20.0, probe=20.0), rec("p", "draft", 9.0, 22.0),
            rec("p", "lookup", 12.0, None, n=0, probe=24.0), rec("p", "target", 10.0, 20.0, probe=20.0, repeat=1),
            rec("q", "target", 10.0, 20.0), rec("q", "draft", 9.0, None, n=0), rec("q", "lookup", 9.0, 10.0, n=3),
            rec("q", "target", 10.0, 20.0, repeat=1)]
    speed = report.prompt_speedups([r for r in recs if r["mode"] == "draft"], [r for r in recs if r["mode"] == "target"])
    paced = report.prompt_speedups([r for r in recs if r["mode"] == "draft"], [r for r in recs if r["mode"] == "target"],
                                   paced=True)
    assert speed == pytest.approx(dict(p=0.9, q=0.9))
    assert paced == pytest.approx(dict(p=0.99, q=0.9))          # q's draft cell: no pace of its own
    look = report.prompt_speedups([r for r in recs if r["mode"] == "lookup"], [r for r in recs if r["mode"] == "target"],
                                  paced=True)
    assert look == pytest.approx(dict(p=1.2 * 1.2, q=0.9))      # p by its probe; q's 3 passes are too few
    summary = bench.summarise(recs, ["target", "draft", "lookup"])
    assert summary["overall"]["draft"]["speedup_paced"] == pytest.approx((0.99 * 0.9) ** 0.5)
    line = report.paced_line(summary)
    assert "c draft 0.90x → 0.94x" in line and "lookup" not in line.split(":", 2)[-1]


def test_a_short_answer_is_measured_in_rounds(base_args, tmp_path, capsys, monkeypatch):
    """A prompt whose first cell generates in under --min-cell-seconds has its cells measured
    in rounds (up to MAX_ROUNDS), every mode in turn each round with the bracket's second
    target-alone time, each round's records marked ``round``, each checked against the
    target alone's first output; the summary pools each cell's rounds.  The tiny models'
    cells take milliseconds: an hour asks for every round there is."""
    args = [a for a in base_args if a not in ("--min-cell-seconds", "0")]
    out = tmp_path / "x.json"
    seen = []                   # the draft decoder's evidence as each generation starts
    real = runner.measure

    def spy(dec, *a, **kw):
        seen.append(dec.acceptance.counts())
        return real(dec, *a, **kw)
    monkeypatch.setattr(runner, "measure", spy)
    assert bench.main(args + ["--out", str(out), "--modes", "target,draft", "--n-draft", "4",
                              "--min-cell-seconds", "3600"]) == 0
    meas = json.loads(out.read_text())["measurements"]
    rounds, seen[:] = seen[2:], []              # (after the two warm-ups)
    assert bench.main(args + ["--out", str(tmp_path / "once.json"), "--modes", "target,draft", "--n-draft", "4",
                              "--min-cell-seconds", "0", "--quiet"]) == 0
    once = seen[2:]
    # each round starts from the evidence the first started from, and the next prompt finds
    # what one round left: as if each prompt had been measured once
    assert len(rounds) == 36 and len(once) == 9
    for i in range(3):
        mine = rounds[12 * i:12 * (i + 1)]
        assert mine == mine[:3] * 4 and mine[:3] == once[3 * i:3 * (i + 1)]
    assert any(c for c in once)                 # (the draft's evidence is there to compare)
    order = ["target", "draft", "target"]
    assert runner.MAX_ROUNDS == 4 and len(meas) == 3 * runner.MAX_ROUNDS * len(order)
    for i, pid in enumerate(["81", "story-3", "uncategorised-4"]):
        mine = meas[i * 12:(i + 1) * 12]
        assert {m["prompt_id"] for m in mine} == {pid} and [m["mode"] for m in mine] == order * 4
        assert [m.get("round", 0) for m in mine] == [n for n in range(4) for _ in order]
        assert [bool(m.get("repeat")) for m in mine] == [False, False, True] * 4
        assert all(m["identical_to_target"] is True for m in mine[1:])
    summary = json.loads(out.read_text())["summary"]
    assert summary["overall"]["draft"]["n_compared"] == 12
    assert summary["target_repeat"]["overall"]["n"] == 3          # one per prompt: its rounds pooled
    assert summary["rounds"] == {"81": 4, "story-3": 4, "uncategorised-4": 4}
    assert "short answers, each mode measured in rounds" in capsys.readouterr().out
    # the default: a second-long answer gets rounds enough for MIN_CELL_SECONDS; a long one none
    assert runner.rounds_for(0.9) == 3 and runner.rounds_for(0.3) == runner.MAX_ROUNDS
    assert runner.rounds_for(2.5) == runner.rounds_for(7.0) == 1
    assert runner.rounds_for(0.9, 0.0) == runner.rounds_for(None) == runner.rounds_for(0.0) == 1


def test_rounds_follow_the_first_cell_alone(base_args, tmp_path, monkeypatch):
    """The number of rounds comes from the prompt's first cell (the target alone's): a long
    answer whose speculative cells run fast is measured once."""
    real = runner.measure

    def timed(dec, prompt, formatted, mode, *a, **kw):
        rec = real(dec, prompt, formatted, mode, *a, **kw)
        rec["stats"]["t_generate"] = {"target": 3.0, "draft": 0.5}[mode] if prompt.id != "81" else 1.0
        return rec
    monkeypatch.setattr(runner, "measure", timed)
    args = [a for a in base_args if a not in ("--min-cell-seconds", "0")]
    out = tmp_path / "x.json"
    assert bench.main(args + ["--out", str(out), "--modes", "target,draft", "--n-draft", "4", "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert [m["prompt_id"] for m in data["measurements"]] == ["81"] * 9 + ["story-3"] * 3 + ["uncategorised-4"] * 3
    assert data["summary"]["rounds"] == {"81": 3}


@pytest.mark.parametrize("bad", ["-1", "x", "nan", "1e9"])
def test_bad_min_cell_seconds_is_refused(base_args, bad, capsys):
    assert bench.main(base_args + ["--min-cell-seconds", bad]) == 2
    assert "--min-cell-seconds" in capsys.readouterr().err


def test_a_cell_measured_in_rounds_is_its_rounds_pooled():
    """Each cell's rounds pool into one rate (tokens over seconds) before the cell is set
    against its bracket; a bracket whose single rounds lie far apart but whose pooled times
    agree is calm (noisy_prompts); the target alone's repeat spread compares pooled times."""
    def rec(mode, tps, n=2, **marks):
        return dict(prompt_id="p", category="c", mode=mode, run=0, tokens=list(range(n)), tokens_per_second=tps,
                    identical_to_target=None, first_difference=None,
                    stats=dict(n_generated=n, t_generate=n / tps, n_drafted=0, n_accepted=0, n_target_passes=n,
                               theoretical_speedup=None, alpha=None), **marks)
    # two rounds: the target alone's first time 10 then 20 tok/s (pooled: 4 tokens in 0.3 s),
    # its second 20 then 10 (the same); the draft's 20 and 20
    recs = [rec("target", 10.0), rec("draft", 20.0), rec("target", 20.0, repeat=1),
            rec("target", 20.0, round=1), rec("draft", 20.0, round=1), rec("target", 10.0, repeat=1, round=1)]
    assert runner.pooled_rate(recs[:1]) == 10.0 and runner.pooled_rate([]) is None
    assert runner.pooled_rate([recs[0], recs[3]]) == pytest.approx(40 / 3)
    # tokens weigh: 6 tokens at 10 tok/s and 2 at 20 are 8 tokens in 0.7 s
    assert runner.pooled_rate([rec("draft", 10.0, n=6), rec("draft", 20.0)]) == pytest.approx(8 / 0.7)
    summary = bench.summarise(recs, ["target", "draft"])
    assert summary["overall"]["draft"]["speedup"] == pytest.approx(20 / (40 / 3))
    assert summary["overall"]["target"]["speedup"] == pytest.approx(1.0)
    assert summary["target_repeat"]["overall"]["n"] == 1
    assert summary["target_repeat"]["overall"]["median"] == pytest.approx(1.0)
    assert runner.noisy_prompts(recs, 0) == []
    # unpooled, the single rounds' 10 against 20 would have made it noisy
    assert runner.noisy_prompts(recs[:3], 0) == ["p"]
    # the one-token passes' pace pools over rounds too: two rounds of 5 passes make the 8 needed
    def paced(r, n, secs):
        r["policy"] = dict(one_token=dict(n=n, seconds=secs))
        return r
    calm = [paced(rec("target", 10.0), 5, 0.1), paced(rec("draft", 10.0), 5, 0.2),
            paced(rec("target", 10.0, repeat=1), 5, 0.1), paced(rec("target", 10.0, round=1), 5, 0.1),
            paced(rec("draft", 10.0, round=1), 5, 0.2), paced(rec("target", 10.0, repeat=1, round=1), 5, 0.1)]
    assert runner.noisy_prompts(calm, 0) == ["p"]        # the draft cell's passes ran at half the pace
    assert runner.noisy_prompts([r for r in calm if not r.get("round")], 0) == []   # 5 passes: too few to tell


def test_each_set_of_a_prompt_measured_again_compares_with_its_own_target_times():
    """A prompt measured again has two sets of cells, each bracketed by its own target-alone
    times: each cell is compared with the times of its set (and run), and the prompt's
    speed-up is the median of those ratios, not a median of cells over a median of brackets
    (which would set a cell run at a slow pace against a fast set's times)."""
    def rec(mode, tps, run=0, **marks):
        return dict(prompt_id="p", category="c", mode=mode, run=run, tokens=[1, 2], tokens_per_second=tps,
                    identical_to_target=None, first_difference=None,
                    stats=dict(n_generated=2, t_generate=2 / tps, n_drafted=0, n_accepted=0, n_target_passes=2,
                               theoretical_speedup=None, alpha=None), **marks)
    # the first set ran at half the pace of the second; the draft matched the target in both
    recs = [rec("target", 10.0), rec("draft", 10.0), rec("target", 10.0, repeat=1),
            rec("target", 20.0, remeasure=1), rec("draft", 20.0, remeasure=1),
            rec("target", 20.0, repeat=1, remeasure=1)]
    summary = bench.summarise(recs, ["target", "draft"])
    assert summary["overall"]["draft"]["speedup"] == pytest.approx(1.0)
    assert report.prompt_speedups([r for r in recs if r["mode"] == "draft"],
                                  [r for r in recs if r["mode"] == "target"]) == {"p": pytest.approx(1.0)}
    # runs likewise: each run's cells against that run's times; the median over them
    runs = [rec("target", 10.0), rec("draft", 11.0), rec("target", 30.0, run=1), rec("draft", 39.0, run=1),
            rec("target", 20.0, run=2), rec("draft", 24.0, run=2)]
    assert bench.summarise(runs, ["target", "draft"])["overall"]["draft"]["speedup"] == pytest.approx(1.2)
    # a cell whose set has no target-alone time compares with all of its prompt's
    lone = [rec("target", 10.0), rec("target", 14.0, repeat=1), rec("draft", 24.0, remeasure=1)]
    assert bench.summarise(lone, ["target", "draft"])["overall"]["draft"]["speedup"] == pytest.approx(2.0)
    # a set the bench found noisy counts only where no calm one was measured
    sets = [rec("target", 20.0, noisy=1), rec("draft", 10.0, noisy=1), rec("target", 20.0, repeat=1, noisy=1),
            rec("target", 20.0, remeasure=1), rec("draft", 22.0, remeasure=1),
            rec("target", 20.0, repeat=1, remeasure=1)]
    assert bench.summarise(sets, ["target", "draft"])["overall"]["draft"]["speedup"] == pytest.approx(1.1)
    for r in sets:
        r["noisy"] = 1
    assert bench.summarise(sets, ["target", "draft"])["overall"]["draft"]["speedup"] == pytest.approx(0.8)


def test_a_prompt_whose_target_times_moved_is_measured_again(base_args, tmp_path, capsys, monkeypatch):
    """Where a prompt's two target-alone times are more than NOISY_BRACKET apart, its cells are
    measured once more after the run's other prompts, each marked ``remeasure``; its speed-ups
    are the median over both sets', and the two sets' brackets are each their own repeat.  Here
    every prompt counts as noisy.  Every cell finds the draft's cache holding no more of its
    prompt than the template's head (``forget_prompt``), also a prompt measured right after
    itself.  A set measured again starts from the policy's evidence as the prompt's first set
    found it (not from what the prompts after it taught the policy), and the decoders then
    hold what they held before it."""
    forget = runner.forget_prompt
    monkeypatch.setattr(runner, "NOISY_BRACKET", -1.0)
    seen = []

    def forget_and_look(decs, head=()):
        forget(decs, head)
        seen.extend((len(head), d._draft_ctx.n_past) for d in decs if d._draft_ctx is not None)
    monkeypatch.setattr(runner, "forget_prompt", forget_and_look)
    found = []                  # (prompt, mode, the draft decoder's evidence) as each cell starts
    measure, close = runner.measure, runner.close_decoders

    def evidence(dec):
        return dec.acceptance.counts(), dec.acceptance.mean_length

    def spy(dec, prompt, *a, **kw):
        if dec.draft_model is not None:
            found.append((prompt.id, a[1], evidence(dec)))
        return measure(dec, prompt, *a, **kw)

    def close_and_look(decs):
        found.append(("closed", None, evidence(next(d for d in decs.values() if d.draft_model is not None))))
        close(decs)
    monkeypatch.setattr(runner, "measure", spy)
    monkeypatch.setattr(cli, "close_decoders", close_and_look)
    args = [a for a in base_args if a != "--no-remeasure"] + ["--n-draft", "4"]
    out = tmp_path / "x.json"
    assert bench.main(args + ["--out", str(out)]) == 0
    # target, draft and combined share the decoder with the draft: 3 prompts x 3 sets x 4 cells
    assert len(seen) == 3 * 3 * 4 and all(n <= h for h, n in seen)
    found = found[3:]           # (after the warm-ups: target, draft, combined)
    assert len(found) == 3 * 3 * 4 + 1
    starts = [found[i] for i in range(0, 36, 4)]       # each set's first cell: the target alone's
    assert [(pid, mode) for pid, mode, _ in starts] == [(pid, "target") for pid in ["81", "story-3", "uncategorised-4"] * 3]
    assert len({repr(e) for _, _, e in starts[:3]}) == 3         # (each prompt taught the policy)
    assert [e for _, _, e in starts[3:6]] == [e for _, _, e in starts[:3]] == [e for _, _, e in starts[6:]]
    assert found[-1][0] == "closed"
    data = json.loads(out.read_text())
    meas = data["measurements"]
    per_set = len(runner.BASIC_MODES) + 1
    # noisy every time: measured again, and once more (MAX_REMEASURES), never a fourth time
    assert runner.MAX_REMEASURES == 2 and len(meas) == 3 * 3 * per_set
    assert not any(m.get("remeasure") for m in meas[:3 * per_set])
    again, third = meas[3 * per_set:6 * per_set], meas[6 * per_set:]
    assert all(m["remeasure"] == 1 for m in again) and all(m["remeasure"] == 2 for m in third)
    assert [m["prompt_id"] for m in again[::per_set]] == ["81", "story-3", "uncategorised-4"]
    assert [m["prompt_id"] for m in third[::per_set]] == ["81", "story-3", "uncategorised-4"]
    assert [m["mode"] for m in again[:per_set]] == [*runner.BASIC_MODES, "target"] and again[per_set - 1]["repeat"]
    assert all(m["identical_to_target"] is True for m in again[1:per_set] + third[1:per_set])
    summary = data["summary"]
    assert summary["remeasured"] == summary["remeasured_twice"] == ["81", "story-3", "uncategorised-4"]
    assert all(m["noisy"] == 1 for m in meas)       # every set found noisy, the third too
    assert summary["target_repeat"]["overall"]["n"] == 9      # each set's own two times
    assert summary["overall"]["draft"]["n_compared"] == 9
    assert "81 (twice)" in capsys.readouterr().out
    # one prompt, measured again right after itself (twice): its draft's reading not kept either
    seen.clear()
    assert bench.main(args + ["--out", str(out), "--categories", "story", "--quiet"]) == 0
    assert len(json.loads(out.read_text())["measurements"]) == 3 * per_set
    assert len(seen) == 3 * 4 and all(n <= h for h, n in seen)


def test_from_evidence_runs_from_what_was_saved_and_puts_back_what_was_there():
    """``runner.from_evidence``: the call sees the policy's evidence as it was saved, and the
    decoders then hold what they held before the call, also where it raised."""
    from types import SimpleNamespace
    from fastspec._core import AcceptanceModel
    dec = SimpleNamespace(acceptance=AcceptanceModel())
    dec.acceptance.record_length(10)
    saved = runner.policy_evidence([dec, dec])          # (one decoder named twice: one copy)
    assert len(saved) == 1
    dec.acceptance.record_length(100)
    before = dec.acceptance.mean_length
    assert before != 10.0
    seen = []

    def run():
        seen.append(dec.acceptance.mean_length)
        dec.acceptance.record_length(1000)              # what the call teaches is not kept
    runner.from_evidence(saved, [dec], run)
    assert seen == [10.0] and dec.acceptance.mean_length == before

    def fail():
        dec.acceptance.record_length(1000)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        runner.from_evidence(saved, [dec], fail)
    assert dec.acceptance.mean_length == before
    runner.from_evidence(saved, [dec], run)             # the saved copy itself is unchanged
    assert seen == [10.0, 10.0]


def test_noisy_prompts_and_what_is_measured_again(bpe_pair):
    def rec(pid, tps, run=0, **marks):
        return dict(prompt_id=pid, mode="target", run=run, tokens_per_second=tps, **marks)
    recs = [rec("a", 10.0), rec("a", 11.0, repeat=1), rec("b", 10.0), rec("b", 10.5, repeat=1),
            rec("c", 10.0), rec("d", 12.0), rec("d", 10.0, repeat=1), rec("d", 10.0, remeasure=1),
            rec("d", 20.0, repeat=1, remeasure=1), rec("e", 10.0, run=1), rec("e", 20.0, run=1, repeat=1)]
    # 10 -> 11 is 9.5 % apart, over the threshold; 10 -> 10.5 is not; "c" has one time only
    assert runner.noisy_prompts(recs, 0) == ["a", "d"] and runner.noisy_prompts(recs, 1) == ["e"]
    # the set measured again is judged on its own times: "d" moved from 10 to 20 there
    assert runner.noisy_prompts(recs, 0, measured_set=1) == ["d"]
    assert runner.noisy_prompts(recs, 0, measured_set=2) == []
    # a cell whose one-token target passes ran 10 % slower than the target alone's (20 ms):
    # measured again, though the bracket agreed; too few of them (or no pace) say nothing
    def paced(pid, mode, ms, n=20, **marks):
        r = rec(pid, 10.0, **marks)
        r.update(mode=mode, policy=dict(one_token=dict(n=n, seconds=ms and ms / 1e3)))
        return r
    for cell, noisy in ((paced("p", "draft", 22.0), True), (paced("p", "draft", 20.5), False),
                        (paced("p", "draft", 24.0, n=runner.PACE_MIN_PASSES - 1), False),
                        (paced("p", "draft", None), False)):
        assert runner.noisy_prompts([paced("p", "target", 20.0), cell, paced("p", "target", 20.0, repeat=1)],
                                    0) == (["p"] if noisy else [])
    # a cell with too few one-token passes of its own is judged by its pace probe against the
    # target-alone cells' probes (20 ms); one with enough passes by those passes alone
    def probed(r, ms):
        r["pace_probe"] = dict(n=runner.PACE_PROBE_PASSES, seconds=ms / 1e3)
        return r
    for cell, noisy in ((probed(paced("p", "combined", None, n=0), 22.0), True),
                        (probed(paced("p", "combined", None, n=0), 20.5), False),
                        (probed(paced("p", "combined", 30.0, n=runner.PACE_MIN_PASSES - 1), 19.5), False),
                        (probed(paced("p", "draft", 20.0), 25.0), False),
                        (paced("p", "combined", None, n=0), False)):
        assert runner.noisy_prompts([probed(paced("p", "target", 20.0), 20.0), cell,
                                     probed(paced("p", "target", 20.0, repeat=1), 20.0)], 0) == (["p"] if noisy else [])
    # without the target alone's probes (an older results file) the probe says nothing
    assert runner.noisy_prompts([paced("p", "target", 20.0), probed(paced("p", "combined", None, n=0), 30.0),
                                 paced("p", "target", 20.0, repeat=1)], 0) == []
    args = bench.build_parser().parse_args([])
    assert runner.remeasures(["target", "draft"], args)
    assert not runner.remeasures(["target", "combined", "corpus"], args)     # its corpus holds the answer
    assert not runner.remeasures(["target"], args)                           # no bracket
    assert not runner.remeasures(["target", "draft"], bench.build_parser().parse_args(["--no-remeasure"]))
    target, same, _ = bpe_pair
    with fastspec.SpeculativeDecoder(str(target), str(same), n_ctx=256) as dec:
        dec.generate("the quick brown fox", max_tokens=4, n_draft=2)
        assert dec._draft_ctx.n_past > 0
        toks = dec.tokenize("the quick brown fox")
        runner.forget_prompt([dec, dec], toks[:2] + [toks[0]])
        assert dec._draft_ctx.n_past == 2      # the common prefix with the head kept
        runner.forget_prompt([dec])
        assert dec._draft_ctx.n_past == 0
        # the head: the chat template's opening, which a formatted prompt shares; raw text: the BOS
        head = runner.template_head(dec, True)
        text, add = runner.format_prompt(dec, "the quick brown fox", True)
        prompt = dec.tokenize(text, add_special=add)
        common = next((i for i, (a, b) in enumerate(zip(head, prompt)) if a != b), len(head))
        assert common >= 1 and len(head) > common       # its opening, then the empty message's end
        assert runner.template_head(dec, False) == dec.tokenize("")


def test_a_pace_probe_leaves_the_decoder_as_it_was(bpe_pair):
    """pace_probe times one-token target passes after a generation and takes each back: the
    context holds what it held, and the next generation is what it would have been."""
    target, same, _ = bpe_pair
    with fastspec.SpeculativeDecoder(str(target), str(same), n_ctx=256) as dec:
        first = dec.generate("the quick brown fox", max_tokens=6, n_draft=2).tokens
        held = dec._target_ctx.n_past
        secs = runner.pace_probe(dec)
        assert secs is not None and secs > 0.0
        assert dec._target_ctx.n_past == held
        assert dec.generate("the quick brown fox", max_tokens=6, n_draft=2).tokens == first
    with fastspec.SpeculativeDecoder(str(target), None, n_ctx=256) as dec:
        assert runner.pace_probe(dec) is None          # nothing decoded yet: no context to probe at


def test_a_cell_with_few_one_token_passes_gets_a_pace_probe(base_args, tmp_path):
    """The bench records a pace probe after each target-alone cell and after each cell with
    fewer than PACE_MIN_PASSES one-token passes of its own."""
    out = tmp_path / "r.json"
    assert bench.main(base_args + ["--out", str(out), "--quiet", "--modes", "target,lookup"]) == 0
    recs = json.loads(out.read_text())["measurements"]
    for r in recs:
        few = (r["policy"]["one_token"]["n"] or 0) < runner.PACE_MIN_PASSES
        assert ("pace_probe" in r) == (r["mode"] == "target" or few), r["mode"]
        if "pace_probe" in r:
            assert r["pace_probe"]["n"] == runner.PACE_PROBE_PASSES and r["pace_probe"]["seconds"] > 0


def test_a_busy_machine_is_noted_by_what_keeps_it_busy_now(monkeypatch):
    """The note at a run's start reads the CPUs' busy share over half a second (a neighbour's
    steal included) where the system says, not the minute-long load average, which after a
    ``pip install`` still counts the build."""
    busy = runner.busy_cpus(0.05)
    assert busy is None or 0.0 <= busy <= (os.cpu_count() or 1) + 1e-9
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    assert runner.busy_note(dict(busy_cpus_at_start=0.2, load_average_at_start=[1.9, 1.0, 0.5])) is None
    assert "kept 1.5 of 2 CPUs busy" in runner.busy_note(dict(busy_cpus_at_start=1.5, load_average_at_start=[0.1]))
    assert "system load 1.9 on 2 CPUs" in runner.busy_note(dict(busy_cpus_at_start=None,
                                                                load_average_at_start=[1.9, 1.0, 0.5]))
    assert runner.busy_note(dict(busy_cpus_at_start=None, load_average_at_start=None)) is None


def test_cells_in_a_slow_spell_are_named():
    """A cell whose one-token target passes took 1.25x the run's median or more is named in the
    report (and the summary): its speed-up measures the machine's slow spell too."""
    def rec(pid, mode, t1, run=0):
        return dict(prompt_id=pid, category="c", mode=mode, run=run, tokens=[1], tokens_per_second=10.0,
                    identical_to_target=None, first_difference=None, policy=dict(costs=dict(t1=t1)),
                    stats=dict(n_generated=1, t_generate=0.1, n_drafted=0, n_accepted=0, n_target_passes=1,
                               theoretical_speedup=None, alpha=None))
    recs = [rec("a", "target", 0.031), rec("a", "draft", 0.032), rec("b", "target", 0.030),
            rec("b", "draft", 0.050, run=1), rec("c", "target", 0.033)]
    summary = bench.summarise(recs, ["target", "draft"])
    assert summary["slow_cells"] == dict(median_ms=32.0, cells=[["b", "draft", 1, 50.0]])
    line = report.slow_cells_line(summary)
    assert "b draft (run 2) 50 ms" in line and "(32 ms)" in line
    assert report.slow_cells_line(bench.summarise(recs[:3], ["target", "draft"])) is None   # too few to say
    recs[3]["policy"]["costs"]["t1"] = 0.034
    assert report.slow_cells_line(bench.summarise(recs, ["target", "draft"])) is None


def test_no_bracket_times_the_target_once(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft", "--n-draft", "4",
                                   "--no-bracket"]) == 0
    data = json.loads(out.read_text())
    assert [m["mode"] for m in data["measurements"]] == ["target", "draft"] * 3
    assert data["settings"]["bracket"] is False and data["summary"]["target_repeat"]["overall"] is None
    assert "timed again" not in capsys.readouterr().out


def test_tables_and_verdict_printed(base_args, tmp_path, capsys):
    assert bench.main(base_args + ["--out", str(tmp_path / "x.json"), "--modes", "draft,target"]) == 0
    out = capsys.readouterr().out
    assert "Overall" in out and "By category" in out and "story" in out
    assert "3/3 outputs identical" in out and "lookup" not in out.split("By category")[1].split("Costs on")[0]


def test_progress_is_written_as_lines_where_stderr_is_no_terminal(base_args, tmp_path, capsys):
    # (under pytest stderr is captured: no terminal, as with 2> log or nohup)
    assert bench.main(base_args + ["--out", str(tmp_path / "x.json"), "--modes", "target,draft"]) == 0
    step = re.compile(r"fastspec\.bench: \d+:\d\d:\d\d (\d+)/(\d+) (.+)")   # elapsed, done/total, what
    lines = [m.groups() for m in map(step.fullmatch, capsys.readouterr().err.splitlines()) if m]
    said = [what for _, _, what in lines]
    assert said[0] == "warm-up" and {"warm-up target", "warm-up draft"} <= set(said)
    assert "run 1/1 81 draft" in said and "run 1/1 story-3 target again" in said
    assert all(int(a) <= int(b) for a, b, _ in lines) and int(lines[-1][0]) > 0
    # --quiet: not a line
    assert bench.main(base_args + ["--out", str(tmp_path / "y.json"), "--modes", "target,draft", "--quiet"]) == 0
    assert not any(map(step.fullmatch, capsys.readouterr().err.splitlines()))


def test_line_progress():
    import io
    from fastspec.bench.progress import LineProgress
    out = io.StringIO()
    with LineProgress("p", stream=out) as bar:
        task = bar.add_task("one", total=3)
        bar.advance(task)
        bar.update(task, description="one")           # the same step: no new line
        bar.update(task, description="two", total=4)
        bar.advance(task, 2)
        bar.update(task, description="three")
    assert [ln.split(" ", 2)[2] for ln in out.getvalue().splitlines()] == ["0/3 one", "1/4 two", "3/4 three"]
    quiet = io.StringIO()
    with LineProgress("p", stream=quiet, disable=True) as bar:
        bar.update(bar.add_task("x", total=1), description="y")
    assert quiet.getvalue() == ""


def test_prompt_formats(prompts_file):
    prompts = bench.load_prompts(str(prompts_file))
    assert [(p.id, p.category, p.text) for p in prompts] == [
        ("81", "writing", "hello world the quick brown fox"),  # Spec-Bench: first turn
        ("story-3", "story", PLAIN["prompt"]),
        ("uncategorised-4", "uncategorised", BARE["prompt"])]


def test_builtin_prompts_cover_the_categories():
    prompts = bench.load_prompts(None)
    cats = {p.category for p in prompts}
    assert cats == {"chat", "coding", "math", "extraction", "translation", "summarisation", "qa", "rag", "edit"}
    assert all(sum(p.category == c for p in prompts) == 2 for c in cats - {"edit"})
    edits = [p for p in prompts if p.category == "edit"]
    assert 4 <= len(edits) <= 6 and all(p.prediction and p.prediction in p.text for p in edits)
    assert all(30 <= p.prediction.count("\n") <= 80 for p in edits)
    assert all(p.prediction is None for p in prompts if p.category != "edit")
    assert len({p.id for p in prompts}) == len(prompts)
    assert [p.category for p in bench.select_prompts(prompts, ["rag", "math"], 1)] == ["math", "rag"]
    with pytest.raises(bench.BenchError, match="unknown categories"):
        bench.select_prompts(prompts, ["poetry"], None)


@pytest.mark.parametrize("bad", ['{"prompt": "x"', "[1, 2]", '{"category": "qa"}', '{"turns": []}',
                                 '{"prompt": ""}'])
def test_malformed_line_names_its_number(bad, base_args, tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl", [PLAIN, "", bad, BARE])
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--prompts", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "Traceback" not in err
    assert not out.exists()


def test_unreadable_prompts_file(base_args, tmp_path, capsys):
    assert bench.main(base_args + ["--prompts", str(tmp_path / "nope.jsonl")]) != 0
    assert "cannot read prompts file" in capsys.readouterr().err


def test_missing_model(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--target", str(tmp_path / "missing.gguf"), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "missing.gguf" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("where", ["no-such-dir/x.json", "."])
def test_unwritable_output_fails_before_measuring(where, base_args, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "open_decoders", lambda *a: pytest.fail("models loaded before the check"))
    assert bench.main(base_args + ["--out", str(tmp_path / where)]) != 0
    assert "output" in capsys.readouterr().err


def test_compare_outputs():
    assert bench.compare_outputs([1, 2, 3], [1, 2, 3]) is None
    assert bench.compare_outputs([1, 2, 3], [1, 9, 3]) == 1
    assert bench.compare_outputs([1, 2, 3], [1, 2]) == 2
    assert bench.compare_outputs([], []) is None


def test_tampered_output_is_reported(base_args, tmp_path, capsys, monkeypatch):
    real = runner.measure

    def tampered(dec, prompt, formatted, mode, run, args, max_tokens=None):
        rec = real(dec, prompt, formatted, mode, run, args, max_tokens)
        if mode == "draft" and prompt.id == "story-3":
            rec["tokens"][5] += 1
        return rec

    monkeypatch.setattr(runner, "measure", tampered)
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft,lookup"]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["mismatches"] == [dict(prompt_id="story-3", mode="draft", run=0, first_difference=5)]
    flags = {(m["prompt_id"], m["mode"]): m["identical_to_target"] for m in data["measurements"]}
    assert flags[("story-3", "draft")] is False and flags[("81", "draft")] is True
    assert data["summary"]["overall"]["draft"]["n_identical"] == 2
    printed = capsys.readouterr().out
    assert "differ from the target alone" in printed and "story-3" in printed
    assert "5/6 outputs identical" in printed


def test_verdict_marks_mismatch_red():
    recs = [dict(prompt_id="p", category="c", mode=m, run=0, tokens_per_second=10.0, tokens=toks,
                 identical_to_target=None, first_difference=None,
                 stats=dict(n_generated=3, t_generate=0.3, n_drafted=2, n_accepted=1, n_target_passes=2,
                            theoretical_speedup=None if m == "target" else 1.5, alpha=0.5))
            for m, toks in (("target", [1, 2, 3]), ("draft", [1, 2, 4]))]
    runner.check_equality(recs)
    summary = bench.summarise(recs, ["target", "draft"])
    args = bench.build_parser().parse_args(["--draft", "d"])
    line, ok = bench.verdict(summary, args)
    assert not ok and "0/1 outputs identical" in line
    assert summary["mismatches"][0]["first_difference"] == 2


def test_a_target_that_differs_from_itself_turns_the_verdict_red():
    """The bracket's second target-alone run is compared with the first: a target whose
    greedy output is not repeatable (some GPU backends) makes the equality check moot."""
    def rec(mode, toks, repeat=0):
        r = dict(prompt_id="p", category="c", mode=mode, run=0, tokens_per_second=10.0, tokens=toks,
                 identical_to_target=None, first_difference=None,
                 stats=dict(n_generated=3, t_generate=0.3, n_drafted=2, n_accepted=2, n_target_passes=2,
                            theoretical_speedup=None if mode == "target" else 1.5, alpha=1.0))
        if repeat:
            r["repeat"] = 1
        return r
    args = bench.build_parser().parse_args(["--draft", "d"])
    same = [rec("target", [1, 2, 3]), rec("draft", [1, 2, 3]), rec("target", [1, 2, 3], repeat=1)]
    runner.check_equality(same)
    line, ok = bench.verdict(bench.summarise(same, ["target", "draft"]), args)
    assert ok and "1/1 outputs identical" in line and "differed from itself" not in line
    moved = [rec("target", [1, 2, 3]), rec("draft", [1, 2, 3]), rec("target", [1, 2, 4], repeat=1)]
    runner.check_equality(moved)
    summary = bench.summarise(moved, ["target", "draft"])
    line, ok = bench.verdict(summary, args)
    assert not ok and "1/1 outputs identical" in line and "differed from itself on 1 of 1 prompts" in line
    assert summary["mismatches"] == [dict(prompt_id="p", mode="target", run=0, first_difference=2)]


def test_temperature_skips_equality(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft", "--temperature", "0.8",
                                   "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert all(m["identical_to_target"] is None for m in data["measurements"])
    assert "not compared" in capsys.readouterr().out


def test_sampling_filters_reach_the_sampler(base_args, tmp_path, capsys):
    """--top-k/--top-p/--min-p go to every generation: with top-k 1 sampling at any
    temperature keeps only the most likely token, so every mode gives the greedy output."""
    greedy, sampled = tmp_path / "g.json", tmp_path / "s.json"
    assert bench.main(base_args + ["--out", str(greedy), "--modes", "target,draft", "--n-draft", "3", "--quiet"]) == 0
    assert bench.main(base_args + ["--out", str(sampled), "--modes", "target,draft", "--n-draft", "3",
                                   "--temperature", "1.5", "--top-k", "1", "--top-p", "0.9", "--min-p", "0.05",
                                   "--quiet"]) == 0
    assert "temperature 1.5 > 0, top-k 1, top-p 0.9, min-p 0.05" in " ".join(capsys.readouterr().out.split())
    g, s = (json.loads(f.read_text()) for f in (greedy, sampled))
    assert (s["settings"]["top_k"], s["settings"]["top_p"], s["settings"]["min_p"]) == (1, 0.9, 0.05)
    want = {m["prompt_id"]: m["tokens"] for m in g["measurements"] if m["mode"] == "target"}
    assert s["measurements"] and all(m["tokens"] == want[m["prompt_id"]] for m in s["measurements"])


@pytest.mark.parametrize("flag,bad", [("--top-k", "-1"), ("--top-k", "2.5"), ("--top-p", "0"),
                                      ("--top-p", "1.5"), ("--min-p", "-0.1"), ("--min-p", "x"),
                                      ("--temperature", "-1"), ("--temperature", "nan")])
def test_bad_sampling_settings_are_refused(base_args, flag, bad, capsys):
    assert bench.main(base_args + [flag, bad]) == 2
    assert flag in capsys.readouterr().err


def test_interrupt_keeps_partial_results(base_args, tmp_path, capsys, monkeypatch):
    real, calls = runner.measure, []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) > 6:  # 2 warm-ups, then the first two prompts, then Ctrl-C
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "measure", interrupted)
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft", "--quiet"]) == 130
    data = json.loads(out.read_text())
    assert data["status"] == "interrupted" and len(data["measurements"]) == 4
    assert "partial results" in capsys.readouterr().err


def test_show_colours_sources(base_args, capsys):
    assert bench.main(base_args + ["--show", "--modes", "draft", "--max-tokens", "24", "--n-draft", "4"]) == 0
    out = capsys.readouterr().out
    assert "legend" in out and "accepted draft token" in out
    assert "acceptance rate 100%" in out  # the identical draft


def test_report_shows_each_proposers_share(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    # a fixed draft length: with "auto" a draft as slow as its target (these twins) is not run
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft", "--n-draft", "4"]) == 0
    share = json.loads(out.read_text())["summary"]["overall"]["draft"]["emitted_share"]
    assert set(share) <= {"target", "draft"} and share["draft"] > 0 and sum(share.values()) == pytest.approx(1.0)
    assert "tokens emitted, by proposer: target: target 100%; draft: " in capsys.readouterr().out


def test_default_run_prints_the_advice(base_args, tmp_path, capsys):
    out = tmp_path / "x.json"
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft"]) == 0
    advice = json.loads(out.read_text())["advice"]
    assert advice["cost_ratio"] > 0 and set(advice["categories"]) == {"writing", "story", "uncategorised"}
    assert "Advice: Here a draft token costs" in capsys.readouterr().out
    assert bench.main(base_args + ["--out", str(out), "--modes", "target,draft", "--no-advice"]) == 0
    assert "Advice:" not in capsys.readouterr().out


EDIT = {"id": "e1", "category": "edit", "prompt": "Rename f to g:\n\ndef f(x):\n    return x + 1\n",
        "prediction": "def f(x):\n    return x + 1\n"}


def test_prediction_mode(bpe_pair, tmp_path, capsys):
    target, same, _ = bpe_pair
    path = write_jsonl(tmp_path / "e.jsonl", [EDIT, PLAIN])
    out = tmp_path / "x.json"
    args = ["--target", str(target), "--draft", str(same), "--prompts", str(path), "--max-tokens", "12",
            "--threads", "1", "--ctx", "512", "--out", str(out), "--modes", "target,prediction", "--no-remeasure",
            "--min-cell-seconds", "0"]
    assert bench.load_prompts(str(path))[0].prediction == EDIT["prediction"]
    assert bench.main(args) == 0
    data = json.loads(out.read_text())
    if runner.api_supports("prediction"):
        pred = [m for m in data["measurements"] if m["mode"] == "prediction"]
        assert [m["prompt_id"] for m in pred] == ["e1"]     # only prompts that carry a prediction
        assert data["settings"]["skipped_modes"] == {}
    else:
        assert "skipping the prediction mode" in capsys.readouterr().err
        assert data["settings"]["modes"] == ["target"] and "prediction" in data["settings"]["skipped_modes"]


def test_bad_prediction_field(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [dict(EDIT, prediction=3)])
    with pytest.raises(bench.BenchError, match="line 1: 'prediction' must be a non-empty string"):
        bench.load_prompts(str(path))


def test_multi_turn_measures_the_second_turn(bpe_pair, tmp_path, capsys, monkeypatch):
    target, same, _ = bpe_pair
    two = {"question_id": 7, "category": "writing", "turns": ["the quick brown fox", "now say it again"]}
    path = write_jsonl(tmp_path / "m.jsonl", [two, PLAIN])
    out = tmp_path / "x.json"
    args = ["--target", str(target), "--draft", str(same), "--prompts", str(path), "--max-tokens", "10",
            "--threads", "1", "--ctx", "512", "--out", str(out), "--multi-turn", "--modes", "target,draft,corpus"]
    seen = []                  # per call: mode, the decoder's acceptance evidence, its corpus size
    measure = runner.measure

    def spy(dec, prompt, formatted, mode, *a, **kw):
        seen.append((mode, dec.acceptance.counts(), len(dec.corpus) if dec.corpus is not None else None))
        return measure(dec, prompt, formatted, mode, *a, **kw)
    monkeypatch.setattr(runner, "measure", spy)
    assert bench.main(args) == 0
    # 3 warm-ups, then the measured turn 2 of each mode: the warm-ups taught nothing that
    # stays (the corpus holds the first turn alone; no acceptance evidence before the draft's)
    assert [m for m, _, _ in seen] == ["target", "draft", "corpus"] * 2 + ["target"]
    if runner.api_supports("corpus"):
        assert seen[5][2] == 1
    assert seen[4][1] == {}
    data = json.loads(out.read_text())
    assert [p["id"] for p in data["prompts"]] == ["7"]      # only two-turn conversations
    meas = data["measurements"]
    assert meas and all(m["turn"] == 2 for m in meas)
    assert all(m["identical_to_target"] for m in meas if m["mode"] != "target")
    if not runner.api_supports("corpus"):
        assert "skipping the corpus mode" in capsys.readouterr().err
    else:
        assert any(m["mode"] == "corpus" for m in meas)
    if runner.api_supports("corpus"):
        # a second run: the corpus starts again from the first turn alone (after the first
        # run it would hold the prompt's own answer)
        seen.clear()
        assert bench.main(args + ["--runs", "2"]) == 0
        assert [n for m, _, n in seen if m == "corpus"] == [0, 1, 1]
    # no two-turn prompts: a clear error, nothing measured
    path = write_jsonl(tmp_path / "one.jsonl", [PLAIN])
    assert bench.main(args[:5] + [str(path)] + args[6:]) == 2
    assert "two turns" in capsys.readouterr().err


def test_trace_records_every_pass_of_the_speculative_modes(base_args, tmp_path, capsys):
    """--trace: each speculative measurement holds a pass-by-pass trace (one entry a target
    pass) that GenerationStats reads back and explains; the target alone's holds none, and
    without the switch none does."""
    traced, plain = tmp_path / "t.json", tmp_path / "p.json"
    common = base_args + ["--modes", "target,draft,lookup", "--n-draft", "3", "--quiet", "--no-bracket"]
    assert bench.main(common + ["--out", str(traced), "--trace"]) == 0
    assert bench.main(common + ["--out", str(plain)]) == 0
    t, p = (json.loads(f.read_text()) for f in (traced, plain))
    assert t["settings"]["trace"] is True and p["settings"]["trace"] is False
    assert all(m["stats"]["trace"] is None for m in p["measurements"])
    spec = [m for m in t["measurements"] if m["mode"] != "target"]
    assert spec and all(m["stats"]["trace"] is None for m in t["measurements"] if m["mode"] == "target")
    for m in spec:
        trace = m["stats"]["trace"]
        assert len(trace) == m["stats"]["n_target_passes"]
        # what the passes emitted is the answer (and its end-of-generation token, if it had one)
        assert sum(e["emitted"] for e in trace) - m["n_tokens"] in (0, 1)
        table = fastspec.GenerationStats(**m["stats"]).explain()
        assert len(table.splitlines()) == len(trace) + 2
    # the same tokens as without the trace
    key = lambda d: {(m["prompt_id"], m["mode"]): m["tokens"] for m in d["measurements"]}
    assert key(t) == key(p)
