#!/usr/bin/env python3
"""Fill ``vendor/llama.cpp`` with the pinned llama.cpp tree.

The folder is a git submodule pinned to ``PINNED_COMMIT``.  Where git hosts can
be reached, ``git submodule update --init`` is all that is needed.  Where they
cannot, the same tree is taken from the PyPI sdist of ``llama-cpp-python``,
which vendors llama.cpp at exactly that commit.  The sdist is fetched in one of
two ways, each needing nothing but Python and the package index (no git, no
compiler, no build backend installed beforehand):

1. ``pip download`` (honours all of pip's configuration: index, proxies,
   certificates).  pip prepares the sdist's metadata in an isolated build
   environment, fetching llama-cpp-python's build backend from the index.
2. Straight from the index's simple API with urllib, for when pip cannot run or
   cannot prepare that metadata: the index is ``PIP_INDEX_URL`` (else pip's
   configured ``index-url``, else PyPI), then any ``PIP_EXTRA_INDEX_URL``.

Whichever way it came, the sdist's sha256 is checked against ``SDIST_SHA256``,
its ``vendor/llama.cpp`` extracted and the commit recorded in its shallow git
metadata confirmed to be ``PINNED_COMMIT``.

Idempotent: a folder that already holds the pinned tree is left alone.

    python vendor/fetch_llama_cpp.py                 # fill if needed (git, pip, index)
    python vendor/fetch_llama_cpp.py --source index  # one way only: git, pip or index
    python vendor/fetch_llama_cpp.py --check         # exit 1 if not filled

Exit status: 0 filled, 1 not filled (--check), 2 every way failed (each one's
reason is printed).
"""
from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

PINNED_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILENAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PYPI_SIMPLE = "https://pypi.org/simple/"
TIMEOUT_S = 60            # per network read (urllib)
PIP_TIMEOUT_S = 1800      # the whole `pip download`

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


# -- way 0: the git submodule ---------------------------------------------------------

def _from_git() -> None:
    repo = VENDOR_DIR.parent
    if not (repo / ".git").exists():
        raise FetchError("not a git checkout (no .git next to vendor/)")
    _log("trying `git submodule update --init vendor/llama.cpp` ...")
    try:
        subprocess.run(
            ["git", "-C", str(repo), "-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=20",
             "submodule", "update", "--init", "--depth", "1", "vendor/llama.cpp"],
            check=True, timeout=120, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        )
    except FileNotFoundError:
        raise FetchError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise FetchError("`git submodule update` took more than 120 s") from None
    except subprocess.CalledProcessError as exc:
        out = exc.stderr or exc.stdout or ""
        fatal = [ln for ln in out.splitlines() if ln.startswith("fatal:")]
        raise FetchError("`git submodule update` failed: " + (fatal[0] if fatal else _tail(out, 600))) from None
    if not is_filled():
        raise FetchError(f"the submodule checkout is not at {PINNED_COMMIT}")


# -- way 1: pip download ----------------------------------------------------------------

def _tail(text: str | None, n: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


def _download_with_pip(dest: Path) -> Path:
    # Build isolation stays on (never --no-build-isolation): pip fetches the sdist's
    # build backend into a throw-away environment just to read its metadata, so
    # nothing has to be installed here first.  PIP_NO_BUILD_ISOLATION in the
    # caller's environment would turn that off; drop it for this one command.
    env = {k: v for k, v in os.environ.items() if k != "PIP_NO_BUILD_ISOLATION"}
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
           f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(dest)]
    _log(f"trying `pip download {SDIST_NAME}=={SDIST_VERSION}` ...")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env=env, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"`pip download` took more than {PIP_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        out = proc.stderr or proc.stdout
        if "No module named pip" in out:
            raise FetchError(f"{sys.executable} has no pip module")
        raise FetchError(f"`pip download` exited with {proc.returncode}: " + _tail(out, 1500))
    path = dest / SDIST_FILENAME
    if not path.is_file():
        raise FetchError(f"`pip download` succeeded but left no {SDIST_FILENAME} in {dest}")
    return path


# -- way 2: the index's simple API, with urllib ------------------------------------------

