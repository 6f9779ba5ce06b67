"""fastspec._core.Model: loading, metadata, vocabulary, chat templates, bad files."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from fastspec import _core
import tiny_models

ASCII = "hello world, the quick brown fox jumps over the lazy dog 12345!"
UNICODE = "héllo wörld ✓ — naïve café 日本"


@pytest.fixture(scope="module")
def bpe_model(bpe_pair):
    m = _core.Model(str(bpe_pair[0]))
    yield m
    m.close()


@pytest.fixture(scope="module")
def spm_model(spm_pair):
    m = _core.Model(str(spm_pair[0]))
    yield m
    m.close()


def test_metadata_and_vocab(bpe_model, spm_model):
    assert bpe_model.vocab_type == "bpe"
    assert spm_model.vocab_type == "spm"
    for m in (bpe_model, spm_model):
        assert m.n_vocab > 256
        assert m.metadata["general.architecture"] == "llama"
        assert "llama" in m.description
        assert m.n_layer == 2 and m.n_embd == 64
        assert m.n_params > 0 and m.size_bytes > 0
        assert 0 <= m.bos < m.n_vocab and 0 <= m.eos < m.n_vocab
        assert m.is_eog(m.eos)
        assert m.eos in m.eog_tokens
        assert not m.is_recurrent


@pytest.mark.parametrize("text", [ASCII, UNICODE, "a", "  two  spaces\nnew line\ttab"])
@pytest.mark.parametrize("kind", ["bpe", "spm"])
def test_tokenize_round_trip(kind, text, bpe_model, spm_model):
    m = bpe_model if kind == "bpe" else spm_model
    toks = m.tokenize(text, add_special=False)
    assert toks and all(0 <= t < m.n_vocab for t in toks)
    assert m.detokenize(toks) == text
    # token pieces concatenate to the same bytes (SPM marks the start of the text with
    # a word-boundary space, which detokenize drops and pieces keep)
    pieces = b"".join(m.token_to_piece(t) for t in toks).decode()
    assert pieces == (" " + text if kind == "spm" else text)


def test_bpe_merges_shorten_text(bpe_model):
    toks = bpe_model.tokenize("hello world", add_special=False)
    assert len(toks) < len("hello world")


def test_add_special_adds_bos(spm_model):
    with_bos = spm_model.tokenize("hello", add_special=True)
    without = spm_model.tokenize("hello", add_special=False)
    assert spm_model.add_bos
    assert with_bos[0] == spm_model.bos and with_bos[1:] == without


def test_token_errors(bpe_model):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bpe_model.token_text(bpe_model.n_vocab)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bpe_model.detokenize([0, -1])


def test_chat_template(bpe_model, spm_model):
    assert "im_start" in bpe_model.chat_template()
    text = bpe_model.apply_chat_template([{"role": "user", "content": "hi there"}])
    assert "<|im_start|>user\nhi there<|im_end|>" in text
    assert text.rstrip().endswith("<|im_start|>assistant")
    with pytest.raises(ValueError, match="no chat template"):
        spm_model.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="role"):
        bpe_model.apply_chat_template([{"content": "no role"}])


def test_vocab_differences(bpe_pair, spm_pair, bpe_model):
    other = _core.Model(str(bpe_pair[2]))
    assert bpe_model.vocab_differences(other) == []
    spm = _core.Model(str(spm_pair[0]))
    diffs = bpe_model.vocab_differences(spm)
    assert diffs and "types differ" in diffs[0]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        _core.Model(str(tmp_path / "nope.gguf"))


def test_directory(tmp_path):
    with pytest.raises(IsADirectoryError):
        _core.Model(str(tmp_path))


def test_not_gguf(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"this is not a model at all" * 10)
    with pytest.raises(ValueError, match="not a GGUF file"):
        _core.Model(str(p))


def test_truncated_gguf(tmp_path, bpe_pair):
    p = tiny_models.write_truncated(bpe_pair[0], tmp_path / "cut.gguf", keep_fraction=0.5)
    with pytest.raises(ValueError, match="could not load"):
        _core.Model(str(p))


def test_closed_model(bpe_pair):
    m = _core.Model(str(bpe_pair[0]))
    m.close()
    m.close()  # twice is fine
    assert m.closed
    with pytest.raises(RuntimeError, match="closed"):
        m.tokenize("hi")
    with pytest.raises(RuntimeError, match="closed"):
        _core.Context(m)


def test_closing_a_model_before_its_contexts(bpe_pair):
    """A Model closed while Contexts made from it are open is closed to its caller at once,
    but its weights stay until the last of them is closed (a context's teardown reads its
    model): those contexts keep decoding, the same logits as before."""
    m = _core.Model(str(bpe_pair[0]), n_gpu_layers=0)
    toks = m.tokenize("the quick brown fox", add_special=False)
    a, b = _core.Context(m, n_ctx=64, n_threads=1), _core.Context(m, n_ctx=64, n_threads=1)
    a.decode(toks)
    want = a.get_logits().copy()
    m.close()
    assert m.closed
    with pytest.raises(RuntimeError, match="closed"):
        m.tokenize("hi")
    with pytest.raises(RuntimeError, match="closed"):
        _core.Context(m)
    a.close()
    b.decode(toks)                      # the weights are still there for b
    assert (b.get_logits() == want).all()
    b.close()
    m.close()                           # and freed now; closing again changes nothing
    assert m.closed


def test_a_decoder_closed_before_the_one_it_lent_models_to(bpe_pair):
    """Decoders sharing models may be closed in any order: the borrower then says it is
    closed, and its contexts are freed before the weights they read."""
    import fastspec
    target, draft = map(str, bpe_pair[:2])
    lender = fastspec.SpeculativeDecoder(target, draft, n_ctx=128, n_threads=1, n_gpu_layers=0)
    borrower = fastspec.SpeculativeDecoder(lender.target_model, lender.draft_model, n_ctx=128, n_threads=1)
    assert borrower.generate("the quick", max_tokens=8).tokens == lender.generate("the quick", max_tokens=8).tokens
    lender.close()
    assert lender.target_model.closed and lender.draft_model.closed
    with pytest.raises(RuntimeError, match="closed"):
        borrower.generate("the quick", max_tokens=8)
    borrower.close()
    borrower.close()


def test_the_greedy_pick_is_the_first_maximum_and_its_gap_the_runner_up():
    """The loop's argmax (vector lanes, then the first index holding the maximum) agrees with
    numpy's on every length around the lane width, with ties (the first wins, the gap is 0)
    and NaNs (passed over)."""
    import numpy as np
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 15, 16, 17, 31, 32, 33, 1000, 151936):
        for trial in range(12):
            x = rng.standard_normal(n).astype(np.float32)
            if trial % 3 == 1 and n > 2:
                x[rng.integers(n)] = x.max()                       # a tie for the maximum
            if trial % 4 == 2 and n > 3:
                x[rng.integers(n)] = np.nan
            a, b, gap = _core._argmax_f32(x)
            clean = np.where(np.isnan(x), -np.inf, x)
            assert a == b == int(np.argmax(clean))
            top2 = np.sort(clean)[-2:]
            assert gap == (float(top2[1] - top2[0]) if n > 1 else 0.0)
    tied = np.array([1.0, 5.0, 2.0, 5.0], dtype=np.float32)
    assert _core._argmax_f32(tied) == (1, 1, 0.0)
    with pytest.raises(ValueError):
        _core._argmax_f32(np.zeros(0, dtype=np.float32))


def test_on_gpu_says_whether_the_layers_are_offloaded(bpe_target):
    """Model.on_gpu: layers on a GPU backend; never with n_gpu_layers=0, never on a build or
    machine without one (the calibration's warm-ups and draft_vocab's rule follow it)."""
    for n_gpu_layers, want in ((0, False), (-1, _core.supports_gpu_offload())):
        m = _core.Model(str(bpe_target), n_gpu_layers=n_gpu_layers)
        assert m.on_gpu is want
        m.close()


def _huge_page_advised_mappings(model_path: str, env: dict) -> int:
    """In a fresh process: load the model and make a context whose KV cache is 8 MiB; the
    number of mappings the kernel shows as advised for huge pages (VmFlags ``hg``)."""
    code = textwrap.dedent("""
        import sys
        from fastspec import _core
        m = _core.Model(sys.argv[1])
        assert m.use_mmap is False, m.use_mmap
        c = _core.Context(m, n_ctx=16384, n_threads=1)
        flags = [line.split()[1:] for line in open("/proc/self/smaps") if line.startswith("VmFlags:")]
        print(sum("hg" in f for f in flags))
    """)
    out = subprocess.run([sys.executable, "-c", code, model_path], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or _core.supports_gpu_offload()
                    or not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
                    reason="CPU models load without mmap, into huge-page buffers, on Linux with THP only")
def test_cpu_models_load_into_huge_page_buffers(bpe_pair):
    # patch 0035: a buffer of 4 MiB or more asks for transparent huge pages (whether the kernel
    # then grants them depends on its setting and free memory; the advice is what ggml does)
    env = {k: v for k, v in os.environ.items() if k != "GGML_HUGE_PAGES"}
    assert _huge_page_advised_mappings(str(bpe_pair[0]), env) >= 1
    assert _huge_page_advised_mappings(str(bpe_pair[0]), dict(env, GGML_HUGE_PAGES="0")) == 0


def test_use_mmap_default_and_override(bpe_pair):
    m = _core.Model(str(bpe_pair[0]), use_mmap=True)
    assert m.use_mmap is True
    m.close()
    m = _core.Model(str(bpe_pair[0]), use_mmap=False)
    assert m.use_mmap is False
    m.close()
    m = _core.Model(str(bpe_pair[0]))
    # the default maps the file except for a CPU model on Linux
    assert m.use_mmap is (not sys.platform.startswith("linux") or m.on_gpu)
    m.close()


def _exported_symbols(path: str) -> list[str] | None:
    """The dynamic symbols a shared object defines (``nm -D --defined-only``), or None where
    that cannot be read here (not ELF, no nm)."""
    nm = shutil.which("nm")
    if nm is None or not sys.platform.startswith("linux"):
        return None
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
    r = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return [line.split()[-1] for line in r.stdout.splitlines() if line.strip()]


def test_the_extension_exports_only_its_entry_point():
    # CMakeLists.txt links with --exclude-libs,ALL: llama.cpp, ggml and a C++ runtime that a
    # toolchain links statically stay inside the module.  Exported, a static libstdc++'s unique
    # symbols were merged with the shared libstdc++ that numpy had loaded, and loading a model
    # died with SIGSEGV on an H200's image (its g++ links libstdc++.a); with them hidden the
    # same build loaded (docs/measurements.md, fifty-fifth session)
    names = _exported_symbols(_core.__file__)
    if names is None:
        pytest.skip("needs an ELF build and nm")
    assert "PyInit__core" in names
    leaked = [n for n in names if n.startswith(("_Z", "llama_", "ggml_", "gguf_"))]
    assert leaked == [], f"{len(leaked)} C/C++ symbols exported, e.g. {leaked[:5]}"


def test_a_model_loads_after_numpy_was_imported(bpe_target):
    # the process of that crash: numpy (and the libstdc++ it brings) imported before the core
    code = textwrap.dedent("""
        import sys
        import numpy
        from fastspec import _core
        m = _core.Model(sys.argv[1], n_gpu_layers=0)
        ctx = _core.Context(m, n_ctx=256)
        ctx.decode(m.tokenize("hello world"))
        print("decoded", ctx.n_past)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(bpe_target)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("decoded ")


def test_amx_only_where_asked_for():
    """cmake/amx_probe.cmake: ggml's AMX kernels take quantized weights away from the
    verification kernels and slow speculative decoding down, so a build keeps them only when
    asked (FASTSPEC_AMX=ON) and a probe built like ggml's runs; whatever was decided is what
    ggml was compiled with (its own feature list says AMX_INT8 only when it has the kernels)."""
    info = _core.system_info()
    assert ("AMX_INT8 = 1" in info) == _core.amx_kept()
    if "FASTSPEC_AMX" not in os.environ.get("CMAKE_ARGS", ""):
        # (a test run beside a build that was not told about AMX, as .ci/run's)
        assert not _core.amx_kept(), "built with AMX kernels without FASTSPEC_AMX=ON"
