"""python -m fastspec.bench sweep on tiny models: the JSON cells, incompatible drafts, the HTML
report, quantized variants (and re-quantization), config files, bad input; plus the bench's
--batch-invariant flag."""
import argparse
import json
import os
import statistics

import pytest

from fastspec import _core, bench
from fastspec.bench import report, runner, sweep

PROMPTS = [{"prompt": "hello world the quick brown fox", "category": "a"},
           {"prompt": "once upon a time there was", "category": "b"}]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private model cache, so variants made here neither use nor leave files elsewhere."""
    monkeypatch.setenv("FASTSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def common(prompts_file):
    # --no-remeasure: a tiny model's cells are so short that timing noise would have some
    # prompts measured again (test_a_prompt_whose_pace_moved_is_measured_again);
    # --min-cell-seconds 0: and every one measured in rounds (test_a_short_answer_is_swept_in_rounds)
    return ["--prompts", str(prompts_file), "--max-tokens", "8", "--threads", "1", "--ctx", "256", "--no-remeasure",
            "--min-cell-seconds", "0"]


def run_sweep(args, out):
    code = bench.main(["sweep", *args, "--out", str(out)])  # through the bench's dispatch
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_sweep_grid(bpe_pair, spm_pair, common, tmp_path, capsys, cache):
    target, same, other = bpe_pair
    spm = spm_pair[0]
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(target), "--drafts", f"{same},{other},{spm}", "--n-draft", "2,auto",
                            "--temperatures", "0", *common], out)
    assert code == 0
    assert data["schema"] == sweep.SCHEMA and data["status"] == "complete"
    for key in ("fastspec_version", "llama_cpp_commit", "system_info", "cpu_count", "n_threads"):
        assert data["environment"][key], key
    assert data["settings"]["n_draft"] == [2, "auto"] and data["settings"]["temperatures"] == [0.0]
    names = ["draft-same-bpe", "draft-other-bpe", "target-spm"]
    assert [d["label"] for d in data["drafts"]] == names and data["targets"][0]["file_type"] == "F32"

    cells = {(c["target"], c["draft"], c["n_draft"]): c for c in data["cells"]}
    assert len(data["cells"]) == 3 * 2 and set(cells) == {("target-bpe", d, n) for d in names for n in (2, "auto")}
    for n in (2, "auto"):
        ident, oth, inc = (cells[("target-bpe", d, n)] for d in names)
        assert ident["status"] == oth["status"] == "ok"
        # "auto" may rightly not draft at all here: a tiny draft costs as much as its target
        drafted = n == 2 or ident["acceptance_rate"] is not None
        assert (ident["acceptance_rate"] == 1.0 if drafted else True) and ident["speedup"] > 0
        assert ident["n_prompts"] == 2
        assert oth["acceptance_rate"] is None if (n == "auto" and oth["acceptance_rate"] is None) else oth["acceptance_rate"] < 1.0
        # greedy: every output equals the baseline's (the other draft is rejected, not trusted)
        assert ident["n_identical"] == ident["n_compared"] == 2 == oth["n_identical"]
        assert inc["status"].startswith("incompatible:") and "vocabulary differs" in inc["status"]
        assert inc["speedup"] is None
    # raw measurements: a baseline per prompt, then for each compatible draft, prompt by prompt,
    # the target alone, the 2 settings and the target alone again
    meas = data["measurements"]
    assert sum(m["mode"] == "target" for m in meas) == 2 + 2 * 2 * 2 and len(meas) == 2 + 2 * 2 * 4
    assert [m["draft"] for m in meas[:2]] == [None, None]
    for d in names[:2]:
        seq = [(m["prompt_id"], m["setting"], m.get("repeat")) for m in meas if m["draft"] == d]
        for pid in ("a-1", "b-2"):
            assert [x for x in seq if x[0] == pid] == [
                (pid, "target alone", 0), (pid, "draft n_draft=2", None), (pid, "draft n_draft=auto", None),
                (pid, "target alone", 1)]
    # each cell's speed-up is against its own column's two timings of the target alone
    for (t, d, n), c in cells.items():
        if c["status"] != "ok":
            continue
        own = [m for m in meas if m["draft"] == d and m["mode"] == "target"]
        mine = [m for m in meas if m["draft"] == d and m["n_draft"] == n]
        ratios = []
        for pid in ("a-1", "b-2"):
            ref = sum(m["tokens_per_second"] for m in own if m["prompt_id"] == pid) / 2
            ratios.append(next(m["tokens_per_second"] for m in mine if m["prompt_id"] == pid) / ref)
        assert c["speedup"] == pytest.approx((ratios[0] * ratios[1]) ** 0.5)
    assert all(m["target"] == "target-bpe" and m["tokens"] and m["stats"] for m in meas)
    assert data["best"]["0.0"]["target-bpe"]["target-spm"]["status"].startswith("incompatible")

    page = (tmp_path / "s.html").read_text()  # default: next to the JSON
    assert page.startswith("<!DOCTYPE html>") and "<table" in page and "</html>" in page
    assert all(n in page for n in names) and "incompatible" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page  # self-contained
    assert "background:#" in page  # colour-coded cells

    captured = capsys.readouterr()
    printed = captured.out
    # stderr is no terminal here (as with 2> log): a line per step, not a silent bar
    steps = [ln for ln in captured.err.splitlines() if ln.startswith("fastspec.bench sweep: ")]
    assert len(steps) >= len(meas) and any("draft-same-bpe" in ln for ln in steps)
    assert "best setting per cell" in printed and "draft n_draft=2" in printed  # heatmap + per-setting views
    assert "target-spm with target-bpe: incompatible" in printed.replace("\n", " ")
    # auto beside a fixed length: per category, against the best fixed one (here the only one)
    rows = {(r["draft"], r["category"]): r for r in data["auto_vs_fixed"]}
    assert set(rows) == {(d, g) for d in names[:2] for g in ("a", "b", "all")}
    for (d, g), r in rows.items():
        assert r["best_fixed_setting"] == "n=2" and r["setting"] == "draft n_draft=auto"
        assert r["best_fixed"] == pytest.approx(cells[("target-bpe", d, 2)]["speedup"] if g == "all" else r["best_fixed"])
        assert r["share"] == pytest.approx(r["auto"] / r["best_fixed"])
    assert rows[(names[0], "all")]["auto"] == pytest.approx(cells[("target-bpe", names[0], "auto")]["speedup"])
    assert "auto within 10 % of the best fixed length in" in " ".join(printed.split())
    assert "auto against the best fixed draft length" in page and data["remeasured"] == []


def test_lookup_and_temperatures(bpe_pair, common, tmp_path, cache):
    target, same, _ = bpe_pair
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(target), "--drafts", str(same), "--n-draft", "3", "--p-min", "0,0.5",
                            "--temperatures", "0,0.8", "--lookup", "--quiet", *common], out)
    assert code == 0
    settings = {(c["draft"], c["setting"], c["temperature"]) for c in data["cells"]}
    # draft and draft+lookup with both p_min values; lookup alone (no p_min) in its own column
    assert settings == {(d, s, t) for t in (0.0, 0.8) for d, s in [
        ("draft-same-bpe", "draft n_draft=3"), ("draft-same-bpe", "draft n_draft=3 p_min=0.5"),
        ("draft-same-bpe", "draft + lookup n_draft=3"), ("draft-same-bpe", "draft + lookup n_draft=3 p_min=0.5"),
        (sweep.LOOKUP_COLUMN, "lookup alone n_draft=3")]}
    for c in data["cells"]:
        assert c["status"] == "ok" and c["speedup"] > 0
        # outputs are compared with the baseline at temperature 0 only
        assert c["n_compared"] == (2 if c["temperature"] == 0 else 0)
    base = [m for m in data["measurements"] if m["mode"] == "target" and m["draft"] is None]
    assert sorted(m["temperature"] for m in base) == [0.0, 0.0, 0.8, 0.8]
    # the draft column and the lookup column each time the target alone around a prompt's settings
    for col in ("draft-same-bpe", sweep.LOOKUP_COLUMN):
        own = [m for m in data["measurements"] if m["mode"] == "target" and m["draft"] == col]
        assert sorted((m["temperature"], m["repeat"]) for m in own) == \
            [(t, r) for t in (0.0, 0.8) for r in (0, 1) for _ in range(2)]      # 2 prompts
    lookup = [m for m in data["measurements"] if m["mode"] == "lookup"]
    assert lookup and all(m["stats"]["emitted_by_source"].get("draft", 0) == 0 for m in lookup)


def test_each_draft_setting_reads_the_prompt_itself(bpe_pair, common, tmp_path, cache, monkeypatch):
    """The settings take turns on one decoder, prompt by prompt: each starts with a draft cache
    holding no more than the chat template's opening, so none gets the prompt's prefill from
    the setting before for free (fixed lengths would look faster than a single request with
    them is)."""
    target, same, _ = bpe_pair
    held = []
    measure = runner.measure

    def spy(dec, prompt, formatted, mode, *a, **kw):
        if mode != "target" and dec._draft_ctx is not None:
            held.append(dec._draft_ctx.n_past <= len(runner.template_head(dec, True)))
        return measure(dec, prompt, formatted, mode, *a, **kw)
    monkeypatch.setattr(runner, "measure", spy)
    code, data = run_sweep(["--targets", str(target), "--drafts", str(same), "--n-draft", "2,3,4", "--quiet", *common],
                           tmp_path / "s.json")
    assert code == 0 and all(c["status"] == "ok" for c in data["cells"])
    assert len(held) >= 6 and held[-6:] == [True] * 6      # 3 settings x 2 prompts, after the warm-up


def test_a_short_answer_is_swept_in_rounds(bpe_pair, common, tmp_path, cache, monkeypatch):
    """As the bench does: a prompt whose first cell (the column's target alone) generates in
    under --min-cell-seconds has its settings and their bracket measured in rounds (records
    marked ``round``); a cell's speed-up pools its rounds.  The baseline block is timed once."""
    target, same, _ = bpe_pair
    out = tmp_path / "s.json"
    args = [a for a in common if a not in ("--min-cell-seconds", "0")] + ["--min-cell-seconds", "3600"]
    seen = []                   # the decoder's evidence as each generation starts
    real = runner.measure

    def spy(dec, *a, **kw):
        seen.append(dec.acceptance.counts())
        return real(dec, *a, **kw)
    monkeypatch.setattr(runner, "measure", spy)
    code, data = run_sweep(["--targets", str(target), "--drafts", str(same), "--n-draft", "2", "--quiet", *args], out)
    assert code == 0 and data["status"] == "complete"
    # each round from the evidence the first started from (the last 24 calls: the column's)
    for i in range(2):
        mine = seen[-24:][12 * i:12 * (i + 1)]
        assert mine == mine[:3] * 4 and any(mine)
    meas = data["measurements"]
    assert [m["draft"] for m in meas[:2]] == [None, None] and not any(m.get("round") for m in meas[:2])
    mine = meas[2:]
    assert len(mine) == 2 * runner.MAX_ROUNDS * 3           # 2 prompts x 4 rounds x (target, n 2, target)
    for i, pid in enumerate(["a-1", "b-2"]):
        s = mine[12 * i:12 * (i + 1)]
        assert [(m["prompt_id"], m["setting"], m.get("repeat"), m.get("round", 0)) for m in s] == [
            (pid, x, rep, n) for n in range(4)
            for x, rep in (("target alone", 0), ("draft n_draft=2", None), ("target alone", 1))]
    cell = data["cells"][0]
    want = report.geomean([
        runner.pooled_rate([m for m in mine if m["prompt_id"] == pid and m["n_draft"] == 2])
        / statistics.mean([runner.pooled_rate([m for m in mine if m["prompt_id"] == pid and m["mode"] == "target"
                                               and bool(m.get("repeat")) == rep]) for rep in (False, True)])
        for pid in ("a-1", "b-2")])
    assert cell["speedup"] == pytest.approx(want)


def test_a_prompt_whose_pace_moved_is_measured_again(bpe_pair, prompts_file, tmp_path, cache, monkeypatch):
    """As the bench does: a prompt whose two target-alone times around its settings (or a
    setting's one-token passes against them) are more than NOISY_BRACKET apart is measured
    again after the column's other prompts, bracket and all, and once more if still so
    (MAX_REMEASURES); each set's cells against that set's own target-alone times.  Here every
    prompt counts as noisy.  The baseline column (no bracket) is never measured again.  A set
    measured again starts from the policy's evidence as the prompt's first set found it."""
    monkeypatch.setattr(runner, "NOISY_BRACKET", -1.0)
    found = []                  # the decoder's evidence as each cell starts
    measure = runner.measure

    def spy(dec, *a, **kw):
        found.append((dec.acceptance.counts(), dec.acceptance.mean_length))
        return measure(dec, *a, **kw)
    monkeypatch.setattr(runner, "measure", spy)
    target, same, _ = bpe_pair
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(target), "--drafts", str(same), "--n-draft", "2,auto", "--quiet",
                            "--prompts", str(prompts_file), "--max-tokens", "8", "--threads", "1", "--ctx", "256",
                            "--min-cell-seconds", "0"], out)
    assert code == 0 and data["status"] == "complete"
    meas = data["measurements"]
    assert [m["draft"] for m in meas[:2]] == [None, None] and not any(m.get("remeasure") for m in meas[:2])
    mine = meas[2:]
    assert runner.MAX_REMEASURES == 2 and len(mine) == 2 * 3 * 4       # 2 prompts x 3 sets x 4 cells
    for n in range(3):
        s = mine[8 * n:8 * (n + 1)]
        assert all(m.get("remeasure", 0) == n and m["noisy"] == 1 for m in s)
        assert [(m["prompt_id"], m["setting"], m.get("repeat")) for m in s[:4]] == [
            ("a-1", "target alone", 0), ("a-1", "draft n_draft=2", None), ("a-1", "draft n_draft=auto", None),
            ("a-1", "target alone", 1)]
    assert data["remeasured"] == ["a-1", "b-2"]
    found = found[-len(mine):]
    for i in (0, 4):            # a-1's and b-2's first cell in each set
        assert found[i] == found[8 + i] == found[16 + i]
    assert found[0] != found[4]                 # (a-1 taught the policy before b-2's first set)
    cells = {c["n_draft"]: c for c in data["cells"]}
    # every set noisy: each prompt's speed-up the median of its three sets', each set against its own times
    for n_draft, c in cells.items():
        ratios = []
        for pid in ("a-1", "b-2"):
            xs = []
            for n in range(3):
                s = [m for m in mine if m["prompt_id"] == pid and m.get("remeasure", 0) == n]
                ref = sum(m["tokens_per_second"] for m in s if m["mode"] == "target") / 2
                xs.append(next(m["tokens_per_second"] for m in s if m["n_draft"] == n_draft) / ref)
            ratios.append(sorted(xs)[1])
        assert c["speedup"] == pytest.approx((ratios[0] * ratios[1]) ** 0.5)
        assert c["n_identical"] == c["n_compared"] == 6


