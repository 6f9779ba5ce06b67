"""The measurement scripts in bench/: verify_cost.py runs on a tiny model; the lookup
ceilings of lookup_ceiling.py are checked on hand-made sequences; policy_whatif.py is
repeatable and accounts for a never-run draft as the target alone; random_weights.py keeps a
model's layout and writes weights of a sane spread; compare_fastspec.py's settings each read
the prompt themselves; compare_peers.py's fastspec worker gives the target alone's
tokens and stops clearly where a peer's interpreter lacks its library; interleave_cost.py
times each model after either; advice_reread.py sets the best advised against the best
measured."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import advice_reread  # noqa: E402
import compare_fastspec  # noqa: E402
import compare_peers  # noqa: E402
import lookup_ceiling  # noqa: E402
import multiturn_ceiling  # noqa: E402
import random_weights  # noqa: E402

FLAT = {n: 1.0 for n in range(1, 18)}          # verification as cheap as one pass
LINEAR = {n: float(n) for n in range(1, 18)}   # verification never pays


def test_latest_match_takes_the_longest_suffix_then_the_latest_occurrence():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3]
    # suffix [2, 3] occurs at 1 and 5; the 3-token suffix [5, 2, 3] nowhere earlier
    assert lookup_ceiling.latest_match(seq) == 7
    assert lookup_ceiling.latest_match([1, 2, 3, 4]) == -1


def test_longest_copy_finds_the_stretch_anywhere_in_the_context():
    assert lookup_ceiling.longest_copy([5, 6, 7, 8, 1], [6, 7, 8, 2]) == 3
    assert lookup_ceiling.longest_copy([5, 6, 7], [9, 6]) == 0


def test_ceilings_on_a_repeated_passage():
    passage = list(range(100, 120))
    prompt = [1, 2] + passage + [3]
    output = passage[:]                          # the answer repeats the passage
    # free verification: any-copy takes the passage in 16 + 4 token bites: 20 tokens / 2 passes
    assert lookup_ceiling.ceiling(prompt, output, FLAT, "any-copy") == pytest.approx(10.0)
    # the suffix rule needs two tokens of the passage before it can match
    assert 1.0 < lookup_ceiling.ceiling(prompt, output, FLAT, "oracle-k") < 10.0
    # when a batch costs as much as its tokens one by one, nothing can be gained
    assert lookup_ceiling.ceiling(prompt, output, LINEAR, "any-copy") == pytest.approx(1.0)
    # nothing to copy: one pass per token
    assert lookup_ceiling.ceiling([1, 2, 3], [50, 51, 52], FLAT, "any-copy") == pytest.approx(1.0)


def test_multiturn_ceiling_rules_on_hand_made_proposals():
    """The oracle takes each proposal as far as it is right; the in-sample rule learns that
    a proposal kind fails and stops verifying it; own confidences are believed as given."""
    right = lambda k: [dict(src="lookup", key=2, conf=[0.9] * 4, ok=k)]
    conv = dict(id="c", category="x", n=10, gaps=[5.0] * 10,
                props=[right(4), [], [], [], [], right(4), [], [], [], []])
    cost = multiturn_ceiling.interpolate({16: 1.0}, 16)           # verification free
    res = multiturn_ceiling.price([conv], cost)
    # two passes of 5 tokens each: 10 tokens in 2 passes
    assert res["oracle"]["x"] == [pytest.approx(5.0)]
    assert res["informed"]["x"] == [pytest.approx(5.0)]
    assert res["conf"]["x"] == [pytest.approx(5.0)]
    wrong = dict(conv, props=[[dict(src="lookup", key=2, conf=[0.9] * 4, ok=0)]] * 10)
    res = multiturn_ceiling.price([wrong], multiturn_ceiling.interpolate({2: 1.5, 16: 8.0}, 16))
    assert res["oracle"]["x"] == [pytest.approx(1.0)]             # nothing right: one-token passes
    assert res["informed"]["x"] == [pytest.approx(1.0)]           # learned (in-sample) that it fails
    assert res["conf"]["x"][0] < 1.0                              # believed the confidences, lost


def test_multiturn_ceiling_interpolates_the_cost_curve():
    c = multiturn_ceiling.interpolate({2: 1.5, 4: 2.0}, 6)
    assert [c[n] for n in range(1, 7)] == pytest.approx([1.0, 1.5, 1.75, 2.0, 2.25, 2.5])


def test_verify_cost_runs_on_a_tiny_model(bpe_target):
    out = subprocess.run([sys.executable, os.path.join(BENCH, "verify_cost.py"), "--model", str(bpe_target),
                          "--sizes", "1,2,4", "--repeats", "1", "--threads", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and line.split()[0] in ("1", "2", "4")]
    assert [r[0] for r in rows] == ["1", "2", "4"] and all(float(r[1]) > 0 for r in rows)


def test_sampling_cost_times_every_loop_this_cpu_runs(bpe_target):
    from fastspec import _core
    out = subprocess.run([sys.executable, os.path.join(BENCH, "sampling_cost.py"), "--model", str(bpe_target),
                          "--repeats", "2", "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[1].split()
    assert header[0] == "setting" and sorted(header[1:]) == sorted(_core._vec_paths()[1])
    rows = [line.rsplit(None, len(header) - 1) for line in lines[2:]]
    assert len(rows) == 6 and all(float(x) > 0 for r in rows for x in r[1:])
    assert rows[0][0].startswith("greedy")


def test_verify_cost_curve_per_context_length(bpe_target):
    """--context: one curve per number of cached tokens (attention makes each row dearer as
    the context grows); bad values are refused by name."""
    run = lambda *a: subprocess.run([sys.executable, os.path.join(BENCH, "verify_cost.py"), "--model",
                                     str(bpe_target), "--sizes", "1,2", "--repeats", "1", "--threads", "1", *a],
                                    capture_output=True, text=True, timeout=120)
    out = run("--context", "20,60")
    assert out.returncode == 0, out.stderr
    heads = [line for line in out.stdout.splitlines() if line.startswith("-- after")]
    assert heads == ["-- after 20 cached tokens", "-- after 60 cached tokens"]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and line.split()[0] in ("1", "2")]
    assert [r[0] for r in rows] == ["1", "2", "1", "2"] and all(float(r[1]) >= 0 for r in rows)
    for bad in ("0", "x", "20,", "100000000"):
        out = run("--context", bad)
        assert out.returncode == 2 and "--context" in out.stderr


def test_verify_cost_compares_two_builds(bpe_target):
    """--cores: two builds of the compiled core loaded in one process (here the installed one twice,
    under two module names), the same passes timed on each in turn; per build the medians, the
    ratio to the first build and to the smallest batch.  --core loads a build in place of the
    installed one; bad values are refused by name."""
    from fastspec import _core
    run = lambda *a: subprocess.run([sys.executable, os.path.join(BENCH, "verify_cost.py"), "--model",
                                     str(bpe_target), "--sizes", "1,2", "--repeats", "2", "--threads", "1",
                                     "--context", "20", *a], capture_output=True, text=True, timeout=240)
    core = _core.__file__
    out = run("--cores", f"{core},{core}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    blocks = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert len(blocks) == 2
    for i in blocks:
        rows = [lines[i + 2].split(), lines[i + 3].split()]
        assert [r[0] for r in rows] == ["1", "2"] and all(float(r[1]) >= 0 and float(r[2]) > 0 for r in rows)
        assert float(rows[0][3]) == 1.0
    assert all(float(lines[blocks[0] + k].split()[2]) == 1.0 for k in (2, 3))   # the first against itself
    for bad in ((f"{core}",), (f"{core},/no/such/_core.so",), (f"{core},{core}", "--drift")):
        out = run("--cores", *bad)
        assert out.returncode == 2 and "--cores" in out.stderr
    out = run("--core", core)
    assert out.returncode == 0 and " n   ms/pass" in out.stdout, out.stderr
    out = run("--core", "/no/such/_core.so")
    assert out.returncode != 0 and "--core" in out.stderr


def test_target_confidence_runs_on_a_tiny_pair(bpe_pair):
    """bench/target_confidence.py: per built-in prompt the target's mean top-1 probability over
    its answer and the draft's agreement with it, then their correlation; bad values refused."""
    target, draft, _ = bpe_pair
    run = lambda *a: subprocess.run([sys.executable, os.path.join(BENCH, "target_confidence.py"), "--target",
                                     str(target), "--draft", str(draft), "--threads", "1", *a],
                                    capture_output=True, text=True, timeout=240)
    out = run("--tokens", "4", "--head", "2")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "draft agrees" in line]
    assert len(lines) >= 10
    for line in lines:
        p, agree = float(line.split("top-1 p ")[1].split()[0]), float(line.split("draft agrees ")[1])
        assert 0.0 < p <= 1.0 and agree == 1.0      # the identical draft agrees everywhere
    assert out.stdout.splitlines()[-1].startswith("correlation")
    for bad in (("--tokens", "1"), ("--head", "0"), ("--tokens", "4", "--head", "5")):
        assert run(*bad).returncode == 2


