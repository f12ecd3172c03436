"""ruff and mypy as configured in pyproject.toml, and the house rules of CONTRIBUTING.md that a test can check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.system

# Every folder of Python in the tree: linted and kept in ruff's format (CONTRIBUTING.md, "Tests").
PYTHON_FOLDERS = ("osfleet", "golden_images", "loadtest", "infra", "tests", "docs_src", "examples")


def test_ruff_is_clean() -> None:
    proc = subprocess.run([str(VENV_BIN / "ruff"), "check", *PYTHON_FOLDERS], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_mypy_is_clean() -> None:
    proc = subprocess.run([str(VENV_BIN / "mypy")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_tree_is_formatted() -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "ruff"), "format", "--check", *PYTHON_FOLDERS], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def tracked_files() -> list[Path]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [REPO / name for name in proc.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def is_binary(path: Path) -> bool:
    return b"\0" in path.read_bytes()[:8192]


TASK_ASSETS = "osfleet/tasks/suites/*/assets/*"


def test_no_binaries_in_the_tree() -> None:
    """CONTRIBUTING.md, "No binaries in the tree": only generated task assets, each under 1 MiB."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout: the rule is checked on what git tracks")
    binaries = [p for p in tracked_files() if is_binary(p)]
    assert binaries, "no binary file at all: the NUL-byte test itself is broken (the suite's assets are binary)"
    outside = [str(p.relative_to(REPO)) for p in binaries if not p.relative_to(REPO).match(TASK_ASSETS)]
    assert not outside, f"binary files outside the suites' assets: {outside}"
    large = [f"{p.relative_to(REPO)} ({p.stat().st_size} bytes)" for p in binaries if p.stat().st_size > 2**20]
    assert not large, f"task assets over 1 MiB: {large}"


def test_the_commit_hook_refuses_a_long_subject(tmp_path: Path) -> None:
    hook = REPO / "scripts" / "hooks" / "commit-msg"
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("# a comment git strips\n" + "x" * 72 + "\n\nThe body may be as long as it needs to be. " * 5)
    assert subprocess.run([str(hook), str(message)], capture_output=True).returncode == 0
    message.write_text("x" * 73 + "\n")
    proc = subprocess.run([str(hook), str(message)], capture_output=True, text=True)
    assert proc.returncode == 1 and "73 characters (at most 72)" in proc.stderr