def _record(pid, category, setting, tps, remeasure=0, noisy=0, repeat=None):
    n_draft = None if setting == "target alone" else (setting.split("=")[1])
    r = dict(prompt_id=pid, category=category, target="T", draft="D", temperature=0.0, run=0, setting=setting,
             mode="target" if setting == "target alone" else "draft", n_draft=n_draft, tokens_per_second=tps)
    if remeasure:
        r["remeasure"] = remeasure
    if noisy:
        r["noisy"] = 1
    if repeat is not None:
        r["repeat"] = repeat
    return r


def test_auto_against_the_best_fixed_length_per_category():
    """Per category: auto's speed-up (the geometric mean of its prompts'), the best fixed
    length's of the same mode, auto's share of it and of the best of it and the target alone;
    "all" for every prompt; a noisy set left out where a calm one was measured; the summary
    line counts the categories within AUTO_WITHIN."""
    T, D = sweep.ModelEntry("T", "T", "t.gguf"), "D"
    settings = [sweep.Setting("draft", n) for n in (2, 4, "auto")]
    recs = []
    for pid, cat, tps in [("x", "code", {2: 30, 4: 40, "auto": 38}), ("y", "code", {2: 30, 4: 20, "auto": 27}),
                          ("z", "rag", {2: 18, 4: 15, "auto": 20})]:
        recs.append(_record(pid, cat, "target alone", 20.0, repeat=0))
        for n, v in tps.items():
            recs.append(_record(pid, cat, sweep.Setting("draft", n).title, float(v)))
        recs.append(_record(pid, cat, "target alone", 20.0, repeat=1))
    # z measured again: its first set noisy (auto far off), the calm one counts
    for r in [r for r in recs if r["prompt_id"] == "z"]:
        r["noisy"] = 1
    recs[-3]["tokens_per_second"] = 5.0         # z's auto in the noisy set
    recs += [_record("z", "rag", "target alone", 10.0, 1, repeat=0),
             _record("z", "rag", "draft n_draft=2", 9.0, 1), _record("z", "rag", "draft n_draft=4", 7.5, 1),
             _record("z", "rag", "draft n_draft=auto", 10.0, 1), _record("z", "rag", "target alone", 10.0, 1, repeat=1)]
    rows = {r["category"]: r for r in sweep.auto_against_fixed(recs, [T], [(D, settings)], [0.0])}
    assert set(rows) == {"code", "rag", "all"}
    code = rows["code"]
    assert code["auto"] == pytest.approx((1.9 * 1.35) ** 0.5)
    # n=2: 1.5 and 1.5; n=4: 2.0 and 1.0 (geomean 1.414): the best fixed is n=2
    assert code["best_fixed_setting"] == "n=2" and code["best_fixed"] == pytest.approx(1.5)
    assert code["share"] == pytest.approx(code["auto"] / 1.5)
    rag = rows["rag"]        # the calm set: auto 1.0, n=2 0.9, n=4 0.75
    assert rag["auto"] == pytest.approx(1.0) and rag["best_fixed"] == pytest.approx(0.9)
    assert rag["share"] == pytest.approx(1.0 / 0.9) and rag["share_with_target"] == pytest.approx(1.0)
    assert rows["all"]["auto"] == pytest.approx((1.9 * 1.35 * 1.0) ** (1 / 3))
    line, = sweep.auto_summary(list(rows.values()))
    assert "in 2 of 2 categories" in line and "lowest code" in line
    low = dict(code, share=0.8, category="code")
    line, = sweep.auto_summary([low, rag])
    assert "in 1 of 2 categories" in line
    # no auto setting, or no fixed one beside it: nothing to compare
    assert sweep.auto_against_fixed(recs, [T], [(D, settings[:2])], [0.0]) == []
    assert sweep.auto_against_fixed(recs, [T], [(D, settings[2:])], [0.0]) == []


