"""A decoder's calibrated costs kept on disk, so that the next process with the same pair on
the same machine starts generating at once instead of timing every verification size again.

The first adaptive generation of a ``SpeculativeDecoder`` times the target's verification
batch sizes and the draft model's tokens (2-4 s on a 2-core CPU with the default pair:
longer than many a short answer takes).  What it found is stored in ``costs.json`` in the
model cache (``fastspec.models.cache_dir()``; ``$FASTSPEC_COST_CACHE`` names another file,
``0`` turns the cache off), keyed by everything that moves those costs: the two model files
(path, size, modification time), the threads, where the layers run, flash attention, the
largest verification batch, the draft's logit rows, the CPU and ggml's build features, and
fastspec's version and compiled core (a rebuild is another build).  A decoder whose key is there takes the stored costs
(``CostModel.restore``) and refines them pass by pass, as it would a calibration's.

A file that cannot be read or written leaves the decoder calibrating as it would without
the cache: the cache only ever saves time, never fails a generation.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from . import _core

FORMAT = 1           # the file's layout; another is ignored (and replaced on the next save)
MAX_ENTRIES = 32     # pairs × settings kept; the least recently saved go first


def default_path() -> Path | None:
    """Where the costs live: ``$FASTSPEC_COST_CACHE`` if set (``0``, ``off`` or empty: no
    cache, None), else ``costs.json`` in the model cache."""
    env = os.environ.get("FASTSPEC_COST_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "false", "no") else Path(env).expanduser()
    from .models import cache_dir
    return cache_dir() / "costs.json"


def resolve(setting) -> Path | None:
    """``cost_cache`` as a decoder takes it: True (the default place, see default_path),
    False or None (none), or a path."""
    if setting is True:
        return default_path()
    if setting is False or setting is None:
        return None
    if isinstance(setting, (str, os.PathLike)):
        if not str(setting):
            raise ValueError("cost_cache: an empty path")
        return Path(setting).expanduser()
    raise TypeError(f"cost_cache must be True, False or a path, got {type(setting).__name__}")


def _file_identity(path: str) -> list:
    p = Path(path)
    try:
        st = p.stat()
        return [str(p.resolve()), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(p), None, None]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields = {}
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("model name", "cpu family", "model", "stepping", "Hardware", "CPU part") \
                        and k not in fields:
                    fields[k] = v.strip()
                if not line.strip() and fields:
                    break
        return "; ".join(f"{k}={v}" for k, v in sorted(fields.items()))
    except OSError:
        return platform.processor() or platform.machine()


def key(*, target: str, draft: str | None, n_threads: int, target_on_gpu: bool, draft_on_gpu: bool,
        use_mmap: bool, flash_attn, n_batch: int, max_verify: int, draft_vocab: int) -> str:
    """The cache key of a decoder's costs (a hex digest of everything listed in the module's
    docstring)."""
    from . import LLAMA_CPP_COMMIT, __version__
    # the compiled core's own file too: a rebuild (another patch, another kernel) is another build
    parts = dict(fastspec=__version__, llama_cpp=LLAMA_CPP_COMMIT, core=_file_identity(_core.__file__),
                 target=_file_identity(target),
                 draft=_file_identity(draft) if draft else None, n_threads=n_threads,
                 on_gpu=[target_on_gpu, draft_on_gpu], use_mmap=use_mmap, flash_attn=flash_attn,
                 n_batch=n_batch, max_verify=max_verify, draft_vocab=draft_vocab,
                 cpu=_cpu_name(), cpus=os.cpu_count(), machine=platform.machine(),
                 system=_core.system_info())
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _read(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def load(path: Path, k: str) -> dict | None:
    """The stored cost state under key ``k`` (what ``CostModel.state()`` gave), or None."""
    entry = _read(path).get(k)
    if not isinstance(entry, dict) or not isinstance(entry.get("costs"), dict):
        return None
    return entry["costs"]


def save(path: Path, k: str, costs: dict) -> bool:
    """Store ``costs`` under key ``k`` (written whole to a temporary file, then moved over
    the old one: a reader never sees half a file); False where it could not be written."""
    entries = _read(path)
    entries[k] = dict(costs=costs, saved=time.time())
    if len(entries) > MAX_ENTRIES:
        keep = sorted(entries, key=lambda e: entries[e].get("saved", 0.0) if isinstance(entries[e], dict) else 0.0)
        for old in keep[:len(entries) - MAX_ENTRIES]:
            del entries[old]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".costs-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(dict(format=FORMAT, entries=entries), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
