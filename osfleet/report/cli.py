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
@click.option(
    "--benchmark-page",
    "page_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="also write the run as a dated page of the documentation's benchmarks into this folder "
    "(docs/benchmarks): <date>-<run>.md, tables only",
)
@_friendly
def report_cmd(run_dir: Path, page_dir: Path | None) -> None:
    """Render a run directory into report.md, report.html and PNG figures."""
    from osfleet.report import load, render
    from osfleet.report.write import benchmark_page

    for path in render(run_dir):
        click.echo(path)
    if page_dir is not None:
        click.echo(benchmark_page(load(run_dir), page_dir))
