"""The cost cache: a decoder's calibrated costs kept on disk and taken back by the next
decoder of the same pair and settings (``fastspec.cost_cache``, ``CostModel.state/restore``)."""
import json

import pytest

import fastspec
from fastspec import _core, cost_cache, models

from test_speculative import same_or_near_tie


def test_cost_model_state_round_trips_through_json():
    c = _core.CostModel()
    assert c.state() == dict(verify={}, context={}, draft=None, catchup=None, catchup_small=None)
    c.set(draft_time=0.01, verify_times={1: 0.03, 2: 0.032, 16: 0.11}, catchup_time=0.002,
          at_context=100, hold=False)
    state = c.state()
    back = _core.CostModel()
    back.restore(json.loads(json.dumps(state)))       # (JSON makes the sizes strings)
    assert back.calibrated and not back.hold
    assert back.state() == state
    assert back.verify_time(16, 100) == pytest.approx(0.11) and back.draft_time == pytest.approx(0.01)
    # the passes after it refine it as they would a calibration's
    back.record_verify(1, 0.06, 100)
    assert back.verify_times[1] > 0.03


@pytest.mark.parametrize("bad", [None, {}, {"verify": {2: 0.1}}, {"verify": {1: -1.0}},
                                 {"verify": {1: 0.1, 40: 1.0}}, {"verify": {1: 0.1}, "draft": "x"},
                                 {"verify": {1: 0.1}, "context": {2: 5}}, {"verify": {1: 0.1}, "catchup": -1}])
def test_a_bad_state_is_refused_and_the_model_left_as_it_was(bad):
    c = _core.CostModel()
    c.set(verify_times={1: 0.03}, hold=False)
    with pytest.raises(ValueError):
        c.restore(bad)
    assert c.verify_times == {1: 0.03} and c.calibrated


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTSPEC_CACHE", str(tmp_path / "models"))
    monkeypatch.delenv("FASTSPEC_COST_CACHE")
    assert cost_cache.default_path() == models.cache_dir() / "costs.json"
    assert cost_cache.resolve(True) == models.cache_dir() / "costs.json"
    for off in ("0", "off", ""):
        monkeypatch.setenv("FASTSPEC_COST_CACHE", off)
        assert cost_cache.resolve(True) is None
    monkeypatch.setenv("FASTSPEC_COST_CACHE", str(tmp_path / "elsewhere.json"))
    assert cost_cache.resolve(True) == tmp_path / "elsewhere.json"
    assert cost_cache.resolve(False) is None and cost_cache.resolve(None) is None
    assert cost_cache.resolve(tmp_path / "x.json") == tmp_path / "x.json"
    with pytest.raises(TypeError):
        cost_cache.resolve(3)
    with pytest.raises(ValueError):
        cost_cache.resolve("")


def test_save_keeps_the_latest_entries_and_survives_a_bad_file(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text("{ not json")
    assert cost_cache.load(path, "k") is None              # unreadable: as if empty
    for i in range(cost_cache.MAX_ENTRIES + 3):
        assert cost_cache.save(path, f"k{i}", {"verify": {"1": 0.03 + i}})
    assert cost_cache.load(path, "k0") is None and cost_cache.load(path, "k2") is None
    assert cost_cache.load(path, f"k{cost_cache.MAX_ENTRIES + 2}") == {"verify": {"1": 0.03 + cost_cache.MAX_ENTRIES + 2}}
    assert len(json.loads(path.read_text())["entries"]) == cost_cache.MAX_ENTRIES
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]     # no temporary file left
    # a place that cannot be written: False, nothing raised
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cost_cache.save(blocker / "costs.json", "k", {"verify": {"1": 0.03}}) is False


def test_a_second_decoder_starts_from_the_first_ones_costs(bpe_pair, tmp_path):
    target, _, other = (str(p) for p in bpe_pair)
    path = tmp_path / "costs.json"
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=path) as dec:
        alone = dec.generate("hello world", max_tokens=24, speculative=False)
        assert not path.exists()                           # nothing timed yet
        first = dec.generate("hello world", max_tokens=24)
        assert first.stats.t_calibrate > 0.0 and not dec.costs_restored
        timed = dec.cost_model.verify_times
    saved = json.loads(path.read_text())["entries"]
    assert len(saved) == 1
    (entry,) = saved.values()
    assert {int(n) for n in entry["costs"]["verify"]} == set(timed) and entry["costs"]["draft"] > 0.0
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=path) as dec:
        again = dec.generate("hello world", max_tokens=24)
        assert dec.costs_restored and again.stats.t_calibrate == 0.0
        assert set(dec.cost_model.verify_times) == set(timed)
        same_or_near_tie(dec, "hello world", again, alone)
    # other settings (threads), another cache: timed again, and kept beside the first
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, n_threads=1, cost_cache=path) as dec:
        assert dec.generate("hello world", max_tokens=24).stats.t_calibrate > 0.0 and not dec.costs_restored
    assert len(json.loads(path.read_text())["entries"]) == 2
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=False) as dec:
        assert dec.generate("hello world", max_tokens=24).stats.t_calibrate > 0.0 and not dec.costs_restored


def test_a_state_without_the_drafts_cost_is_not_taken_for_a_draft_run(bpe_pair, tmp_path):
    """A decoder whose first adaptive run was lookup alone timed no draft token: a draft run
    of the next decoder times everything again rather than run without the draft's cost."""
    target, _, other = (str(p) for p in bpe_pair)
    path = tmp_path / "costs.json"
    # written by hand: a state as a lookup-only run leaves it
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=path) as dec:
        key = dec._costs_key()
    assert cost_cache.save(path, key, {"verify": {"1": 0.01, "2": 0.012}})
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=path) as dec:
        r = dec.generate("hello world", max_tokens=8)
        assert not dec.costs_restored and r.stats.t_calibrate > 0.0
    assert cost_cache.load(path, key)["draft"] > 0.0          # replaced by the full timing
    # a state edited into nonsense: timed again too
    assert cost_cache.save(path, key, {"verify": {"1": -5}, "draft": 0.01})
    with fastspec.SpeculativeDecoder(target, other, n_ctx=512, cost_cache=path) as dec:
        assert dec.generate("hello world", max_tokens=8).stats.t_calibrate > 0.0 and not dec.costs_restored


def test_the_bench_times_costs_itself():
    """The bench's decoders (and the sweep's) measure this machine's costs, not another run's."""
    import argparse

    from fastspec.bench import runner
    args = argparse.Namespace(ctx=512, threads=None, n_gpu_layers=0, batch_invariant=False, draft_vocab="auto")
    assert runner.decoder_kwargs(args)["cost_cache"] is False


def test_one_shot_generate_takes_the_cache_too(bpe_pair, tmp_path):
    target, _, other = (str(p) for p in bpe_pair)
    path = tmp_path / "costs.json"
    first = fastspec.generate("hello world", target=target, draft=other, n_ctx=512, max_tokens=8, cost_cache=path)
    second = fastspec.generate("hello world", target=target, draft=other, n_ctx=512, max_tokens=8, cost_cache=path)
    assert first.stats.t_calibrate > 0.0 and second.stats.t_calibrate == 0.0
