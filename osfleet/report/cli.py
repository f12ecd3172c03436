"""``osfleet report RUN_DIR``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import friendly as _friendly

F = TypeVar("F", bound=Callable[..., Any])


# --- reports -----------------------------------------------------------------------------------------------
@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@_friendly
def report_cmd(run_dir: Path) -> None:
    """Render a run directory into report.md, report.html and PNG figures."""
    from osfleet.report import render

    for path in render(run_dir):
        click.echo(path)
