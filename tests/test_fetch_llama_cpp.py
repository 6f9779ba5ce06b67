"""vendor/fetch_llama_cpp.py: filling vendor/llama.cpp with nothing but Python and the
package index (no git access, no build tool installed), and clear errors otherwise."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "vendor" / "fetch_llama_cpp.py"


@pytest.fixture(scope="module")
def fetch_mod():
    spec = importlib.util.spec_from_file_location("fetch_llama_cpp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _layout(root: Path) -> Path:
    """A copy of the repository's layout as far as the fetch cares: vendor/ with the
    script and an empty llama.cpp folder (what a fresh clone has).  No .git."""
    (root / "vendor" / "llama.cpp").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "vendor" / SCRIPT.name)
    return root / "vendor" / SCRIPT.name


def test_finds_the_sdist_in_json_and_html_index_pages(fetch_mod):
    name = fetch_mod.SDIST_FILENAME
    page = "https://mirror.example/simple/llama-cpp-python/"
    js = json.dumps({"files": [
        {"filename": "llama_cpp_python-0.3.35.tar.gz", "url": "../../files/old.tar.gz"},
        {"filename": name, "url": f"../../files/{name}"},
    ]})
    assert fetch_mod.find_sdist_url(js, "application/vnd.pypi.simple.v1+json", page) == \
        f"https://mirror.example/files/{name}"
    html = (f'<html><body><a href="https://files.example/a/llama_cpp_python-0.3.35.tar.gz#sha256=00">'
            f'llama_cpp_python-0.3.35.tar.gz</a>\n<a href="/packages/x/{name}#sha256=ab">{name}</a>'
            "</body></html>")
    assert fetch_mod.find_sdist_url(html, "text/html", page) == \
        f"https://mirror.example/packages/x/{name}#sha256=ab"
    assert fetch_mod.find_sdist_url("<a href='x.whl'>x.whl</a>", "text/html", page) is None
    assert fetch_mod.find_sdist_url('{"files": []}', "application/vnd.pypi.simple.v1+json", page) is None


def test_index_order_follows_pip(fetch_mod, monkeypatch):
    monkeypatch.setattr(fetch_mod, "_pip_config_index", lambda: None)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    assert fetch_mod.index_urls() == [fetch_mod.PYPI_SIMPLE]
    monkeypatch.setenv("PIP_INDEX_URL", "https://u:secret@mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://extra.example/simple/ https://u:secret@mirror.example/simple/")
    assert fetch_mod.index_urls() == ["https://u:secret@mirror.example/simple/", "https://extra.example/simple/"]
    assert "secret" not in fetch_mod._redact("https://u:secret@mirror.example/simple/")


def test_a_wrong_sdist_is_refused(fetch_mod, tmp_path):
    bogus = tmp_path / fetch_mod.SDIST_FILENAME
    bogus.write_bytes(b"not the sdist")
    with pytest.raises(fetch_mod.FetchError, match="sha256 mismatch"):
        fetch_mod._extract(bogus, tmp_path)


def test_every_failure_is_named(tmp_path):
    """With no git checkout and an unreachable index, the fetch exits 2 and says, for
    each way it tried, what failed, and what to do; vendor/llama.cpp stays empty."""
    script = _layout(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple",
               PIP_RETRIES="0", PIP_TIMEOUT="5", PIP_NO_CACHE_DIR="1")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "every way failed" in err
    assert "git submodule: not a git checkout" in err
    assert "pip download: `pip download` exited with" in err
    assert "package index (urllib): no index gave the sdist" in err and "127.0.0.1:9" in err
    assert "PIP_INDEX_URL" in err                     # the advice
    assert not any((tmp_path / "repo" / "vendor" / "llama.cpp").iterdir())
    assert sorted(p.name for p in (tmp_path / "repo" / "vendor").iterdir()) == ["fetch_llama_cpp.py", "llama.cpp"]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A fresh virtual environment with pip only: no scikit-build-core, no Cython, nothing
    from this interpreter's site-packages."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    probe = subprocess.run([str(py), "-c", "import scikit_build_core"], capture_output=True)
    assert probe.returncode != 0, "the fresh venv must not have a build backend"
    return str(py)


def _env_without_build_backend():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_NO_BUILD_ISOLATION")}
    return env


def _assert_filled(repo: Path, fetch_mod):
    llama = repo / "vendor" / "llama.cpp"
    assert (llama / "include" / "llama.h").is_file()
    assert (llama / "ggml" / "CMakeLists.txt").is_file()
    assert (llama / ".fastspec-commit").read_text().strip() == fetch_mod.PINNED_COMMIT
    leftovers = [p.name for p in (repo / "vendor").iterdir() if p.name.startswith("fastspec-llama-")]
    assert leftovers == [], "temporary download folder left behind"


@pytest.mark.slow
@pytest.mark.parametrize("way", ["default", "index"])
def test_fills_from_a_bare_python(bare_python, fetch_mod, tmp_path, way):
    """The real download from a venv holding only pip, in a layout without .git (so the
    git way fails first): 'default' falls back to `pip download`, 'index' fetches the
    sdist from the index's simple API with urllib.  Either way the sha256 and the
    llama.cpp commit inside are checked."""
    repo = tmp_path / "repo"
    script = _layout(repo)
    args = [] if way == "default" else ["--source", "index"]
    proc = subprocess.run([bare_python, str(script), *args], capture_output=True, text=True,
                          env=_env_without_build_backend(), stdin=subprocess.DEVNULL, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    want = "via pip" if way == "default" else "via index"
    assert want in proc.stderr and f"commit {fetch_mod.PINNED_COMMIT[:12]} confirmed" in proc.stderr
    _assert_filled(repo, fetch_mod)
    again = subprocess.run([bare_python, str(script)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already at" in again.stderr
    check = subprocess.run([bare_python, str(script), "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0
