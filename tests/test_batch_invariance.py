"""With the project's patches (patches/*.patch), a batch of up to 16 tokens gives, at every
position, exactly the logits that decoding the same tokens one at a time gives: the CPU
matrix multiplications run each row of a verification batch through the one-token kernel.

Checked on tiny random models quantized to the weight types the patches route (repacked
Q4_K / Q4_0 where the CPU repacks them, Q6_K through the tiled kernel's range, Q8_0 and F16
through llamafile's sgemm range; on x86 with AVX2, Q6_K, repacked Q4_K, repacked Q4_0, Q8_0
and Q5_K through the multi-row kernels of 0005 / 0006 / 0009 / 0010 / 0011 at 2..16 rows, IQ4_XS, Q3_K and
(unrepacked) Q2_K through 0028's, 0031's and 0033's at 1..16, with AVX-512 Q6_K, Q4_K, Q4_0, IQ4_XS, Q5_K and Q3_K through their
two-blocks-per-register forms 0014 / 0015 / 0016 / 0029 / 0030 / 0032, which 0017
turns on by the CPU (0047: on some for one-token passes alone) and GGML_CPU_ZMM_PAIRS forces; where the build has VNNI, Q4_K's
and Q4_0's kernels sum with it, 0025 / 0027, and 1-8 rows of Q4_K take 0026's fused form), with and
without flash attention, on the CPU only.  One-token passes are checked against ggml's own
kernels too (repacked Q4_K, Q4_0, Q8_0, Q6_K, IQ4_XS, Q3_K, and with 0030 Q5_K, take their multi-row kernel
at one row as well), and
flash attention with and without 0019's blocks of K·Q dot products past 512 cached tokens, and
0037's kernel for F16 K and V against ggml's loop.  The
assertion is bit equality of logits, which the patches guarantee on any CPU; it says
nothing about what a particular CPU computes.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fastspec import _core
from greedy_check import prompt_batch_error
from logit_checks import check_chunks as _check_chunks, check_random_chunks, one_token_logits as _one_token_logits, quantized_models

ROOT = pathlib.Path(__file__).resolve().parent.parent
FTYPE = {"q4_k": 15, "q5_k": 17, "q6_k": 18, "q8_0": 7, "q4_0": 2, "iq4_xs": 30, "q3_k": 12, "q2_k": 10,
         "f16": 1}   # llama_ftype
SIZES = (2, 3, 4, 5, 7, 8, 9, 12, 16)


def _patches_applied() -> bool:
    spec = importlib.util.spec_from_file_location("apply_patches", ROOT / "patches" / "apply_patches.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tree = mod.DEFAULT_TREE
    if not (tree / "ggml").is_dir():
        return True             # no source tree here: an installed build, assumed patched
    try:
        return all(s == "applied" for s in mod.states(tree, mod.patches()))
    except mod.PatchError:      # no 'patch' program to ask
        return True


pytestmark = pytest.mark.skipif(not _patches_applied(),
                                reason="built without patches/*.patch (FASTSPEC_PATCHES=OFF)")


@pytest.fixture(scope="module", params=[(256, 512), (512, 768)], ids=["w256", "w512"])
def quantized(tmp_path_factory, request):
    """A tiny model in each weight type: rows 256 wide (one K-quant super-block), and rows
    512 / 768 wide (2 and 3 super-blocks: the multi-row kernels' per-row accumulation over
    super-blocks)."""
    n_embd, n_ff = request.param
    return quantized_models(tmp_path_factory.mktemp("invariance"), FTYPE, n_embd=n_embd, n_ff=n_ff)


def _logits_in_process(script: str, model_path, tmp_path, env_set: dict, *args: str) -> np.ndarray:
    """Run one of the scripts below in a process of its own (ggml reads its switches once per
    process) with env_set's variables set (None: unset), and load the logits it saved."""
    env = {k: v for k, v in os.environ.items() if k not in env_set}
    env.update({k: v for k, v in env_set.items() if v is not None})
    dst = tmp_path / f"logits-{len(list(tmp_path.glob('logits-*.npy')))}.npy"
    subprocess.run([sys.executable, "-c", script, str(model_path), str(dst), *args], env=env, check=True, timeout=120)
    return np.load(dst)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa", "nofa"])