def test_quantized_variant(bpe_pair, common, tmp_path, cache, capsys):
    target, same, _ = bpe_pair
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(target), "--drafts", str(same), "--n-draft", "2", "--quantize", "q8_0",
                            "--quiet", *common], out)
    assert code == 0
    path = cache / "variants" / "target-bpe.Q8_0.gguf"
    assert path.is_file() and not list(path.parent.glob("*partial*"))
    m = _core.Model(str(path), vocab_only=True)
    try:
        assert m.metadata["general.file_type"] == "7"  # LLAMA_FTYPE_MOSTLY_Q8_0 (the source: 0, all F32)
    finally:
        m.close()
    labels = [t["label"] for t in data["targets"]]
    assert labels == ["target-bpe", "target-bpe.Q8_0"]
    variant = data["targets"][1]["variant"]
    assert variant["quant"] == "Q8_0" and variant["source_file_type"] == "F32"
    assert variant["requantized"] is False and variant["reused"] is False
    assert os.path.getsize(path) < os.path.getsize(target) / 2
    rows = {c["target"] for c in data["cells"] if c["status"] == "ok"}
    assert rows == {"target-bpe", "target-bpe.Q8_0"}  # the variant is measured as an extra target row
    assert "re-quantized" not in capsys.readouterr().err

    # made once, then reused while its source is unchanged
    mtime = path.stat().st_mtime_ns
    again = sweep.quantize_variant(str(target), "Q8_0")
    assert again["reused"] is True and path.stat().st_mtime_ns == mtime


