"""ruff and mypy as configured in pyproject.toml, so CI keeps the code to the project's standards."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO, VENV_BIN


def test_ruff_is_clean() -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "ruff"), "check", "osfleet", "golden_images", "loadtest", "infra", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout


def test_mypy_is_clean() -> None:
    proc = subprocess.run([str(VENV_BIN / "mypy")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