@pytest.mark.parametrize("repack", [True, False], ids=["repack", "plain"])
@pytest.mark.parametrize("wtype", list(FTYPE))
def test_batched_logits_equal_one_token_logits(quantized, wtype, repack, flash_attn):
    if wtype in ("q3_k", "q5_k", "q6_k", "q8_0", "iq4_xs", "f16") and not repack:
        pytest.skip("not repacked on any CPU: the repack=True case covers it")
    model = _core.Model(str(quantized[wtype]), n_gpu_layers=0, repack=repack)
    ctx = _core.Context(model, n_ctx=256, n_batch=64, n_threads=2, flash_attn=flash_attn)
    try:
        rng = np.random.default_rng(7)
        tokens = [int(t) for t in rng.integers(0, model.n_vocab, 40)]
        ref = _one_token_logits(ctx, tokens)
        assert all(np.isfinite(r).all() for r in ref)
        assert np.ptp(ref[-1]) > 0
        _check_chunks(ctx, tokens, ref, SIZES, wtype)
    finally:
        ctx.close()
        model.close()


@pytest.mark.parametrize("wtype", ["f16", "q4_k"])
def test_flash_attention_past_512_cached_tokens(quantized, wtype):
    """Patch 0008: a one-token decode with 512+ cached tokens no longer takes flash attention's
    split-KV path (per-thread partials merged), so it matches a verification batch there too."""
    model = _core.Model(str(quantized[wtype]), n_gpu_layers=0)
    ctx = _core.Context(model, n_ctx=1024, n_batch=1024, n_threads=2, flash_attn=True)
    try:
        check_random_chunks(ctx, model.n_vocab, 11, 600, 24, (2, 4, 8, 16), f"{wtype} after 600 cached tokens")
    finally:
        ctx.close()
        model.close()


_ONE_TOKEN_SCRIPT = """
import sys, numpy as np
from fastspec import _core
model = _core.Model(sys.argv[1], n_gpu_layers=0, repack=sys.argv[3] == "repack")
ctx = _core.Context(model, n_ctx=256, n_batch=64, n_threads=2, flash_attn=True)
rng = np.random.default_rng(5)
out = []
for t in rng.integers(0, model.n_vocab, 24):
    ctx.decode([int(t)])
    out.append(ctx.get_logits().copy())
np.save(sys.argv[2], np.stack(out))
ctx.close(); model.close()
"""


