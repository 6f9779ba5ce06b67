"""Ctrl-C, logging, and model-name resolution."""
import _thread
import logging
import threading
import warnings

import pytest

import fastspec
from fastspec import _core, models


def test_ctrl_c_stops_generation_and_decoder_stays_usable(bpe_pair):
    target, same, _ = (str(p) for p in bpe_pair)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dec = fastspec.SpeculativeDecoder(target, same, n_ctx=16384)
    with dec:
        expected = dec.generate("hello world", max_tokens=20, n_draft=4)
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            # long enough (16k tokens) to be running when the interrupt arrives
            for _ in range(20):
                dec.generate("hello world", max_tokens=16000, n_draft=4)
        timer.join()
        again = dec.generate("hello world", max_tokens=20, n_draft=4)
        assert again.tokens == expected.tokens


def test_llama_logs_are_off_by_default_and_can_be_routed(bpe_pair, caplog):
    seen = []
    _core.set_log_level(2, lambda level, text: seen.append(text))
    try:
        _core.Model(str(bpe_pair[0])).close()
    finally:
        fastspec.set_verbosity(None)
    assert any("llama" in t or "model" in t for t in seen)
    seen_after = len(seen)
    _core.Model(str(bpe_pair[0])).close()
    assert len(seen) == seen_after          # silenced again
    fastspec.set_verbosity("info")
    try:
        with caplog.at_level(logging.INFO, logger="fastspec.llama"):
            _core.Model(str(bpe_pair[0])).close()
    finally:
        fastspec.set_verbosity(None)
    assert any(r.name == "fastspec.llama" for r in caplog.records)
    with pytest.raises(ValueError, match="level"):
        fastspec.set_verbosity("loud")


def test_model_resolution(tmp_path, bpe_pair):
    assert models.resolve(str(bpe_pair[0])) == bpe_pair[0]
    with pytest.raises(models.ModelNotFoundError, match="unknown model"):
        models.resolve("no-such-model")
    with pytest.raises(models.ModelNotFoundError, match="not found"):
        models.resolve(str(tmp_path / "missing.gguf"))
    names = {m["name"] for m in models.list_models()}
    assert set(models.DEFAULT_PAIR) <= names


def test_model_not_downloaded_without_download(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTSPEC_CACHE", str(tmp_path))
    with pytest.raises(models.ModelNotFoundError, match="not downloaded"):
        models.resolve("smollm2-135m-instruct-q4_1", download=False)
    assert list(tmp_path.iterdir()) == []
