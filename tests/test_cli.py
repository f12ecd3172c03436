"""The command line: help everywhere, one readable error line and exit 1 for bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.system

OSFLEET = str(VENV_BIN / "osfleet")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OSFLEET, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["image"],
        ["image", "build"],
        ["image", "publish"],
        ["image", "ls"],
        ["image", "verify"],
        ["disk"],
        ["disk", "provision"],
        ["accel"],
        ["bench"],
        ["bench", "disk"],
        ["bench", "all"],
        ["report"],
    ],
)
def test_every_command_has_help(args: list[str]) -> None:
    proc = run(*args, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout


def test_top_level_help_lists_every_command() -> None:
    out = run("--help").stdout
    for cmd in ("image", "disk", "accel", "bench", "report"):
        assert f"  {cmd} " in out


def errors_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def test_unknown_image_is_one_line(tmp_path: Path) -> None:
    proc = run(
        "bench",
        "disk",
        "--image",
        "golden-doesnotexist",
        env={"OSFLEET_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1
    assert errors_of(proc) == ["osfleet: error: no golden image matches 'golden-doesnotexist' (see 'osfleet image ls')"]


def test_no_image_at_all_says_what_to_do(tmp_path: Path) -> None:
    proc = run("image", "verify", env={"OSFLEET_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "run 'osfleet image build'" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_recipe_is_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: Not Valid\n")
    proc = run("image", "build", "--recipe", str(recipe), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1
    (line,) = errors_of(proc)
    assert line.startswith("osfleet: error: bad recipe") and "name" in line


def test_report_of_an_empty_directory_is_one_line(tmp_path: Path) -> None:
    proc = run("report", str(tmp_path))
    assert proc.returncode == 1 and len(errors_of(proc)) == 1 and "holds none of the results" in proc.stderr


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (REPO / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if line.startswith("./scripts/setup")]
    assert len(commands) == 2
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("./")]
    assert ci == [commands[1]]


def test_the_root_group_answers_commands_as_click_does() -> None:
    """Tools that walk a click tree through ``Group.commands`` (doc generators, the docs check) see every command,
    loaded, though the root imports a command only when it is used; ``add_command`` still adds one."""
    from osfleet.cli import COMMANDS, cli

    loaded = cli.commands
    assert list(loaded)[: len(COMMANDS)] == list(COMMANDS)
    assert all(isinstance(c, click.Command) and c.name for c in loaded.values())
    assert "build" in loaded["image"].commands  # type: ignore[attr-defined]

    @click.command("probe-added")
    def probe() -> None:
        """A command added at run time."""

    cli.add_command(probe)
    try:
        assert cli.commands["probe-added"] is probe
        assert CliRunner().invoke(cli, ["probe-added"]).exit_code == 0
    finally:
        cli._added.pop("probe-added")