@pytest.mark.parametrize("wtype,layout", [(t, "repack") for t in ("q4_0", "q8_0", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")]
                         + [("q2_k", "plain")])   # Q2_K is repacked where AVX-512 is (ggml's 8x8 layout)
def test_one_token_logits_equal_the_stock_kernels(quantized, wtype, layout, tmp_path):
    """The multi-row kernels promise each row the stock one-token kernel's arithmetic; where a
    one-token pass takes the multi-row kernel too (repacked Q4_K and Q4_0, Q8_0, Q6_K, IQ4_XS,
    Q3_K, unrepacked Q2_K, and Q5_K where 0030's form runs: patches 0006, 0009, 0010, 0005, 0028,
    0031, 0033, 0030), its logits must equal those of ggml's own kernels, which
    GGML_CPU_INVARIANT_ROWS=0 (read once per process, hence the subprocesses) brings back.  (Q6_K
    in its plain layout: on x86 with AVX-512 VNNI patch 0051 repacks it, with arithmetic of its own,
    see the test below.)"""
    stock, ours = (_logits_in_process(_ONE_TOKEN_SCRIPT, quantized[wtype], tmp_path,
                                      {"GGML_CPU_INVARIANT_ROWS": rows, "GGML_CPU_Q6_K_REPACK": "0"}, layout)
                   for rows in ("0", None))
    assert np.isfinite(stock).all() and np.ptp(stock[-1]) > 0
    assert np.array_equal(stock, ours), f"{wtype}: one-token logits differ from the stock kernels' " \
                                        f"by up to {float(np.max(np.abs(stock - ours))):g}"


def test_q6_k_repacked_one_token_logits_near_the_stock_kernels(quantized, tmp_path):
    """Patch 0051 (x86 with AVX-512 VNNI): Q6_K repacked 8 columns at a time takes a kernel of its
    own at every batch size, one token included, so its logits are not stock ggml's bits (the float
    sums are grouped differently; batches still give the one-token bits, tested above); they must
    still be the same products: the stock kernels' logits but for rounding (elsewhere both runs
    take the stock kernel and the check holds trivially)."""
    stock, ours = (_logits_in_process(_ONE_TOKEN_SCRIPT, quantized["q6_k"], tmp_path,
                                      {"GGML_CPU_INVARIANT_ROWS": rows, "GGML_CPU_Q6_K_REPACK": None}, "repack")
                   for rows in ("0", None))
    assert np.isfinite(ours).all() and np.ptp(ours[-1]) > 0
    # through a random model's layers a rounding difference can grow (on the 2-super-block model,
    # 0.075 of a 21-wide logit range); a kernel that read the layout wrong is off by the range itself
    diff, spread = float(np.max(np.abs(stock - ours))), float(np.ptp(stock))
    assert diff <= 0.02 * spread and np.corrcoef(stock.ravel(), ours.ravel())[0, 1] > 0.999, \
        f"q6_k repacked: one-token logits differ from the stock kernels' by up to {diff:g} (range {spread:g})"


_BOTH_WAYS_SCRIPT = """
import sys, numpy as np
from fastspec import _core
model = _core.Model(sys.argv[1], n_gpu_layers=0, repack=True)
ctx = _core.Context(model, n_ctx=256, n_batch=64, n_threads=2, flash_attn=True)
chunks = [int(n) for n in sys.argv[3].split(",")]
tokens = [int(t) for t in np.random.default_rng(11).integers(0, model.n_vocab, sum(chunks))]
one = []
for t in tokens:
    ctx.decode([t])
    one.append(ctx.get_logits().copy())
ctx.clear()
batched, i = [], 0
for n in chunks:
    ctx.decode(tokens[i:i + n], logits="all")
    batched.extend(ctx.get_logits(j).copy() for j in range(n))
    i += n
np.save(sys.argv[2], np.stack([np.stack(one), np.stack(batched)]))
ctx.close(); model.close()
"""


@pytest.mark.parametrize("wtype", ["q4_0", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"])
def test_two_blocks_per_register_and_256_bit_kernels_agree(quantized, wtype, tmp_path):
    """Patch 0017 picks, once per process, between the AVX-512 two-blocks forms of the rows
    kernels (0014-0016, 0029, 0030, 0032) and the 256-bit ones by the CPU; GGML_CPU_ZMM_PAIRS=0/1 forces either,
    and =2 (0047) the two-blocks forms for one-row products and the 256-bit ones for batches.
    Whichever runs, one-token and batched logits must be the same bits (on a CPU without AVX-512
    every run takes the same kernels, and the check still holds)."""
    outs = [_logits_in_process(_BOTH_WAYS_SCRIPT, quantized[wtype], tmp_path,
                               {"GGML_CPU_INVARIANT_ROWS": None, "GGML_CPU_ZMM_PAIRS": pairs}, "7,7,7,7,2")
            for pairs in ("0", "1", "2")]
    for pairs, (one, batched) in zip(("0", "1", "2"), outs):
        assert np.isfinite(one).all() and np.ptp(one[-1]) > 0
        assert np.array_equal(one, batched), f"{wtype}, GGML_CPU_ZMM_PAIRS={pairs}: batched logits " \
                                             f"differ from one-token logits"
    for other in outs[1:]:
        assert np.array_equal(outs[0], other), f"{wtype}: the two-blocks and 256-bit kernels differ " \
                                               f"by up to {float(np.max(np.abs(outs[0] - other))):g}"


@pytest.mark.parametrize("wtype,switch,chunks", [("q4_k", "GGML_CPU_Q4_K_FUSED256", "2,3,4,5,6,7,8,9,12,16"),
                                                  ("q6_k", "GGML_CPU_Q6_K_C64", "2,3,4,5,6,7,8")])
def test_batch_forms_agree(quantized, wtype, switch, chunks, tmp_path):
    """Where the 256-bit kernels serve batches (GGML_CPU_ZMM_PAIRS=0 forces it on a CPU with
    512-bit vectors at full width), a switch read once per process picks between two forms of a
    rows kernel for batches; either way each position's logits are the one-token bits, and the two
    forms give the same (on a CPU or build without the form both runs take one kernel and the
    checks still hold).  Q4_K, with AVX-512 VNNI and VL: 2..8 rows take each weight vector as it is
    unpacked (0048), 9..16 a half sub-block's weight vectors in registers for each row (0049);
    GGML_CPU_Q4_K_FUSED256=0 keeps the unpack-then-rows array form.  Q6_K, with AVX-512 BW: 2..8
    rows take 0034's 64-weights-a-register form (0050: on by default on Zen 4);
    GGML_CPU_Q6_K_C64=0 keeps the 256-bit form.  Both in the plain layout: with AVX-512 VNNI
    0051 repacks Q6_K into a layout neither form reads, so GGML_CPU_Q6_K_REPACK=0 here."""
    outs = [_logits_in_process(_BOTH_WAYS_SCRIPT, quantized[wtype], tmp_path,
                               {"GGML_CPU_INVARIANT_ROWS": None, "GGML_CPU_ZMM_PAIRS": "0", "GGML_CPU_Q6_K_REPACK": "0",
                                switch: on}, chunks)
            for on in ("0", "1")]
    for on, (one, batched) in zip(("0", "1"), outs):
        assert np.isfinite(one).all() and np.ptp(one[-1]) > 0
        assert np.array_equal(one, batched), f"{switch}={on}: batched logits differ from one-token logits"
    assert np.array_equal(outs[0], outs[1]), f"{wtype}: the two forms of the rows kernel ({switch}) differ"


_FA_BLOCKS_SCRIPT = """
import sys, numpy as np
from fastspec import _core
model = _core.Model(sys.argv[1], n_gpu_layers=0)
ctx = _core.Context(model, n_ctx=1024, n_batch=1024, n_threads=2, flash_attn=True)
rng = np.random.default_rng(13)
prefix = [int(t) for t in rng.integers(0, model.n_vocab, 600)]
tokens = [int(t) for t in rng.integers(0, model.n_vocab, 21)]
ctx.decode(prefix)
out = []
for t in tokens[:13]:                        # one-token passes past 600 cached tokens
    ctx.decode([t])
    out.append(ctx.get_logits().copy())
ctx.decode(tokens[13:], logits="all")        # and a verification-sized batch (causal mask inside)
out.extend(ctx.get_logits(j).copy() for j in range(8))
np.save(sys.argv[2], np.stack(out))
ctx.close(); model.close()
"""


def _logits_both_ways(variable: str, model_path, tmp_path, also: dict | None = None) -> list[np.ndarray]:
    """_FA_BLOCKS_SCRIPT's logits (one-token passes past 600 cached tokens, then a
    verification-sized batch) with a read-once switch at 0 and at 1 (and ``also``'s variables
    set), each in a process of its own."""
    return [_logits_in_process(_FA_BLOCKS_SCRIPT, model_path, tmp_path, {**(also or {}), variable: value})
            for value in ("0", "1")]


def _same_logits_either_way(variable: str, model_path, tmp_path, what: str, also: dict | None = None) -> None:
    """_logits_both_ways must give the same bits."""
    outs = _logits_both_ways(variable, model_path, tmp_path, also)
    assert np.isfinite(outs[0]).all() and np.ptp(outs[0][-1]) > 0
    assert np.array_equal(outs[0], outs[1]), f"{what} differs by up to {float(np.max(np.abs(outs[0] - outs[1]))):g}"


@pytest.mark.parametrize("wtype", ["f16", "q4_k"])
def test_flash_attention_kq_blocks_change_no_result(quantized, wtype, tmp_path):
    """Patch 0019: flash attention computes the KQ dot products of a block of cached tokens
    before their softmax updates (GGML_CPU_FA_KQ_BLOCKS=0, read once per process, turns that
    off).  Each token's operations are the same either way, so one-token and batched logits past
    512 cached tokens must be the same bits with and without it."""
    _same_logits_either_way("GGML_CPU_FA_KQ_BLOCKS", quantized[wtype], tmp_path,
                            f"{wtype}: flash attention with KQ blocks", {"GGML_CPU_FA_ROWS": "0"})


def test_flash_attention_rows_kernel_close_to_ggml_loop(quantized, tmp_path):
    """Patch 0037: rows with F16 K and V take a kernel of their own (F32 Q and V accumulator,
    a block of cached tokens at a time) where the build has AVX-512 or AVX2 with F16C;
    GGML_CPU_FA_ROWS=0 keeps ggml's loop.  Batched against one-token bits is checked above with
    the kernel on; here its values against ggml's loop, which rounds Q and the accumulator to
    F16: an F16 model (nothing quantized after attention), past 600 cached tokens, one-token
    passes and a verification-sized batch.  A wrong mask, scale or softmax moves logits by
    whole units; the two roundings differ by well under a hundredth of the logits' range."""
    outs = _logits_both_ways("GGML_CPU_FA_ROWS", quantized["f16"], tmp_path)
    assert np.isfinite(outs[1]).all()
    spread = float(np.ptp(outs[0][-1]))
    assert spread > 1
    worst = float(np.max(np.abs(outs[0] - outs[1])))
    assert worst <= 0.005 * spread, f"kernel vs ggml's loop: {worst:g} (logit range {spread:g})"


def test_zmm_pairs_as_ggml_reads_it(monkeypatch):
    """_core.zmm_pairs() reports what ggml decided (once per process); only an AVX-512 build
    with the patches can say True."""
    monkeypatch.delenv("GGML_CPU_ZMM_PAIRS", raising=False)
    code = "from fastspec import _core; print(int(_core.zmm_pairs()))"
    got = {}
    for pairs in ("0", "1", "2", None):
        env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_ZMM_PAIRS"}
        if pairs is not None:
            env["GGML_CPU_ZMM_PAIRS"] = pairs
        got[pairs] = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60,
                                    capture_output=True, text=True).stdout.strip()
    assert got["0"] == "0"
    avx512 = "AVX512 = 1" in _core.system_info()
    assert got["1"] == ("1" if avx512 and _core.invariant_rows() else "0")
    assert got["2"] == ("2" if avx512 and _core.invariant_rows() else "0")
    assert got[None] in ("0", "1", "2")


def test_q4_0_prompt_batches_take_either_kernel(quantized, monkeypatch):
    """Where a prompt-sized batch times repacked Q4_0 takes the rows kernel instead of
    ggml's gemm is decided once per process from the CPU (patches 0012, 0021);
    GGML_CPU_Q4_0_ROWS_PROMPTS=0/1 overrides, and either way a 45-token batch's logits are the
    model's (close to the one-token ones: a row mixed up in the rows kernel's layout would be
    far off)."""
    monkeypatch.delenv("GGML_CPU_Q4_0_ROWS_PROMPTS", raising=False)
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from fastspec import _core; "
            "from greedy_check import prompt_batch_error; worst, scale = prompt_batch_error(sys.argv[1]); "
            "print(int(_core.q4_0_rows_for_prompts()), worst / scale)")
    seen = {}
    for setting in ("0", "1", None):
        env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_Q4_0_ROWS_PROMPTS"}
        if setting is not None:
            env["GGML_CPU_Q4_0_ROWS_PROMPTS"] = setting
        out = subprocess.run([sys.executable, "-c", code, str(quantized["q4_0"]), os.path.dirname(__file__)],
                             env=env, check=True, timeout=120, capture_output=True, text=True).stdout.split()
        seen[setting] = int(out[0])
        assert float(out[1]) <= 0.02, f"GGML_CPU_Q4_0_ROWS_PROMPTS={setting}: logits off by {out[1]} of their range"
    x86_avx2 = "AVX2 = 1" in _core.system_info()
    assert seen["0"] == 0
    assert seen["1"] == (1 if x86_avx2 else 0)
    assert seen[None] in (0, 1)


@pytest.mark.parametrize("wtype", ["q4_0", "q4_k"])
def test_prompt_sized_batches_agree_with_one_token_logits(quantized, wtype):
    """Batches past the verification range (a prompt, a draft's long catch-up) keep fast
    kernels, which need not be bit-identical (on x86 with AVX2 and no AVX-512, and on AMD Zen 4,
    repacked Q4_0 takes 0009's rows kernel there too, patches 0012 and 0021, after laying out
    the rows ggml quantized four at a time one by one); their logits must still be the model's:
    close to the one-token
    ones at every position, whatever the kernel."""
    worst, scale = prompt_batch_error(quantized[wtype], 45)    # 11 groups of 4, and 1
    assert scale > 0
    assert worst <= 0.02 * scale, f"{wtype}: a 45-token batch's logits differ by up to {worst:g} (range {scale:g})"


def test_default_decoder_verifies_at_most_the_invariant_rows(bpe_target, monkeypatch):
    import fastspec
    from fastspec import _core
    monkeypatch.delenv("GGML_CPU_INVARIANT_ROWS", raising=False)
    if _core.invariant_rows() < 2:
        pytest.skip("only builds with the patches cap verification batches")
    # the target's layers on the CPU (on a GPU build too): the CPU kernels' cap
    with fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=256, n_gpu_layers=0) as dec:
        assert dec.max_verify_batch == _core.invariant_rows()
        r = dec.generate("a b c a b c a b c a b c", max_tokens=40, lookup=True, n_draft=32)
        assert r.stats.n_target_passes >= 1
        assert set(dec.cost_model.verify_times) <= set(range(1, dec.max_verify_batch + 1))


def test_batch_invariant_measures_up_to_the_invariant_rows(bpe_target, monkeypatch):
    """batch_invariant=True measures the largest exact batch: with the patches, as far as they
    promise (not just to 8), and the measurement finds every batch up to there exact."""
    import fastspec
    from fastspec import _core
    monkeypatch.delenv("GGML_CPU_INVARIANT_ROWS", raising=False)
    if _core.invariant_rows() < 2:
        pytest.skip("a build without the patches")
    with fastspec.SpeculativeDecoder(str(bpe_target), n_ctx=256, n_gpu_layers=0, batch_invariant=True) as dec:
        assert dec.max_verify_batch == min(_core.invariant_rows(), _core.DRAFT_LIMIT + 1)


@pytest.mark.parametrize("wtype", ["q6_k", "q8_0", "f16", "q4_k"])
def test_small_batch_chunks_change_no_result(quantized, wtype, tmp_path):
    """Patch 0036: one-token passes and verification batches split each weight matrix into 4
    chunks per thread instead of ggml's 16- or 64-row ones (GGML_CPU_SMALL_BATCH_CHUNKS=0, read
    once per process, keeps ggml's).  Which thread computes a row changes no operation of it, so
    one-token and batched logits must be the same bits either way."""
    _same_logits_either_way("GGML_CPU_SMALL_BATCH_CHUNKS", quantized[wtype], tmp_path, f"{wtype}: 4 chunks per thread")
