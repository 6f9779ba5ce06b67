"""The compiled core's type stubs (``_core.pyi``) name only what the module has: every
constant, function and class, and every method and property of those classes (a stub left
behind by a rename would mislead type checkers and readers alike)."""
import ast
from pathlib import Path

from fastspec import _core

STUB = Path(_core.__file__).with_name("_core.pyi")
if not STUB.exists():      # an editable install: the stub sits with the sources
    STUB = Path(__file__).resolve().parents[1] / "src" / "fastspec" / "_core.pyi"


def _names(body):
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node.name, node


def test_every_name_in_the_stubs_is_in_the_module():
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    missing, n = [], 0
    for name, node in _names(tree.body):
        n += 1
        if not hasattr(_core, name):
            missing.append(name)
            continue
        if isinstance(node, ast.ClassDef):
            cls = getattr(_core, name)
            for member, _ in _names(node.body):
                n += 1
                if not hasattr(cls, member):
                    missing.append(f"{name}.{member}")
    assert n > 100 and not missing, missing
