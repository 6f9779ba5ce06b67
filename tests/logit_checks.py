"""Batched logits against one-token logits, bit for bit: shared by the CPU and CUDA
invariance tests."""
from __future__ import annotations

import numpy as np
import pytest

import tiny_models
from fastspec import _core


def quantized_models(directory, ftypes, *, n_embd, n_ff):
    """One tiny random model (seed 3, 4 heads, 2 KV heads, 2 layers), written in f32 and
    quantized to each of ``ftypes`` ({name: llama_ftype}; every tensor, the output too)."""
    src = tiny_models.write_tiny_llama(directory / "f32.gguf", seed=3, n_embd=n_embd, n_head=4, n_head_kv=2,
                                       n_ff=n_ff, n_layer=2, out_std=0.1)
    out = {}
    for name, ftype in ftypes.items():
        dst = directory / f"{name}.gguf"
        _core.quantize(str(src), str(dst), ftype, pure=True, quantize_output=True)
        out[name] = dst
    return out


def one_token_logits(ctx, tokens, prefix=()):
    """Logits of each of ``tokens`` decoded one at a time after ``prefix`` (one batch)."""
    ctx.clear()
    if prefix:
        ctx.decode(prefix)
    ref = []
    for t in tokens:
        ctx.decode([t])
        ref.append(ctx.get_logits().copy())
    return ref


def check_chunks(ctx, tokens, ref, sizes, what, prefix=()):
    """Decode ``tokens`` after ``prefix`` in chunks of each size, logits at every position, and
    fail unless every row is bit-identical to its one-token reference."""
    for n in sizes:
        ctx.clear()
        if prefix:
            ctx.decode(prefix)
        for i in range(0, len(tokens), n):
            chunk = tokens[i:i + n]
            ctx.decode(chunk, logits="all")
            for j in range(len(chunk)):
                got = ctx.get_logits(j)
                if not np.array_equal(got, ref[i + j]):
                    diff = float(np.max(np.abs(got - ref[i + j])))
                    pytest.fail(f"{what}: chunks of {n}, position {i + j}: batched logits differ "
                                f"from one-token logits by up to {diff:g}")


def check_random_chunks(ctx, n_vocab, seed, n_prefix, n_tokens, sizes, what):
    """Random tokens after a random prefix: their one-token logits, then the chunk check."""
    rng = np.random.default_rng(seed)
    prefix = [int(t) for t in rng.integers(0, n_vocab, n_prefix)]
    tokens = [int(t) for t in rng.integers(0, n_vocab, n_tokens)]
    ref = one_token_logits(ctx, tokens, prefix)
    assert np.ptp(ref[-1]) > 0
    check_chunks(ctx, tokens, ref, sizes, what, prefix)
