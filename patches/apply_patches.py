#!/usr/bin/env python3
"""Apply (or take back) the project's patches to the vendored llama.cpp tree.

    python patches/apply_patches.py            # apply every patches/*.patch not yet applied
    python patches/apply_patches.py --revert   # take back every applied one (FASTSPEC_PATCHES=OFF)
    python patches/apply_patches.py --check    # report each patch's state; exit 1 unless all applied

Run by CMakeLists.txt after the fetch check.  Idempotent: each patch is judged as part of
the series (a later one may rework what an earlier one added, see ``states``); one already
in the tree is left alone; one that applies neither way means the tree is not the pinned
one (or was edited by hand) and stops the build with the patch's name.  The patches are
applied in name order with ``patch -p1`` (no fuzz) from vendor/llama.cpp.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TREE = HERE.parent / "vendor" / "llama.cpp"


class PatchError(RuntimeError):
    pass


def patches(directory: Path = HERE) -> list[Path]:
    return sorted(directory.glob("*.patch"))


def _patch(tree: Path, patch_file: Path, *args: str) -> bool:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("the 'patch' program is needed to apply patches/*.patch to vendor/llama.cpp "
                         "(install it, or build with CMAKE_ARGS=-DFASTSPEC_PATCHES=OFF)")
    # -F0: no fuzz: a hunk whose context lines are not all there is refused, not placed by guess
    r = subprocess.run([exe, "-p1", "-F0", "-f", "-s", "--no-backup-if-mismatch", "-d", str(tree),
                        "-i", str(patch_file), *args],
                       capture_output=True, text=True)
    return r.returncode == 0


def touched(patch_file: Path) -> list[str]:
    """The files (relative to the tree) a patch changes."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch_file.read_text(), flags=re.M)


def states(tree: Path, files: list[Path]) -> list[str]:
    """Each patch's state in the series: 'applied', 'unapplied' or 'conflict'.

    A later patch may change lines an earlier one added (0014 widens kernels that 0005 and
    0006 add), so a patch is judged as part of the series, on a scratch copy of the files
    they touch: first every patch that takes back cleanly is taken back, last to first (in a
    patched tree the later ones first, so an earlier one then meets its own text); what is
    left is the pinned text plus the patches not in the tree.  Then, first to last, each
    applied one goes back on, and each other one is 'unapplied' if it applies there (it is
    put on too, for the ones after it) and a 'conflict' if not.
    """
    with tempfile.TemporaryDirectory(prefix="fastspec-patches-") as tmp:
        scratch = Path(tmp)
        for name in {n for p in files for n in touched(p)}:
            if (tree / name).is_file():
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / name, scratch / name)
        applied = [False] * len(files)
        for i in reversed(range(len(files))):
            if _patch(scratch, files[i], "-R", "--dry-run"):
                applied[i] = _patch(scratch, files[i], "-R")
        result = []
        for i, p in enumerate(files):
            if applied[i] and _patch(scratch, p):
                result.append("applied")
            elif not applied[i] and _patch(scratch, p, "--dry-run") and _patch(scratch, p):
                result.append("unapplied")
            else:
                result.append("conflict")
        return result


def state(tree: Path, patch_file: Path) -> str:
    """One patch's state as part of the whole series in this folder (see states)."""
    files = patches(patch_file.parent)
    return states(tree, files)[files.index(patch_file)]


def apply_all(tree: Path, files: list[Path], revert: bool = False) -> list[tuple[str, str]]:
    """Bring every patch to the wanted state; returns (name, what was done) pairs."""
    series = dict(zip(files, states(tree, files)))
    done = []
    for p in (reversed(files) if revert else files):
        s = series[p]
        if s == "conflict":
            raise PatchError(f"{p.name} applies neither forwards nor backwards to {tree}: the tree is "
                             "not the pinned llama.cpp or was edited; refill it "
                             "(rm -rf vendor/llama.cpp && python vendor/fetch_llama_cpp.py)")
        if revert and s == "applied":
            if not _patch(tree, p, "-R"):
                raise PatchError(f"taking back {p.name} failed")
            done.append((p.name, "reverted"))
        elif not revert and s == "unapplied":
            if not _patch(tree, p):
                raise PatchError(f"applying {p.name} failed")
            done.append((p.name, "applied"))
        else:
            done.append((p.name, f"already {s}"))
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=DEFAULT_TREE, help="llama.cpp tree (default vendor/llama.cpp)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--revert", action="store_true", help="take back the applied patches")
    g.add_argument("--check", action="store_true", help="only report; exit 1 unless all are applied")
    args = ap.parse_args(argv)
    if not (args.tree / "ggml").is_dir():
        print(f"[fastspec patches] {args.tree} holds no llama.cpp tree", file=sys.stderr)
        return 2
    try:
        if args.check:
            files = patches()
            found = list(zip([p.name for p in files], states(args.tree, files)))
            for name, s in found:
                print(f"[fastspec patches] {name}: {s}", file=sys.stderr)
            return 0 if all(s == "applied" for _, s in found) else 1
        for name, what in apply_all(args.tree, patches(), revert=args.revert):
            print(f"[fastspec patches] {name}: {what}", file=sys.stderr)
    except PatchError as e:
        print(f"[fastspec patches] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
