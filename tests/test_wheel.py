"""Packaging: ``osfleet`` is the library and never imports the Fabric tasks in ``golden_images``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports: ``import x``, ``from x import y``, and ``import_module("x")`` calls."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def test_osfleet_never_imports_golden_images() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(m for m in _imported_modules(path) if m.split(".")[0] == "golden_images")
        for path in sorted((REPO / "osfleet").rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_check_sees_every_spelling(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import golden_images.fabfile\nfrom golden_images import builder\n"
        "import importlib\nimportlib.import_module('golden_images.x')\n"
    )
    assert _imported_modules(f) >= {"golden_images.fabfile", "golden_images", "golden_images.x"}
