"""Comparing a greedy output made with batched target passes (speculative verification,
fast mode) against the target alone, without depending on one CPU's floating point.

A verification batch computes a position's logits with other kernels than a one-token
decode (another summation order, tiled or repacked kernels), so they differ by a small
kernel drift; where the target's two best tokens are closer than that, a greedy choice
can flip, and from there the texts differ.  Exact token equality across batch shapes is
guaranteed only by ``batch_invariant=True``.  Elsewhere the like-with-like check is:
recompute the target-alone run's logits exactly the way that run made them (the prompt
but its last token prefilled in n_batch chunks, as ``Generator.start`` does, then one
token per decode), confirm they reproduce its choices, and require the first divergence,
if any, to be a near-tie of those logits within a stated margin.
"""
from __future__ import annotations

import numpy as np

from fastspec import _core


def target_alone_logits(model, prompt_tokens, out_tokens, n, *, n_ctx, n_batch=512, n_threads=None,
                        flash_attn=None):
    """Logits of the target-alone run for its output positions 0..n (n + 1 rows).  The
    context settings must be those of the decoder that made the run."""
    head = list(prompt_tokens[:-1])
    rows = []
    with _core.Context(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, flash_attn=flash_attn) as c:
        for k in range(0, len(head), n_batch):
            c.decode(head[k:k + n_batch], logits="none")
        for t in [prompt_tokens[-1]] + list(out_tokens[:n]):
            c.decode([t])
            rows.append(c.get_logits())
    return rows


def assert_same_or_near_tie(model, prompt_tokens, got, base, *, margin, **ctx):
    """``got`` (greedy, with batched target passes) equals ``base`` (greedy, the target
    alone) up to its first difference, which must sit at a near-tie: there the base token
    is the argmax of the recomputed target-alone logits (checked at every position up to
    it, so the recomputation is like with like) and ``got``'s token (or the end of
    generation, where one output stops early) is within ``margin`` logits of it.

    ``got``/``base`` have ``tokens`` and ``finish_reason``.  Returns the gap in logits at
    the divergence, or None where the outputs are identical."""
    n = min(len(got.tokens), len(base.tokens))
    i = next((k for k in range(n) if got.tokens[k] != base.tokens[k]), n)
    if i == len(got.tokens) == len(base.tokens):
        assert got.finish_reason == base.finish_reason
        return None
    rows = target_alone_logits(model, prompt_tokens, base.tokens, i, **ctx)
    eog = [t for t in model.eog_tokens if 0 <= t < model.n_vocab]

    def choice(result, k):          # the token the run chose at output position k
        if k < len(result.tokens):
            return result.tokens[k]
        assert result.finish_reason == "stop", (k, result.finish_reason)
        return max(eog, key=lambda t: rows[k][t])       # it ended: an end-of-generation token

    for k in range(i + 1):
        top, b = int(np.argmax(rows[k])), choice(base, k)
        assert rows[k][top] == rows[k][b], (
            f"recomputed target-alone logits disagree with the target-alone run at position {k}: "
            f"argmax {top}, the run chose {b} (the recomputation is not like with like, or the run "
            "is not deterministic)")
    z = rows[i]
    gap = float(z[choice(base, i)] - z[choice(got, i)])
    assert gap <= margin, (
        f"divergence at output position {i} at a clear choice: the target alone prefers its token by "
        f"{gap:.4f} logits, more than the {margin} a kernel-drift flip can explain")
    return gap


# Layers on a GPU backend for the models of tests that compare outputs or logits with the
# target alone's bit for bit: none.  That exactness is the patched CPU kernels'; a GPU
# backend's batched kernels round differently from its one-token ones (README, "What exact
# means"), so on a GPU build those models stay on the CPU.
CPU_LAYERS = 0


def prompt_batch_error(path, n_tokens=45, seed=9):
    """(largest difference, range) between the logits of one batch of ``n_tokens`` random
    tokens and those of the same tokens decoded one at a time, the model at ``path`` loaded
    repacked on the CPU (a batch past the verification range: a prompt, a draft's catch-up,
    whose kernels need not be bit-identical but must give the model's logits)."""
    model = _core.Model(str(path), n_gpu_layers=CPU_LAYERS, repack=True)
    ctx = _core.Context(model, n_ctx=256, n_batch=128, n_threads=2)
    try:
        tokens = [int(t) for t in np.random.default_rng(seed).integers(0, model.n_vocab, n_tokens)]
        ref = []
        for t in tokens:
            ctx.decode([t])
            ref.append(ctx.get_logits().copy())
        ref = np.stack(ref)
        ctx.clear()
        ctx.decode(tokens, logits="all")
        got = np.stack([ctx.get_logits(j).copy() for j in range(len(tokens))])
        return float(np.max(np.abs(got - ref))), float(np.ptp(ref))
    finally:
        ctx.close()
        model.close()


# Margin for the tiny random-weight test models (tests/tiny_models.py): their logits have
# a standard deviation of about 4, so the two best tokens are usually about a logit
# apart; the batched-vs-one-token drift measured on them is 0.002 (largest difference
# over the vocabulary, batches of up to 9, AMD Zen 3 AVX2, flash attention on).  0.05
# leaves 25x that for other CPUs and GPU backends (half-precision matmul tiles).
TINY_NEAR_TIE = 0.05


def assert_tiny_same_or_near_tie(dec, prompt, got, base, n_threads=None):
    """assert_same_or_near_tie for a fastspec.SpeculativeDecoder on a tiny model with
    default n_batch and flash attention."""
    ptoks = dec.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    return assert_same_or_near_tie(dec.target_model, ptoks, got, base, margin=TINY_NEAR_TIE,
                                   n_ctx=dec.n_ctx, n_threads=n_threads)
