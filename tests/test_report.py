"""The report from a run directory recorded from a real main-job run (tests/data/run-sample: its JSON, CSV
and JSONL results, trimmed; no figures), rendered afresh: every PNG opens, every number is marked."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from PIL import Image

from osfleet.report import render
from tests.conftest import VENV_BIN

SAMPLE = Path(__file__).parent / "data" / "run-sample"


def test_report_renders_every_figure_from_a_recorded_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    paths = render(run)
    pngs = [p for p in paths if p.suffix == ".png"]
    names = {p.name for p in pngs}
    assert {
        "provisioning_time.png",
        "disk_use.png",
        "reset_cdf.png",
        "trajectories_per_minute.png",
        "request_latency.png",
        "aborts_recoveries.png",
        "cost_per_replica_day.png",
    } <= names
    for p in pngs:
        with Image.open(p) as img:
            img.verify()
    md = (run / "report.md").read_text()
    assert "measured here" in md and "(published)" in md
    assert "| disk saving vs full copies |" in md and "88% (published)" in md
    html = (run / "report.html").read_text()
    assert html.count("<img ") == len(pngs) + (1 if (run / "screenshot.png").exists() else 0)
    cost = json.loads((run / "cost.json").read_text())
    assert all(r["binding_resource"] in ("CPU", "RAM", "disk") and r["usd_per_replica_day"] > 0 for r in cost["rows"])


def test_report_cli_on_a_recorded_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    proc = subprocess.run([str(VENV_BIN / "osfleet"), "report", str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert str(run / "report.html") in proc.stdout
