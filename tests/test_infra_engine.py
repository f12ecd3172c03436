"""The Pulumi engine built on this machine (on first use): one pinned version everywhere, and a second build is
skipped."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest

from osfleet.lab.engine import engine_root, engine_version, ensure_engine

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parent.parent


def test_go_module_and_python_sdk_pin_the_same_version() -> None:
    gomod = (REPO / "infra/tools/go.mod").read_text()
    pins = set(re.findall(r"github.com/pulumi/pulumi/(?:pkg|sdk)/v3 v(\d+\.\d+\.\d+)", gomod))
    extra = re.search(r'^infra = \["pulumi==([\d.]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert extra is not None
    assert pins == {extra.group(1)} == {importlib.metadata.version("pulumi")}
    # The fork pkg/v3 replaces, repeated; its ../sdk replace is the plain sdk/v3 requirement above.
    assert "replace github.com/atotto/clipboard => github.com/tgummerer/clipboard" in gomod


def test_built_engine_reports_the_pinned_version_and_a_second_build_is_skipped() -> None:
    ensure_engine()  # built on first use, not by scripts/setup
    assert engine_version() == f"pulumi v{importlib.metadata.version('pulumi')}"
    assert engine_root().is_relative_to(REPO) is False  # outside the checkout: a fresh clone reuses it
    done = subprocess.run([str(REPO / "scripts/build-pulumi")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "already built" in done.stdout and "(skipped)" in done.stdout
    shim = engine_root() / "bin" / "pulumi-resource-pulumi-python"
    assert "-m pulumi.dynamic" in shim.read_text()
    host = engine_root() / "bin" / "pulumi-language-python"  # osfleet's language host, next to the engine
    assert "-m osfleet.lab.language_host" in host.read_text() and host.stat().st_mode & 0o111


def test_the_language_host_shim_finds_the_projects_venv_without_infra_env(tmp_path: Path) -> None:
    """A user who only put the engine on PATH: the host runs with the nearest .venv upwards that has osfleet."""
    import os

    shim = engine_root() / "bin" / "pulumi-language-python"
    env = {k: v for k, v in os.environ.items() if k != "OSFLEET_PYTHON"}
    done = subprocess.run(
        ["sh", "-x", str(shim), "--version"], cwd=REPO / "infra", env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == importlib.metadata.version("pulumi")
    assert f"exec {REPO}/.venv/bin/python -I -m osfleet.lab.language_host" in done.stderr


STAND_IN_BUILD = """#!/bin/sh
# Stands in for scripts/build-pulumi (the real Go build takes minutes; CI runs it on a machine without the engine):
# it says what it does and leaves an engine that reports the pinned version.
echo "[build-pulumi] building pulumi v$VERSION"
echo built >> "$OSFLEET_HOME/builds"
bin="$OSFLEET_HOME/tools/pulumi-v$VERSION/bin"
mkdir -p "$bin"
printf '#!/bin/sh\\necho v%s\\n' "$VERSION" > "$bin/pulumi"
chmod +x "$bin/pulumi"
"""


def test_a_machine_without_the_engine_builds_it_on_first_use_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up no longer builds the engine: the first command that needs it runs the checkout's build script once,
    its progress lines shown, and a second use finds it built."""
    from osfleet.config import Settings

    version = importlib.metadata.version("pulumi")
    checkout = tmp_path / "checkout"
    (checkout / "infra" / "osfleet_infra").mkdir(parents=True)
    (checkout / "Pulumi.yaml").write_text("name: osfleet\n")
    script = checkout / "scripts" / "build-pulumi"
    script.parent.mkdir()
    script.write_text(STAND_IN_BUILD)
    script.chmod(0o755)
    home = tmp_path / "home"
    (home / "pulumi").mkdir(parents=True)
    (home / "pulumi" / "passphrase").write_text("set-up made it\n")  # what set-up still does
    monkeypatch.setenv("OSFLEET_PROJECT", str(checkout))
    monkeypatch.setenv("VERSION", version)
    monkeypatch.delenv("OSFLEET_TOOLS", raising=False)
    said: list[str] = []
    root = ensure_engine(Settings(home=home), said.append)
    assert root == home / "tools" / f"pulumi-v{version}"
    assert said[0].startswith(f"osfleet: building the Pulumi engine v{version} on its first use on this machine")
    assert f"[build-pulumi] building pulumi v{version}" in said
    assert ensure_engine(Settings(home=home), said.append) == root
    assert (home / "builds").read_text() == "built\n"  # once
