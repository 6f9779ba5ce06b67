"""patches/*.patch: each is documented, applies cleanly to the pinned tree, and the applier
is idempotent both ways (apply twice, take back twice) and refuses a tree it does not fit."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCH_DIR = ROOT / "patches"

_spec = importlib.util.spec_from_file_location("apply_patches", PATCH_DIR / "apply_patches.py")
ap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ap)

TREE = ap.DEFAULT_TREE
pytestmark = [
    pytest.mark.skipif(shutil.which("patch") is None, reason="no 'patch' program"),
    pytest.mark.skipif(not (TREE / "ggml").is_dir(), reason="vendor/llama.cpp is not filled"),
]


def _touched(patch_file: pathlib.Path) -> list[str]:
    names = re.findall(r"^\+\+\+ b/(\S+)", patch_file.read_text(), flags=re.M)
    assert names, f"{patch_file.name} changes no file"
    return names


@pytest.fixture()
def tree_copy(tmp_path):
    """The files the patches touch, copied from vendor/llama.cpp into a scratch tree."""
    for p in ap.patches():
        for name in _touched(p):
            dst = tmp_path / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TREE / name, dst)
    (tmp_path / "ggml").mkdir(exist_ok=True)
    return tmp_path


def test_every_patch_is_documented_and_small():
    files = ap.patches()
    assert files, "no patches/*.patch"
    for p in files:
        text = p.read_text()
        head = text[:text.index("\n--- a/")]
        assert p.name[:4].isdigit() and len(head.split()) >= 15, f"{p.name}: no description before the diff"
        changed = [line for line in text[len(head):].splitlines()
                   if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
        # a switch or a hook stays within 60 changed lines; a patch that adds a multi-row kernel
        # (one new function mirroring a stock one, its declaration and its call), a kernel of its
        # own for an op (the function and the place that chooses it), a new API function (its
        # declaration, body and the places that honour it) or new data for a family of multi-row
        # kernels (the helpers that make and use it, the kernels' signatures and every call to
        # them) within 150
        limit = 150 if any(k in head for k in ("all rows at once", "a kernel of its own", "a new API",
                                                 "every call to them")) else 60
        assert 0 < len(changed) <= limit, f"{p.name}: {len(changed)} changed lines"


def test_vendored_tree_state_is_consistent():
    # applied by a default build, unapplied after FASTSPEC_PATCHES=OFF; never half of one
    files = ap.patches()
    states = dict(zip([p.name for p in files], ap.states(TREE, files)))
    assert set(states.values()) <= {"applied", "unapplied"}, states
    assert len(set(states.values())) == 1, states


def test_apply_revert_idempotent(tree_copy):
    files = ap.patches()
    ap.apply_all(tree_copy, files, revert=True)            # from whatever state: pristine
    pristine = {n: (tree_copy / n).read_bytes() for p in files for n in _touched(p)}
    assert ap.states(tree_copy, files) == ["unapplied"] * len(files)

    first = ap.apply_all(tree_copy, files)
    assert [w for _, w in first] == ["applied"] * len(files)
    patched = {n: (tree_copy / n).read_bytes() for n in pristine}
    assert patched != pristine
    second = ap.apply_all(tree_copy, files)
    assert [w for _, w in second] == ["already applied"] * len(files)
    assert {n: (tree_copy / n).read_bytes() for n in pristine} == patched

    back = ap.apply_all(tree_copy, files, revert=True)
    assert sorted(w for _, w in back) == ["reverted"] * len(files)
    assert {n: (tree_copy / n).read_bytes() for n in pristine} == pristine
    again = ap.apply_all(tree_copy, files, revert=True)
    assert [w for _, w in again] == ["already unapplied"] * len(files)


def test_a_patch_may_change_what_an_earlier_one_added(tmp_path):
    """0014 and 0015 rework functions that 0006 and 0005 add: taken alone, the earlier patch no
    longer takes back cleanly from a fully patched tree; judged as part of the series it does."""
    tree, pdir = tmp_path / "tree", tmp_path / "patches"
    tree.mkdir(); pdir.mkdir()
    (tree / "f.c").write_text("int a;\nint b;\nint c;\n")
    (pdir / "0001-add.patch").write_text(
        "adds x\n--- a/f.c\n+++ b/f.c\n@@ -1,3 +1,4 @@\n int a;\n+int x;\n int b;\n int c;\n")
    (pdir / "0002-rework.patch").write_text(
        "reworks x\n--- a/f.c\n+++ b/f.c\n@@ -1,4 +1,4 @@\n int a;\n-int x;\n+long x;\n int b;\n int c;\n")
    files = ap.patches(pdir)
    assert ap.states(tree, files) == ["unapplied", "unapplied"]
    assert [w for _, w in ap.apply_all(tree, files)] == ["applied", "applied"]
    assert (tree / "f.c").read_text() == "int a;\nlong x;\nint b;\nint c;\n"
    assert not ap._patch(tree, files[0], "-R", "--dry-run")      # alone it looks like a conflict
    assert ap.states(tree, files) == ["applied", "applied"]
    assert ap.state(tree, files[0]) == "applied"
    assert [w for _, w in ap.apply_all(tree, files)] == ["already applied"] * 2
    assert sorted(w for _, w in ap.apply_all(tree, files, revert=True)) == ["reverted"] * 2
    assert (tree / "f.c").read_text() == "int a;\nint b;\nint c;\n"
    (tree / "f.c").write_text("int a;\nint y;\nint b;\nint c;\n")   # edited where 0001 goes
    assert ap.states(tree, files) == ["conflict", "conflict"]         # no fuzz: refused, not guessed


def test_a_tree_that_does_not_fit_is_refused_by_name(tree_copy):
    files = ap.patches()
    ap.apply_all(tree_copy, files, revert=True)
    target = tree_copy / _touched(files[0])[0]
    target.write_text("// not the pinned file\n")
    with pytest.raises(ap.PatchError, match=re.escape(files[0].name)):
        ap.apply_all(tree_copy, files)


def test_cli_check_reports_unapplied(tree_copy, capsys):
    ap.apply_all(tree_copy, ap.patches(), revert=True)
    assert ap.main(["--tree", str(tree_copy), "--check"]) == 1
    assert ap.main(["--tree", str(tree_copy)]) == 0
    assert ap.main(["--tree", str(tree_copy), "--check"]) == 0
    assert "applied" in capsys.readouterr().err


def test_invariant_rows_as_ggml_reads_them(monkeypatch):
    from fastspec import _core
    monkeypatch.delenv("GGML_CPU_INVARIANT_ROWS", raising=False)
    built = _core.invariant_rows()
    assert built in (0, 16)             # 0 only in a -DFASTSPEC_PATCHES=OFF build
    if built:
        for env, rows in (("8", 8), (" 4x", 4), ("0", 0), ("-3", 0), ("none", 0)):
            monkeypatch.setenv("GGML_CPU_INVARIANT_ROWS", env)
            assert _core.invariant_rows() == rows


# -- patch 0007: llama_set_n_logits -------------------------------------------------------
def _decode_steps(ctx, steps):
    """Decode each list of tokens in turn; the last row's logits after each."""
    out = []
    for toks in steps:
        ctx.decode(toks)
        out.append(ctx.get_logits(-1))
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_leading_and_extra_logits_equal_the_full_ones(tiny_dir, dtype):
    # patch 0007: logits for ids [0, n) and a few extra ids are the full matmul's values for
    # those ids, bit for bit (each is the same row's dot product); every other id reads -inf;
    # a new set of extra ids takes effect at the next decode (the old graph is not reused)
    import numpy as np
    from fastspec import _core
    import tiny_models
    path = tiny_models.write_tiny_llama(tiny_dir / f"nlogits-{dtype}.gguf", vocab="bpe", dtype=dtype)
    model = _core.Model(str(path))
    v = model.n_vocab
    assert v > 128
    steps = [[1, 5, 9, 13, 17, 21], [4], [7], [30, 31], [2]]
    with _core.Context(model, n_ctx=64) as full:
        ref = _decode_steps(full, steps)
    with _core.Context(model, n_ctx=64) as part:
        lead = part.set_n_logits(60, extra=[v - 1, 100, 100, 3])       # 60 -> 64; 3 is already in
        if not _core.invariant_rows():
            assert lead == v                                          # unpatched build: all of them
            return
        assert (lead, part.n_logits, part.n_extra) == (64, 64, 2)
        got = _decode_steps(part, steps[:3])
        assert part.set_n_logits(64, extra=[v - 2]) == 64 and part.n_extra == 1
        got += _decode_steps(part, steps[3:])
    for i, (r, g) in enumerate(zip(ref, got)):
        ids = [v - 1, 100] if i < 3 else [v - 2]
        keep = np.zeros(v, bool)
        keep[:64] = True
        keep[ids] = True
        assert np.array_equal(r[keep], g[keep]), i
        assert np.all(np.isneginf(g[~keep])), i
    model.close()


def test_set_n_logits_bad_input(bpe_target):
    from fastspec import _core
    model = _core.Model(str(bpe_target))
    with _core.Context(model, n_ctx=32) as ctx:
        v = model.n_vocab
        for bad, exc in ((0, ValueError), (-5, ValueError), ("64", TypeError), (True, TypeError)):
            with pytest.raises(exc):
                ctx.set_n_logits(bad)
        with pytest.raises(ValueError, match="extra ids"):
            ctx.set_n_logits(64, extra=[v])
        with pytest.raises(ValueError, match="extra ids"):
            ctx.set_n_logits(64, extra=[-1])
        if v > 1025:
            with pytest.raises(ValueError, match="at most 1024"):
                ctx.set_n_logits(64, extra=range(v - 1025, v))

        assert ctx.set_n_logits(None) == v and ctx.n_extra == 0      # back to all of them
        ctx.decode([1, 2, 3])
        assert ctx.get_logits(-1).shape == (v,)
    model.close()