def _pip_config_index() -> str | None:
    """pip's configured index-url (pip.conf), if pip can be asked."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    url = proc.stdout.strip()
    return url if proc.returncode == 0 and url else None


def index_urls() -> list[str]:
    """The simple-API indexes to try, in order, as pip would use them: PIP_INDEX_URL
    (else pip's configured index-url, else PyPI), then PIP_EXTRA_INDEX_URL's."""
    urls = [os.environ.get("PIP_INDEX_URL") or _pip_config_index() or PYPI_SIMPLE]
    urls.extend(os.environ.get("PIP_EXTRA_INDEX_URL", "").split())
    out = []
    for u in urls:
        u = u.rstrip("/") + "/"
        if u not in out:
            out.append(u)
    return out


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[tuple[str, str]] = []   # (href, text)
        self._href = None
        self._text = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.hrefs.append((self._href, "".join(self._text).strip()))
            self._href = None


def find_sdist_url(page: str, content_type: str, page_url: str) -> str | None:
    """The download URL of SDIST_FILENAME in a simple-API project page (PEP 691 JSON or
    PEP 503 HTML), made absolute against ``page_url``; None if the page lacks it."""
    if "json" in content_type:
        for f in json.loads(page).get("files", []):
            if f.get("filename") == SDIST_FILENAME:
                return urllib.parse.urljoin(page_url, f["url"])
        return None
    parser = _Anchors()
    parser.feed(page)
    for href, text in parser.hrefs:
        name = urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1])
        if SDIST_FILENAME in (text, name):
            return urllib.parse.urljoin(page_url, href)
    return None


def _download_from_index(dest: Path) -> Path:
    failures = []
    for index in index_urls():
        page_url = urllib.parse.urljoin(index, f"{SDIST_NAME}/")
        shown = _redact(page_url)
        _log(f"trying the index {shown} ...")
        req = urllib.request.Request(page_url, headers={
            "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5",
            "User-Agent": "fastspec-fetch-llama-cpp",
        })
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                ctype = resp.headers.get("Content-Type", "") or ""
                page = resp.read().decode("utf-8", "replace")
            url = find_sdist_url(page, ctype, page_url)
            if url is None:
                failures.append(f"{shown}: lists no {SDIST_FILENAME}")
                continue
            url = urllib.parse.urldefrag(url)[0]
            path = dest / SDIST_FILENAME
            _log(f"downloading {_redact(url)} ...")
            req = urllib.request.Request(url, headers={"User-Agent": "fastspec-fetch-llama-cpp"})
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp, open(path, "wb") as f:
                shutil.copyfileobj(resp, f, 1 << 20)
            _check_sha256(path)
            return path
        except FetchError as exc:
            failures.append(f"{shown}: {exc}")
        except (OSError, ValueError, urllib.error.URLError) as exc:   # HTTPError is a URLError
            failures.append(f"{shown}: {type(exc).__name__}: {exc}")
    raise FetchError("no index gave the sdist:\n    " + "\n    ".join(failures))


def _redact(url: str) -> str:
    """The URL without any user:password part (index URLs may carry credentials)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


# -- check and extract ----------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_sha256(path: Path) -> None:
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        raise FetchError(f"sha256 mismatch for {path.name}: got {digest}, expected {SDIST_SHA256}")


def _extract(sdist: Path, work: Path) -> None:
    _check_sha256(sdist)
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


SOURCES = ("git", "pip", "index")


def fetch(sources=SOURCES) -> str:
    """Fill vendor/llama.cpp, trying ``sources`` in order; returns the one that worked
    ("present" if nothing was needed).  Raises FetchError naming every failure."""
    if is_filled():
        _log(f"vendor/llama.cpp already at {PINNED_COMMIT[:12]}")
        return "present"
    if (LLAMA_DIR / ".git").exists() and not STAMP.exists() and (LLAMA_DIR / "include").exists():
        raise FetchError("vendor/llama.cpp is a git checkout at another commit; run "
                         f"`git -C vendor/llama.cpp checkout {PINNED_COMMIT}`")
    failures = []
    for source in sources:
        try:
            if source == "git":
                _from_git()
                _log("filled from the git submodule")
                return source
            with tempfile.TemporaryDirectory(prefix="fastspec-llama-", dir=VENDOR_DIR) as tmp:
                download = _download_with_pip if source == "pip" else _download_from_index
                sdist = download(Path(tmp))
                _extract(sdist, Path(tmp))
            _log(f"filled vendor/llama.cpp from the {SDIST_NAME} {SDIST_VERSION} sdist via {source} "
                 f"(sha256 checked, commit {PINNED_COMMIT[:12]} confirmed)")
            return source
        except FetchError as exc:
            _log(f"{source}: failed: {exc}")
            failures.append((source, str(exc)))
    what = {"git": "git submodule", "pip": "pip download", "index": "package index (urllib)"}
    raise FetchError(
        "could not fill vendor/llama.cpp; every way failed:\n"
        + "\n".join(f"  - {what[s]}: {msg}" for s, msg in failures)
        + f"\nFix one of: make github.com reachable and run `git submodule update --init "
          f"vendor/llama.cpp`; or make the package index reachable (PyPI, or a mirror in "
          f"PIP_INDEX_URL) so that {SDIST_FILENAME} (sha256 {SDIST_SHA256[:16]}...) can be "
          "downloaded; or put the pinned llama.cpp tree in vendor/llama.cpp yourself.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether the folder is filled")
    ap.add_argument("--source", choices=SOURCES, action="append",
                    help="try only this way (repeatable; default: git, then pip, then index)")
    ap.add_argument("--no-git", action="store_true", help="skip the git submodule attempt")
    args = ap.parse_args(argv)
    if args.check:
        ok = is_filled()
        _log("filled" if ok else "not filled")
        return 0 if ok else 1
    sources = args.source or [s for s in SOURCES if not (args.no_git and s == "git")]
    try:
        fetch(sources)
    except FetchError as exc:
        _log(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