def test_requantized_variant_is_flagged(bpe_pair, tmp_path, cache, common, capsys):
    q8 = sweep.quantize_variant(str(bpe_pair[0]), "Q8_0")["path"]
    v = sweep.quantize_variant(q8, "q4_0")
    assert v["requantized"] is True and v["source_file_type"] == "Q8_0" and "re-quantized" in v["note"]
    m = _core.Model(v["path"], vocab_only=True)
    try:
        assert m.metadata["general.file_type"] == "2"  # LLAMA_FTYPE_MOSTLY_Q4_0
    finally:
        m.close()
    # through the command line: said on the terminal, kept in the JSON and the HTML
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", q8, "--drafts", str(bpe_pair[1]), "--n-draft", "2", "--quantize", "Q4_0",
                            *common], out)
    assert code == 0
    variant = data["targets"][1]["variant"]
    assert variant["requantized"] is True and variant["reused"] is True and "already quantized Q8_0" in variant["note"]
    captured = capsys.readouterr()
    assert "re-quantized from an already quantized Q8_0 file" in captured.err
    assert "†" in captured.out and "already quantized" in (tmp_path / "s.html").read_text()


def test_config_file(bpe_pair, prompts_file, tmp_path, cache):
    target, same, other = bpe_pair
    config = tmp_path / "sweep.json"
    config.write_text(json.dumps({"targets": [str(target)], "drafts": [str(same), str(other)], "n-draft": [2],
                                  "temperatures": [0.5], "max_tokens": 6, "prompts": str(prompts_file),
                                  "threads": 1, "ctx": 256, "quiet": True, "no_chat_template": True,
                                  "top-k": 1, "min_p": 0.05}))
    out = tmp_path / "s.json"
    # the command line wins over the file: --n-draft 3 replaces the file's [2]
    code, data = run_sweep(["--config", str(config), "--n-draft", "3", "--html", str(tmp_path / "r.html")], out)
    assert code == 0
    s = data["settings"]
    assert s["config"] == str(config) and s["max_tokens"] == 6 and s["chat_template"] is False
    assert (s["top_k"], s["top_p"], s["min_p"]) == (1, 1.0, 0.05)
    assert sweep.filters_text(argparse.Namespace(**s)) == "top-k 1, min-p 0.05"
    # top-k 1: sampling at 0.5 keeps the most likely token alone, so each draft's output is
    # the target alone's at the same temperature
    base = {m["prompt_id"]: m["tokens"] for m in data["measurements"] if m["mode"] == "target"}
    assert all(m["tokens"] == base[m["prompt_id"]] for m in data["measurements"])
    assert {(c["draft"], c["n_draft"], c["temperature"]) for c in data["cells"]} == {
        ("draft-same-bpe", 3, 0.5), ("draft-other-bpe", 3, 0.5)}
    assert all(m["n_tokens"] <= 6 for m in data["measurements"])
    assert (tmp_path / "r.html").is_file() and not (tmp_path / "s.html").exists()


