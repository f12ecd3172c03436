"""Logging is configured once, from ``osfleet --log-level`` or ``$OSFLEET_LOG`` (default WARNING)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from osfleet import logs
from osfleet.cli import cli
from tests.conftest import VENV_BIN


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _ours() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if h.get_name() == logs._HANDLER_NAME]


@pytest.mark.unit
def test_configure_is_idempotent_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.ENV_VAR, raising=False)
    assert logs.configure() == logging.WARNING
    assert logs.configure("debug") == logging.DEBUG
    assert len(_ours()) == 1 and logging.getLogger().level == logging.DEBUG
    monkeypatch.setenv(logs.ENV_VAR, "error")
    assert logs.configure() == logging.ERROR
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        logs.configure("loud")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "env", "level"),
    [
        ([], {}, logging.WARNING),
        (["--log-level", "debug"], {}, logging.DEBUG),
        ([], {logs.ENV_VAR: "INFO"}, logging.INFO),
        (["--log-level", "ERROR"], {logs.ENV_VAR: "INFO"}, logging.ERROR),  # the option wins
    ],
)
def test_the_cli_sets_the_level_once(
    args: list[str], env: dict[str, str], level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(logs.ENV_VAR, raising=False)
    result = CliRunner().invoke(cli, [*args, "tasks", "ls"], env=env)
    assert result.exit_code == 0, result.output
    assert logging.getLogger().level == level and len(_ours()) == 1


@pytest.mark.system
def test_a_bad_level_is_a_usage_error() -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "osfleet"), "--log-level", "loud", "tasks", "ls"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "Invalid value for '--log-level'" in proc.stderr


@pytest.mark.system
def test_records_reach_stderr_at_the_chosen_level() -> None:
    code = (
        "import logging, sys; from osfleet.cli import cli\n"
        "@cli.command('emit')\n"
        "def emit():\n"
        "    logging.getLogger('osfleet.x').info('hello-info'); logging.getLogger('osfleet.x').debug('hello-debug')\n"
        "cli(['--log-level', 'info', 'emit'], standalone_mode=False)\n"
    )
    proc = subprocess.run([str(VENV_BIN / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert " INFO osfleet.x: hello-info" in proc.stderr and "hello-debug" not in proc.stderr
