"""Patches 0022-0024: on CUDA, a verification batch of up to ``_core.cuda_invariant_rows()`` (16)
tokens gives, at every position, exactly the logits that decoding the same tokens one at a
time gives (quantized weights through MMVQ with the one-column warps, flash attention through
the vector kernel, one query and one KV tile per block); a decoder whose target is on such a
GPU verifies no more at once, so its greedy output is the target alone's token for token.

The GPU checks need a CUDA build with the patches and a GPU (skipped elsewhere); the first test
runs on every build.  The assertion is bit equality, which the patch guarantees on any NVIDIA
GPU; it says nothing about what a particular GPU computes.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastspec import SpeculativeDecoder, _core
from logit_checks import check_random_chunks, quantized_models

FTYPE = {"q4_k": 15, "q5_k": 17, "q6_k": 18, "q8_0": 7, "q4_0": 2}   # llama_ftype


def test_no_cuda_rows_without_a_cuda_build():
    rows = _core.cuda_invariant_rows()
    assert isinstance(rows, int) and 0 <= rows <= 16
    if not _core.supports_gpu_offload():
        assert rows == 0


def test_head_size_decides_the_cuda_cap(tmp_path):
    """The vector kernel that makes flash attention exact on CUDA takes heads of 64, 128 or
    256 values: a decoder caps its batches for CUDA's exactness only there."""
    import tiny_models
    from fastspec.api import _head_size
    for n_embd, want in ((256, 64), (128, 32)):
        path = tiny_models.write_tiny_llama(tmp_path / f"h{n_embd}.gguf", n_embd=n_embd, n_head=4, n_ff=256)
        model = _core.Model(str(path), n_gpu_layers=0)
        try:
            assert _head_size(model) == want
        finally:
            model.close()


def _cuda_ready() -> bool:
    return _core.supports_gpu_offload() and _core.cuda_invariant_rows() >= 2


gpu = pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA build with patches 0022-0024 and a GPU")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Tiny models in each weight type, head size 64 (the vector kernel's smallest)."""
    return quantized_models(tmp_path_factory.mktemp("cuda-invariance"), FTYPE, n_embd=256, n_ff=512)


def _load_on_gpu(path):
    model = _core.Model(str(path), n_gpu_layers=-1)
    if not model.on_gpu:
        model.close()
        pytest.skip("the model did not go to a GPU")
    return model


@gpu
@pytest.mark.parametrize("wtype", list(FTYPE))
def test_batched_logits_equal_one_token_logits_on_cuda(quantized, wtype):
    """Chunks of 2..16 after a prompt, over 300 positions: the cache's padded length (256 cells
    a step) changes inside some chunks and between a chunk and its one-token references."""
    model = _load_on_gpu(quantized[wtype])
    ctx = _core.Context(model, n_ctx=1024, n_batch=512, flash_attn=True)
    try:
        check_random_chunks(ctx, model.n_vocab, 7, 30, 300, (2, 3, 5, 8, 9, 16), f"{wtype} on CUDA")
    finally:
        ctx.close()
        model.close()


@gpu
def test_decoder_on_cuda_verifies_at_most_the_invariant_rows_and_matches_the_target(quantized):
    dec = SpeculativeDecoder(str(quantized["q4_k"]), n_ctx=1024)
    try:
        assert dec.target_model.on_gpu
        assert dec.max_verify_batch == min(_core.cuda_invariant_rows(), _core.DRAFT_LIMIT + 1)
        prompt = "one two three four five six seven eight nine ten " * 6
        alone = dec.generate(prompt, max_tokens=120, temperature=0.0)
        # the target's own output as the prediction: every proposal holds where the batches are
        # exact, so the passes verify up to max_verify_batch tokens each
        fast = dec.generate(prompt, max_tokens=120, temperature=0.0, prediction=alone.tokens)
        assert fast.tokens == alone.tokens
        assert fast.stats.mean_accepted_length > 1.5
    finally:
        dec.close()


_ENV_SCRIPT = """
import sys
from fastspec import SpeculativeDecoder, _core
dec = SpeculativeDecoder(sys.argv[1], n_ctx=512)
print(_core.cuda_invariant_rows(), dec.max_verify_batch, int(dec.target_model.on_gpu))
dec.close()
"""


@gpu
@pytest.mark.parametrize("value,rows", [("3", 3), ("0", 0), ("99", 16)])
def test_the_environment_sets_the_rows(quantized, value, rows):
    env = dict(os.environ, GGML_CUDA_INVARIANT_ROWS=value)
    r = subprocess.run([sys.executable, "-c", _ENV_SCRIPT, str(quantized["q4_k"])], env=env,
                       capture_output=True, text=True, timeout=180, check=True)
    got_rows, max_batch, on_gpu = (int(x) for x in r.stdout.split()[-3:])
    assert on_gpu == 1
    assert got_rows == rows
    # 0: no exact batch known on this GPU, so no cap (the build's old behaviour on GPUs)
    assert max_batch == (rows if rows >= 2 else 0)
