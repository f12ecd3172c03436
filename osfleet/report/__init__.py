"""Turn a run directory into report.md, report.html and PNG figures: load -> figures -> write.

Only numbers found in the run directory's result files appear, each marked "measured here"; the report
covers whichever results the run holds (disk bench, boot, resets, load test, cost), so later benchmarks
add sections. Markdown and HTML come from the Jinja2 templates in ``templates/`` (package data).
"""

from __future__ import annotations

from pathlib import Path

from osfleet.report.figures import Figure, draw
from osfleet.report.load import RunResults, load, trajectory_summary
from osfleet.report.write import write

__all__ = ["Figure", "RunResults", "draw", "load", "render", "trajectory_summary", "write"]


def render(run_dir: Path) -> list[Path]:
    """Write the report files into ``run_dir``; returns their paths (report.md, report.html, figures)."""
    results = load(run_dir)
    return write(results, draw(results))