def whatif(pair_paths, tmp_path, *extra):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "a", "prompt": "once upon a time there was"}\n'
                       '{"category": "b", "prompt": "the quick brown fox"}\n')
    target, draft = pair_paths
    out = subprocess.run([sys.executable, os.path.join(BENCH, "policy_whatif.py"), "--target", str(target),
                          "--draft", str(draft), "--prompts", str(prompts), "--max-tokens", "40", *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_policy_whatif_is_deterministic_and_accounts_like_the_target_alone(bpe_pair, tmp_path):
    target, same, _ = bpe_pair
    # a draft token dearer than a target pass: never run, so the passes are the target alone's
    never = whatif((target, same), tmp_path, "--t1-ms", "100", "--verify", "2:120,8:200", "--draft-ms", "200")
    assert never.splitlines()[-1].endswith(" 1.000x")
    # an identical draft nearly free to run: used, and by the same accounting it pays
    cheap = ("--t1-ms", "100", "--verify", "2:105,4:110,8:120,16:140", "--draft-ms", "5")
    first = whatif((target, same), tmp_path, *cheap)
    assert float(first.splitlines()[-1].split()[-1].rstrip("x")) > 1.5
    assert whatif((target, same), tmp_path, *cheap) == first      # no timing in it: the same every run
    # a fixed length (what the policy is compared with) proposes that many every pass
    fixed = whatif((target, same), tmp_path, *cheap, "--n-draft", "3")
    rows = [ln.split() for ln in fixed.splitlines()[2:-2]]
    assert rows and all(int(r[2]) > 0 and int(r[2]) % 3 == 0 for r in rows if int(r[1]) > 3)
    # attention priced per cached token: the same passes cost more, the target alone's too
    attn = whatif((target, same), tmp_path, *cheap, "--attn-us", "50")
    assert "attention 50 us" in attn.splitlines()[0]
    assert float(attn.splitlines()[-1].split()[-1].rstrip("x")) > 1.0


def test_policy_whatif_takes_a_bench_runs_costs_with_its_catch_up(bpe_pair, tmp_path):
    """--costs: the target's and draft's costs a bench run measured, and the draft's
    catch-up per token the run's cost model learned (the priors where it learned none)."""
    target, same, _ = bpe_pair
    adv = {"t_target_1": 0.1, "verify_cost": {"2": 1.05, "4": 1.1, "8": 1.2, "16": 1.4}, "t_draft": 0.005}
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"advice": {**adv, "t_catchup": 0.002}}))
    head = whatif((target, same), tmp_path, "--costs", str(run)).splitlines()[0]
    assert "t1 100.0 ms" in head and "draft token 5.0 ms" in head and "catch-up 2.0 ms/token" in head
    assert "verify 1: 100, 2: 105, 4: 110, 8: 120, 16: 140 ms" in head
    run.write_text(json.dumps({"advice": {**adv, "t_catchup": None}}))
    assert "catch-up the priors" in whatif((target, same), tmp_path, "--costs", str(run)).splitlines()[0]
    assert "catch-up 3.0 ms/token" in whatif((target, same), tmp_path, "--costs", str(run),
                                               "--catchup-ms", "3").splitlines()[0]
    # --costs-of: those one measurement's policy held (its pace, its ratios), not the advice's
    cell = {"t1": 0.05, "verify": {"2": 1.1, "4": 1.2}, "draft": 0.2}
    run.write_text(json.dumps({"advice": {**adv, "t_catchup": 0.002}, "measurements": [
        {"prompt_id": "7", "mode": "draft", "policy": {"costs": {**cell, "t1": 0.07}}},
        {"prompt_id": "7", "mode": "draft", "round": 2, "policy": {"costs": cell}}]}))
    head = whatif((target, same), tmp_path, "--costs", str(run), "--costs-of", "7:draft:2").splitlines()[0]
    assert "t1 50.0 ms" in head and "draft token 10.0 ms" in head and "verify 1: 50, 2: 55, 4: 60 ms" in head
    assert "t1 70.0 ms" in whatif((target, same), tmp_path, "--costs", str(run),
                                  "--costs-of", "7:draft").splitlines()[0]
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "policy_whatif.py"), "--costs", str(run),
                          "--costs-of", "7:combined"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no measurement '7:combined'" in bad.stderr