@pytest.mark.parametrize("config, message", [
    ({"targets": ["x"], "n_drafts": [2]}, "unknown key 'n_drafts'"),
    ({"targets": ["x"], "n_draft": [0]}, "n_draft"),
    ({"targets": ["x"], "quantize": ["Q9"]}, "unknown quantization type 'Q9'"),
    ({"targets": ["x"], "lookup": "yes"}, "lookup must be true or false"),
    ({"targets": ["x"], "top_p": 0}, "top_p"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_config(config, message, tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "s.json"
    assert bench.main(["sweep", "--config", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_missing_model(bpe_pair, common, tmp_path, capsys):
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(bpe_pair[0]), "--drafts", str(tmp_path / "missing-draft.gguf"),
                            *common], out)
    assert code == 2 and data is None
    err = capsys.readouterr().err
    assert "missing-draft.gguf" in err and "not found" in err and "Traceback" not in err


def test_unknown_quant_type(bpe_pair, common, tmp_path, capsys, cache):
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(bpe_pair[0]), "--drafts", str(bpe_pair[1]), "--quantize", "Q8_0,Q3_X",
                            *common], out)
    assert code == 2 and data is None
    err = capsys.readouterr().err
    assert "unknown quantization type 'Q3_X'" in err and "Q4_K_M" in err  # names the known ones
    assert not (cache / "variants").exists()  # rejected before anything is made


def test_nothing_to_compare(bpe_pair, tmp_path, capsys):
    assert bench.main(["sweep", "--targets", str(bpe_pair[0]), "--out", str(tmp_path / "s.json")]) == 2
    assert "--drafts and/or --lookup" in capsys.readouterr().err
    assert bench.main(["sweep", "--drafts", str(bpe_pair[1]), "--out", str(tmp_path / "s.json")]) == 2
    assert "no targets" in capsys.readouterr().err


def test_quant_names_and_colours():
    assert sweep.quant_type("q4_k_m") == "Q4_K_M" and sweep.QUANT_TYPES["Q4_K_M"] == 15
    assert sweep.quant_type("Q4_K") == "Q4_K_M" and sweep.QUANT_TYPES[sweep.quant_type("f16")] == 1
    assert sweep.QUANT_TYPES["Q8_0"] == 7 and sweep.QUANT_TYPES["Q6_K"] == 18 and sweep.QUANT_TYPES["Q5_K_M"] == 17

    def rgb(x):
        c = sweep.speedup_colour(x)
        return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)
    red, yellow, green = rgb(0.7), rgb(1.01), rgb(1.6)
    assert red[0] > red[1] and green[1] > green[0] and yellow == sweep.YELLOW
    assert rgb(0.25) == sweep.RED and rgb(4.0) == sweep.GREEN  # saturates
    assert rgb(1.2)[0] > rgb(1.8)[0]  # greener as the speed-up grows
    assert sweep.speedup_colour(None) == sweep.GREY


def test_bench_batch_invariant_flag(bpe_pair, prompts_file, tmp_path):
    out = tmp_path / "b.json"
    args = ["--target", str(bpe_pair[0]), "--draft", str(bpe_pair[1]), "--prompts", str(prompts_file),
            "--max-tokens", "8", "--threads", "1", "--ctx", "256", "--modes", "target,draft", "--quiet"]
    assert bench.main(args + ["--batch-invariant", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["batch_invariant"] is True
    assert data["environment"]["max_verify_batch"] >= 1  # the probed cap, recorded only in this mode
    assert all(m["identical_to_target"] for m in data["measurements"] if m["mode"] == "draft")
    assert bench.main(args + ["--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["batch_invariant"] is False and "max_verify_batch" not in data["environment"]


def test_interrupt_keeps_partial_results(bpe_pair, common, tmp_path, capsys, monkeypatch, cache):
    real, calls = runner.measure, []

    def interrupted(*a, **kw):
        calls.append(1)
        # warm-up + 2 baselines, warm-up + the target alone and the setting on the first draft's first
        # prompt, then Ctrl-C
        if len(calls) > 6:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "measure", interrupted)
    out = tmp_path / "s.json"
    code, data = run_sweep(["--targets", str(bpe_pair[0]), "--drafts", f"{bpe_pair[1]},{bpe_pair[2]}",
                            "--n-draft", "2", "--quiet", *common], out)
    assert code == 130 and data["status"] == "interrupted"
    assert len(data["measurements"]) == 4
    status = {c["draft"]: c["status"] for c in data["cells"]}
    assert status == {"draft-same-bpe": "partial", "draft-other-bpe": "not measured"}
    assert "partial results" in capsys.readouterr().err and (tmp_path / "s.html").is_file()
