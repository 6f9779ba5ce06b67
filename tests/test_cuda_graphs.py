"""Patch 0020: on CUDA each graph shape keeps its own captured CUDA graph, so one-token passes
and verification batches of several sizes, alternating as in speculative decoding, each reuse
their own capture instead of resetting one shared slot.  Which captured graph runs must never
change a result: the logits of such an alternation are checked to be the same bits with the
per-shape key (the default) and with ggml's first-node key (GGML_CUDA_GRAPH_PER_SHAPE=0).
Patch 0046: a prompt's batch (more than GGML_CUDA_GRAPH_MAX_ROWS tokens, 32) runs uncaptured;
the same prompt lengths met again give the same bits as with every shape captured (0).

Needs a build with a GPU backend and a GPU; skipped elsewhere (on Metal the variable does
nothing and the check holds trivially)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tiny_models
from fastspec import _core

pytestmark = pytest.mark.skipif(not _core.supports_gpu_offload(), reason="a build without a GPU backend")

# what both scripts open with: a tiny model on the GPU (or word that it stayed on the CPU)
_OPENING = r"""
import sys
import numpy as np
from fastspec import _core
model = _core.Model(sys.argv[1], n_gpu_layers=-1)
if not model.on_gpu:
    print("NO_GPU"); sys.exit(0)
ctx = _core.Context(model, n_ctx=512, n_threads=2)
"""

_SCRIPT = _OPENING + r"""
rng = np.random.default_rng(5)
tokens = [int(t) for t in rng.integers(0, model.n_vocab, 400)]
ctx.decode(tokens[:40])
pos, out = 40, []
# one-token passes between verification batches of several sizes, each size met many times;
# after some batches the last rows are taken back, as a rejected draft's are
for rnd in range(6):
    for k in (2, 4, 3, 8, 16):
        for _ in range(3):
            ctx.decode([tokens[pos]]); out.append(ctx.get_logits().copy()); pos += 1
        ctx.decode(tokens[pos:pos + k], logits="all")
        out.extend(ctx.get_logits(j).copy() for j in range(k))
        keep = k // 2 if rnd % 2 else k
        pos += keep
        ctx.remove_from(pos)
np.save(sys.argv[2], np.stack(out))
ctx.close(); model.close()
"""


def _logits_under(tmp_path, script: str, seed: int, variable: str, values: tuple[str, ...]) -> list:
    """The logits ``script`` saves for a tiny model, run once per value of the environment
    ``variable`` (each in its own process: ggml reads it once); skips where no GPU took it."""
    path = tmp_path / "tiny.gguf"
    tiny_models.write_tiny_llama(path, seed=seed, n_embd=128, n_ff=256, n_layer=2, out_std=0.1)
    outs = []
    for value in values:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CUDA_GRAPH_")}
        env[variable] = value
        dst = tmp_path / f"logits-{value}.npy"
        r = subprocess.run([sys.executable, "-c", script, str(path), str(dst)], env=env, check=True,
                           timeout=180, capture_output=True, text=True)
        if "NO_GPU" in r.stdout:
            pytest.skip("no GPU device: the model stayed on the CPU")
        outs.append(np.load(dst))
    assert np.isfinite(outs[0]).all() and np.ptp(outs[0][-1]) > 0
    return outs


def test_per_shape_graphs_change_no_result(tmp_path):
    outs = _logits_under(tmp_path, _SCRIPT, 4, "GGML_CUDA_GRAPH_PER_SHAPE", ("0", "1"))
    assert outs[0].shape == (6 * (5 * 3 + 2 + 4 + 3 + 8 + 16), outs[0].shape[1])
    assert np.array_equal(outs[0], outs[1]), \
        f"logits differ by up to {float(np.max(np.abs(outs[0] - outs[1]))):g} with per-shape CUDA graphs"


_PROMPTS = _OPENING + r"""
rng = np.random.default_rng(6)
tokens = [int(t) for t in rng.integers(0, model.n_vocab, 400)]
out = []
# prompts of a few lengths, each met four times (captured from the second time where allowed),
# each followed by one-token passes and a verification batch
for rnd in range(4):
    for n in (40, 33, 97):
        ctx.clear()
        ctx.decode(tokens[:n], logits="all")
        out.extend(ctx.get_logits(j).copy() for j in (0, n // 2, n - 1))
        for i in range(3):
            ctx.decode([tokens[n + i]]); out.append(ctx.get_logits().copy())
        ctx.decode(tokens[n + 3:n + 11], logits="all")
        out.extend(ctx.get_logits(j).copy() for j in range(8))
np.save(sys.argv[2], np.stack(out))
ctx.close(); model.close()
"""


def test_prompt_batches_run_uncaptured_with_the_same_result(tmp_path):
    outs = _logits_under(tmp_path, _PROMPTS, 7, "GGML_CUDA_GRAPH_MAX_ROWS", ("0", "32"))
    assert outs[0].shape == (4 * 3 * (3 + 3 + 8), outs[0].shape[1])
    assert np.array_equal(outs[0], outs[1]), \
        f"logits differ by up to {float(np.max(np.abs(outs[0] - outs[1]))):g} with prompts uncaptured"
