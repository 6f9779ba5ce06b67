"""Ctrl-C, logging, and model-name resolution."""
import _thread
import logging
import signal
import threading
import warnings

import pytest

import fastspec
from fastspec import _core, models


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler, even where the runner was started with SIGINT ignored
    (a background job of a non-interactive shell): then interrupt_main() would do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_generation_and_decoder_stays_usable(bpe_pair, sigint_raises):
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


def test_derived_model_is_made_from_its_source_and_recorded(monkeypatch, tmp_path, bpe_pair):
    import hashlib
    import shutil

    monkeypatch.setenv("FASTSPEC_CACHE", str(tmp_path))
    data = bpe_pair[0].read_bytes()
    source = models.ModelSpec(name="tiny-src", filename="tiny-src.gguf", sha256=hashlib.sha256(data).hexdigest(),
                              size_bytes=len(data), role="test", description="tiny source", parts=())
    derived = models.ModelSpec(name="tiny-q8", filename="tiny-q8.gguf", sha256=source.sha256, size_bytes=0,
                               role="test", description="tiny, Q8_0", parts=(),
                               derived=models.Derivation(source="tiny-src", ftype=7, keep_output=True))
    monkeypatch.setitem(models.REGISTRY, "tiny-src", source)
    monkeypatch.setitem(models.REGISTRY, "tiny-q8", derived)
    shutil.copy(bpe_pair[0], tmp_path / "tiny-src.gguf")
    assert not models.is_cached("tiny-q8")
    with pytest.raises(models.ModelNotFoundError, match="not downloaded"):
        models.resolve("tiny-q8", download=False)
    path = models.resolve("tiny-q8", progress=False)
    assert path == tmp_path / "tiny-q8.gguf" and models.is_cached("tiny-q8")
    assert f"sha256 {source.sha256} ftype 7" in (tmp_path / "tiny-q8.gguf.sha256").read_text()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    m = _core.Model(str(path))
    try:
        assert "Q8_0" in m.description and m.n_vocab == _core.Model(str(bpe_pair[0]), vocab_only=True).n_vocab
    finally:
        m.close()
    # a different recipe (here: another source checksum) is not taken for the cached file
    monkeypatch.setitem(models.REGISTRY, "tiny-q8", derived.__class__(**{**derived.__dict__, "sha256": "0" * 64}))
    assert not models.is_cached("tiny-q8")
