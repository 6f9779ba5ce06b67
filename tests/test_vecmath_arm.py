"""The NEON loops of src/fastspec/_vecmath.h, checked on an x86 machine.

tests/vecmath_check.c is cross-built for 64-bit Arm and run under qemu-aarch64 on rows of
logits; what it gives must agree with numpy as test_vecmath.py asks of the x86 loops.
Needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: ``apt-get install gcc-aarch64-linux-gnu
qemu-user``); skipped without them.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from test_vecmath import FLOOR, greedy_reference, llm_like_logits

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.emulated,
    pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                       reason="needs aarch64-linux-gnu-gcc and qemu-aarch64"),
]


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory):
    exe = tmp_path_factory.mktemp("vecmath") / "vecmath_check"
    r = subprocess.run(["aarch64-linux-gnu-gcc", "-O2", "-static", f"-I{ROOT / 'src' / 'fastspec'}",
                        ROOT / "tests" / "vecmath_check.c", "-lm", "-o", exe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


@pytest.mark.parametrize("n", [1, 3, 4, 5, 9, 17, 1000, 151_936])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_neon_loops_match_numpy(check_exe, tmp_path, n, temperature):
    x = llm_like_logits(n, 7 * n)
    if n >= 3:
        x[n // 2] = np.nan                                     # (weighs nothing)
    if n >= 9:
        x[-1] = x[3] = np.nanmax(x) + 1.0                      # tied maxima, one in the tail
    src, out = tmp_path / "x.f32", tmp_path / "out.f32"
    x.tofile(src)
    cut = 1e-3
    r = subprocess.run(["qemu-aarch64", check_exe, src, str(n), str(temperature), str(cut), out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, total, above, kept, c1, c2, first, top, second, top_only, at = r.stdout.split()
    assert path == "1"                                          # FS_PATH_NEON
    w, cw, scaled = np.fromfile(out, dtype=np.float32).reshape(3, n)
    inv_t = np.float32(1.0) / np.float32(temperature)
    m = np.float32(np.nanmax(x) * inv_t)
    v = x * inv_t - m
    with np.errstate(invalid="ignore"):
        live = v > -FLOOR                                       # (NaN: False)
    ref = np.where(live, np.exp(np.where(live, v, 0).astype(np.float64)), 0.0)
    slack = 2 * float(np.spacing(abs(m)))
    assert np.all(((w > 0) == live)[np.isnan(v) | (np.abs(v + FLOOR) > 1e-3)])
    assert np.all(np.abs(w - ref) <= ref * (4e-7 + slack))
    assert float(total) == pytest.approx(float(w.astype(np.float64).sum()), rel=1e-9)
    keep = w >= np.float32(cut)
    assert np.array_equal(cw, np.where(keep, w, 0))
    assert float(above) == pytest.approx(float(w[keep].astype(np.float64).sum()), rel=1e-9)
    assert float(kept) == float(above)
    assert int(c1) == int(c2) == int(keep.sum())
    assert int(first) == (int(np.flatnonzero(keep)[0]) if keep.any() else -1)
    assert np.allclose(scaled, cw / np.float32(kept), rtol=1e-6, atol=0)
    want, want_gap = greedy_reference(x)
    top, second, top_only = (np.float32(v) for v in (top, second, top_only))   # (%.9g: exact)
    assert int(at) == want and top == top_only == np.nanmax(x)
    assert (float(top - second) if n > 1 else 0.0) == want_gap