def test_policy_whatif_multi_turn_feeds_the_first_turns_to_a_corpus(bpe_pair, tmp_path):
    target, same, _ = bpe_pair
    prompts = tmp_path / "mt.jsonl"
    prompts.write_text('{"question_id": 1, "category": "a", "turns": ["once upon a time", "and then"]}\n'
                       '{"question_id": 2, "category": "b", "turns": ["the quick brown fox", "again"]}\n'
                       '{"question_id": 3, "category": "b", "prompt": "one turn only"}\n')
    args = [sys.executable, os.path.join(BENCH, "policy_whatif.py"), "--target", str(target), "--draft", str(same),
            "--prompts", str(prompts), "--max-tokens", "30", "--multi-turn",
            "--t1-ms", "100", "--verify", "2:105,4:110,8:120,16:140", "--draft-ms", "50"]
    runs = [subprocess.run(args, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout                       # deterministic
    lines = runs[0].stdout.splitlines()
    assert [x.split()[0] for x in lines[2:4]] == ["1", "2"]        # the two-turn prompts only
    assert lines[-2].startswith("by category: a ") and " b " in lines[-2]
    one = tmp_path / "one.jsonl"
    one.write_text('{"category": "a", "prompt": "no second turn"}\n')
    args[args.index(str(prompts))] = str(one)
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "two turns" in out.stderr


@pytest.mark.parametrize("type_name", sorted(random_weights.BLOCKS))
def test_random_blocks_dequantize_to_small_finite_weights(type_name):
    """Every quantized type the script fills dequantizes (by the gguf package's reference code)
    to weights of spread about 0.02 and mean near 0, none of them inf or nan."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants
    blocks = random_weights.random_blocks(type_name, 128, np.random.default_rng(1))
    assert blocks.shape == (128, random_weights.BLOCKS[type_name][0])
    w = quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name])
    assert w.size == 128 * random_weights.BLOCKS[type_name][1]
    assert bool(np.isfinite(w).all())
    assert 0.01 < float(w.std()) < 0.04 and abs(float(w.mean())) < 0.01


def test_random_weights_keeps_the_layout_and_loads(bpe_target, tmp_path):
    """One step and layout-then-fill write the same file: the source's header byte for byte,
    its size, its tensors; the model loads and decodes to finite logits."""
    from fastspec import _core
    script = os.path.join(BENCH, "random_weights.py")
    one = tmp_path / "one.gguf"
    out = subprocess.run([sys.executable, script, str(bpe_target), str(one), "--seed", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    prefix = tmp_path / "plan"
    for args in (["layout", str(bpe_target), str(prefix)], ["fill", str(prefix), str(tmp_path / "two.gguf"),
                                                            "--seed", "3"]):
        out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    src, a, b = (p.read_bytes() for p in (bpe_target, one, tmp_path / "two.gguf"))
    assert a == b and len(a) == len(src)
    header = (prefix.parent / "plan.header").read_bytes()
    assert src[:len(header)] == a[:len(header)] and a != src        # same header, other weights
    assert not (tmp_path / "one.gguf.layout.json").exists()          # the one-step plan is removed
    model = _core.Model(str(one))
    ctx = _core.Context(model, n_ctx=128, n_threads=1)
    ctx.decode(model.tokenize("once upon a time", add_special=False))
    assert np.isfinite(ctx.get_logits()).all()
    ctx.close()
    model.close()


def test_draft_cost_reports_bare_and_loop_costs(bpe_pair):
    target, _, draft = bpe_pair
    out = subprocess.run([sys.executable, os.path.join(BENCH, "draft_cost.py"), "--target", str(target),
                          "--draft", str(draft), "--tokens", "24", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    bare = [ln for ln in lines if ln.startswith("bare one-token draft decode")]
    assert len(bare) == 2 and all(float(ln.split("median ")[1].split()[0]) > 0 for ln in bare)
    loop = [ln for ln in lines if "a drafted token in the loop" in ln]
    assert [ln.split()[0] for ln in loop] == ["draft_vocab=None", "draft_vocab='auto'"]
    assert any(ln.startswith("target alone / adaptive, alternately") for ln in lines)


def test_draft_window_compares_a_windowed_reading_with_all_of_it(bpe_pair, tmp_path):
    """bench/draft_window.py: the twin draft, teacher-forced on the target's own answer,
    agrees nearly everywhere once it has read the whole prompt; a prompt longer than the
    head and the window counts in the overall line, a short one does not."""
    target, same, _ = bpe_pair
    long = " ".join(["the quick brown fox jumps over the lazy dog and the cat sat on the mat"] * 8)
    prompts = tmp_path / "w.jsonl"
    prompts.write_text(json.dumps({"id": "long", "category": "a", "prompt": long}) + "\n"
                       + json.dumps({"id": "short", "category": "a", "prompt": "once upon a time"}) + "\n")
    out = subprocess.run([sys.executable, os.path.join(BENCH, "draft_window.py"), "--target", str(target),
                          "--draft", str(same), "--prompts", str(prompts), "--max-tokens", "24",
                          "--windows", "8,0", "--at", "4"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:] if line.split()[0] in ("long", "short")}
    windowed, whole = (float(x) for x in rows["long"][-2:])
    assert 0.0 <= windowed <= 1.0 and whole >= 0.8
    overall = [line for line in out.stdout.splitlines() if line.startswith("overall at 4")]
    assert len(overall) == 1                            # the long prompt's figures alone
    assert float(overall[0].split()[-1]) == pytest.approx(whole, abs=0.006)
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "draft_window.py"), "--windows", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "comma-separated" in bad.stderr


def test_compare_fastspec_settings_each_read_the_prompt(bpe_pair, monkeypatch):
    """compare_fastspec.py runs a prompt's settings on one decoder: each speculative one starts
    with an empty draft cache (else settings after the first get the draft's read of the prompt
    for free, and look faster than a single request with them is); the target alone leaves it."""
    import fastspec
    target, draft, _ = bpe_pair
    with fastspec.SpeculativeDecoder(str(target), str(draft), n_ctx=256) as dec:
        prompt = "the quick brown fox jumps over the lazy dog " * 3
        held = []
        generate = dec.generate

        def spy(*a, **kw):
            held.append(dec._draft_ctx.n_past)
            return generate(*a, **kw)
        monkeypatch.setattr(dec, "generate", spy)
        for kwargs in (dict(n_draft=4), dict(n_draft=2), dict(n_draft="auto")):
            r = compare_fastspec.fs_generate(dec, prompt, 8, kwargs)
            assert r["n"] > 0
            if kwargs["n_draft"] != "auto":
                assert dec._draft_ctx.n_past > 0                 # a fixed length drafts: it read the prompt
        compare_fastspec.fs_generate(dec, prompt, 8, dict(speculative=False))
        assert held[:3] == [0, 0, 0] and held[3] > 0


def test_policy_whatif_as_bench_replays_the_other_modes_without_counting_them(bpe_pair, tmp_path):
    """--as-bench runs, around each counted generation, what the bench's shared decoder runs
    there (the target alone, the other speculative mode): repeatable, one row per prompt,
    and those generations are not in the accounting (a never-run draft is still 1.000x)."""
    target, same, _ = bpe_pair
    never = whatif((target, same), tmp_path, "--t1-ms", "100", "--verify", "2:120,8:200", "--draft-ms", "200",
                   "--as-bench")
    assert never.splitlines()[-1].endswith(" 1.000x")
    cheap = ("--t1-ms", "100", "--verify", "2:105,4:110,8:120,16:140", "--draft-ms", "5", "--as-bench")
    first = whatif((target, same), tmp_path, *cheap)
    assert len(first.splitlines()) == 2 + 2 + 2
    assert whatif((target, same), tmp_path, *cheap) == first
    assert float(first.splitlines()[-1].split()[-1].rstrip("x")) > 1.5
    assert whatif((target, same), tmp_path, *cheap, "--lookup").splitlines()[-1].endswith("x")


def test_compare_peers_fastspec_worker(bpe_pair):
    """The fastspec side of bench/compare_peers.py, in its own process: its lookup and draft
    modes give the target alone's tokens (greedy), all stop at max_tokens, and the timing
    covers the tokens after the first piece."""
    target, draft, _ = bpe_pair
    cfg = dict(target=str(target), draft=str(draft), n_ctx=256, threads=1)
    w = compare_peers.Worker("fastspec", sys.executable, compare_peers.FASTSPEC_WORKER, cfg)
    try:
        prompt = list(range(5, 40)) * 2
        alone = w.run("target", prompt, 12)
        others = [w.run(mode, prompt, 12) for mode in ("lookup", "draft")]
    finally:
        w.close()
    assert len(alone["tokens"]) == 12
    for r in [alone] + others:
        assert r["tokens"] == alone["tokens"]
        assert 1 <= r["n_first"] < 12 and r["t_last"] > r["t_first"] and r["tok_s"] > 0


def test_compare_peers_names_a_worker_that_cannot_start(tmp_path):
    """An interpreter without the peer library: a clear stop naming it, not a hang."""
    with pytest.raises(SystemExit, match="llama-cpp-python worker did not start"):
        compare_peers.Worker("llama-cpp-python", sys.executable, "import llama_cpp_is_not_here",
                             dict(target=str(tmp_path / "none.gguf")))


def test_compare_peers_wants_a_peer():
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "compare_peers.py")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--lcp-python and/or --hf-python" in bad.stderr


def test_interleave_cost_times_each_model_after_either(bpe_pair):
    """Every target pass size after a target pass, after one and after three draft decodes,
    and a draft decode after either model: each a positive time, each ratio to its first
    column; bad arguments are refused."""
    target, _, draft = bpe_pair
    script = os.path.join(BENCH, "interleave_cost.py")
    out = subprocess.run([sys.executable, script, "--target", str(target), "--draft", str(draft),
                          "--rounds", "3", "--max-k", "3", "--threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = [ln.split() for ln in lines if ln.strip()[:1].isdigit() and "token" in ln]
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    for r in rows:
        after_target, after_one, after_three = float(r[2]), float(r[3]), float(r[5])
        assert min(after_target, after_one, after_three) > 0
        ratio = float(r[4].strip("()x"))          # of the unrounded times: the printed ones are
        assert ratio == pytest.approx(after_one / after_target,   # rounded to 0.0005 ms
                                      abs=0.001 + 0.0005 * (1 + ratio) / after_target)
    (d,) = [ln for ln in lines if ln.startswith("draft decode")]
    assert float(d.split("after a draft decode ")[1].split()[0]) > 0
    bad = subprocess.run([sys.executable, script, "--target", str(target), "--draft", str(draft), "--rounds", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds" in bad.stderr


def test_advice_reread_sets_the_best_advised_against_the_best_measured(tmp_path, capsys):
    """Per category the best of the advised modes against the best measured one (the target
    alone's 1.0 included); the run's end costs from its stored advice; a file without advice
    is named as such, not read as one."""
    import math
    doc = dict(summary=dict(by_category=dict(
        code=dict(target=dict(speedup=1.0), draft=dict(speedup=1.25), lookup=dict(speedup=1.1)),
        chat=dict(target=dict(speedup=1.0), draft=dict(speedup=0.95)))))
    advice = dict(categories=dict(code=dict(predicted_speedup=1.4, lookup_predicted_speedup=1.05),
                                  chat=dict(predicted_speedup=0.9), note="not a category"))
    e = advice_reread.errors(doc, advice)
    assert e == pytest.approx({"code": math.log(1.4 / 1.25), "chat": math.log(0.9 / 1.0)})
    stored = dict(t_target_1=0.03, verify_cost={"1": 1.0, "4": 1.5}, t_draft=0.009, t_catchup=0.002)
    assert advice_reread.run_end_costs(dict(advice=stored)) == dict(
        times={1: 0.03, 4: pytest.approx(0.045)}, t_draft=0.009, t_catchup=0.002)
    assert advice_reread.run_end_costs(dict(advice=None)) is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(doc, advice=None, measurements=[])))
    advice_reread.main([str(path)])
    assert "no advice stored" in capsys.readouterr().out
