"""The Arm build's exactness, checked on an x86 machine.

vendor/llama.cpp, with patches/*.patch applied, is cross-built for armv8.2-a with the
dot-product and FP16 extensions (Apple M1's level: ggml repacks Q4_0, Q4_K, Q5_K, Q6_K and
Q8_0 into its 4-byte-group layouts there, and Q4_K's and Q6_K's rows take the NEON kernels
of patches 0038 and 0039) and for armv8.6-a with int8 matrix multiply too (Apple M2's level:
the 8-byte-group layouts; Q4_K's and Q6_K's rows take the kernels of 0040 and 0041), together with
tests/arm_logits.cpp, and run under qemu-aarch64 on tiny random
models in each weight type: logits of a batch of 2..16 tokens must be the bits of the same
tokens decoded one at a time, with and without flash attention and past 600 cached tokens;
and the Q4_K and Q6_K kernels, which serve one-token passes too, must give the stock gemv's
bits for one token.  Q4_0's, Q8_0's and Q5_K's batches take the kernels of 0042–0045 in both
layouts while one token keeps ggml's gemv, so the batched = one-token test compares those
kernels with the gemv itself.  Emulation says nothing about speed.

Needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: ``apt-get install g++-aarch64-linux-gnu
qemu-user``) and the vendored source tree; skipped without them.  The cross build takes a few
minutes the first time for each (kept in build/arm-emulated-*/).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from logit_checks import quantized_models

ROOT = pathlib.Path(__file__).resolve().parent.parent
TREE = ROOT / "vendor" / "llama.cpp"
ARCHS = {"dotprod": "armv8.2-a+dotprod+fp16",             # Apple M1, Cortex-A76: the 8x4 layouts
         "i8mm": "armv8.6-a+dotprod+fp16+i8mm"}          # Apple M2 and later (no SVE): the 8x8 layouts
FTYPE = {"q4_0": 2, "q4_k": 15, "q5_k": 17, "q6_k": 18, "q8_0": 7, "iq4_xs": 30, "q3_k": 12, "q2_k": 10,
         "f16": 1}   # llama_ftype

pytestmark = [
    pytest.mark.emulated,
    pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")),
                       reason="needs aarch64-linux-gnu-g++ and qemu-aarch64"),
    pytest.mark.skipif(not (TREE / "ggml").is_dir(), reason="no vendored llama.cpp source tree"),
]


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module", params=list(ARCHS))
def arm_logits(request):
    """The cross-built harness (libllama and ggml for one of ARCHS, linked statically)."""
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    build = ROOT / "build" / f"arm-emulated-{request.param}"
    arch = ARCHS[request.param]
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", TREE, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_SYSTEM_NAME=Linux",
                 "-DCMAKE_SYSTEM_PROCESSOR=aarch64", "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
                 "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++", "-DGGML_NATIVE=OFF", f"-DGGML_CPU_ARM_ARCH={arch}",
                 "-DGGML_OPENMP=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    if subprocess.run(configure, capture_output=True).returncode != 0:
        shutil.rmtree(build, ignore_errors=True)      # a stale or moved cache: start over once
        _run(configure)
    _run(["cmake", "--build", build, "--target", "llama", "-j", str(os.cpu_count() or 2)], timeout=1800)
    exe = build / "arm_logits"
    libs = [build / "src" / "libllama.a"] + [build / "ggml" / "src" / f"libggml{s}.a" for s in ("", "-cpu", "-base")]
    _run(["aarch64-linux-gnu-g++", "-O2", "-std=c++17", f"-I{TREE / 'include'}", f"-I{TREE / 'ggml' / 'include'}",
          ROOT / "tests" / "arm_logits.cpp", *libs, "-lpthread", "-static", "-o", exe])
    return exe


@pytest.fixture(scope="module", params=[(256, 512), (512, 768)], ids=["w256", "w512"])
def models(tmp_path_factory, request):
    n_embd, n_ff = request.param
    return quantized_models(tmp_path_factory.mktemp("arm"), FTYPE, n_embd=n_embd, n_ff=n_ff)


def _logits(exe, model, prefix, flash_attn=True, out=None, env=None):
    cmd = ["qemu-aarch64", exe, model, str(prefix), "1", "1" if flash_attn else "0"] + ([out] if out else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert r.returncode in (0, 3), r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
@pytest.mark.parametrize("wtype", list(FTYPE))
def test_arm_batched_logits_equal_one_token_logits(arm_logits, models, wtype, flash_attn):
    out = _logits(arm_logits, models[wtype], 0, flash_attn)
    assert out.rstrip().endswith("IDENTICAL") and "40/40" in out, out


@pytest.mark.parametrize("wtype", ["f16", "q4_k"])
def test_arm_past_600_cached_tokens(arm_logits, models, wtype):
    out = _logits(arm_logits, models[wtype], 600)
    assert out.rstrip().endswith("IDENTICAL"), out


@pytest.mark.parametrize("wtype,patch", [("q4_k", "0038 / 0040"), ("q6_k", "0039 / 0041")])
def test_arm_rows_kernel_gives_the_gemv_bits(arm_logits, models, tmp_path, wtype, patch):
    """The rows kernels serve one-token passes too; GGML_CPU_INVARIANT_ROWS=0 takes ggml's
    gemv instead (and, with nothing cached past 512, changes nothing else)."""
    ours, stock = tmp_path / "rows.bin", tmp_path / "gemv.bin"
    _logits(arm_logits, models[wtype], 0, out=ours)
    _logits(arm_logits, models[wtype], 0, out=stock, env={"GGML_CPU_INVARIANT_ROWS": "0"})
    a, b = ours.read_bytes(), stock.read_bytes()
    assert len(a) == len(b) > 0
    assert a == b, f"one-token {wtype} logits through {patch}'s kernel differ from the stock gemv's"
