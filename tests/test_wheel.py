"""Packaging: ``osfleet`` is the library and never imports the Fabric tasks in ``golden_images``; a wheel
installed into a fresh virtualenv, away from the checkout, has everything its commands read and import."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.system

SAMPLE_RUN = REPO / "tests" / "data" / "run-sample"
# Modules that need an optional extra this test does not install (``osfleet[loadtest]``: Locust, gevent,
# requests); every other module of the wheel must import with the core dependencies and ``[reports]``.
# Modules that need an extra, and the package of it they import first (the wheel alone has none of them).
NEEDS_AN_EXTRA = {
    "osfleet.loadtest.support": "gevent",  # loadtest
    "osfleet.loadtest.trajectories": "locust",
    "osfleet.loadtest.bringup": "gevent",
    "osfleet.gym": "gymnasium",  # sdk
    "osfleet.openenv.environment": "openenv",
    "osfleet.mcp.server": "mcp",  # mcp
    "osfleet.mcp.content": "mcp",
    "osfleet.mcp.http": "mcp",
    "osfleet.mcp.roles": "mcp",
    "osfleet.client.anthropic": "anthropic",  # anthropic
    "osfleet.client.openai": "agents",  # openai
    "osfleet.e2b.app": "e2b",  # e2b
    "osfleet.e2b.control": "e2b",
    "osfleet.e2b.envd": "connectrpc",
    "osfleet.lab.language_host": "grpc",  # infra (pulumi's gRPC stubs)
}
IMPORT_EVERYTHING = """
import importlib, json, pkgutil
import golden_images, osfleet
missing = {}
for pkg in (osfleet, golden_images):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if info.name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            missing[info.name] = exc.name
print(json.dumps({"osfleet": osfleet.__file__, "missing": missing}))
"""


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


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_an_installed_wheel_works_without_the_checkout(tmp_path: Path) -> None:
    # The wheel is built from a copy of what it is made of, so the checkout gets no build/ or egg-info.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("osfleet", "golden_images"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["OSFLEET_HOME"] = str(tmp_path / "home")
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), "./src"], tmp_path, env
    )
    (wheel,) = (tmp_path / "dist").glob("osfleet-*.whl")

    # A fresh virtualenv with only the wheel's own dependencies (plus the host and reports extras).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q"]
    _run([*pip, f"{wheel}[host,reports]"], tmp_path, env, 600)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    osfleet = str(venv / "bin" / "osfleet")
    listed = _run([osfleet, "tasks", "ls"], elsewhere, env).stdout.split("\n")
    shipped = sorted(p.stem for p in (REPO / "osfleet" / "tasks" / "builtin").glob("*.yaml"))
    assert sorted(line.split()[0] for line in listed if line.strip()) == shipped

    run = elsewhere / "run"
    shutil.copytree(SAMPLE_RUN, run)
    out = _run([osfleet, "report", str(run)], elsewhere, env).stdout
    assert str(run / "report.html") in out
    assert "measured here" in (run / "report.md").read_text()
    assert (run / "cost_per_replica_day.png").stat().st_size > 0  # the packaged price table was found
    assert "<img " in (run / "report.html").read_text()

    found = json.loads(_run([python, "-c", IMPORT_EVERYTHING], elsewhere, env).stdout)
    assert found["osfleet"].startswith(str(venv))
    assert found["missing"] == NEEDS_AN_EXTRA, json.dumps(found["missing"])
    probe = (
        "from osfleet.imaging import builder; from osfleet.loadtest import locustfile;"
        "from osfleet.measure.cost import PRICES;"
        "import sys; assert len(builder.guest_files()) == 5 and builder.DEFAULT_RECIPE.is_file() and PRICES.is_file();"
        "assert all(locustfile(s).is_file() for s in ('trajectories', 'bringup')); print(builder.DEFAULT_RECIPE)"
    )
    assert _run([python, "-c", probe], elsewhere, env).stdout.startswith(str(venv))
