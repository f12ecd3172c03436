"""Density results in the report and the cost model (a recorded run plus a density.json; no VMs), and the
bench on a few real replicas."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from osfleet.errors import OsfleetError
from osfleet.measure.cost import Footprint, footprint_from_density, replicas_per_host
from osfleet.report import load, render
from tests.conftest import VENV_BIN

SAMPLE = Path(__file__).parent / "data" / "run-sample"
DENSITY = {
    "benchmark": "density",
    "template_sharing": True,
    "held_ready": 240,
    "answering": 240,
    "stop_reason": "reached --max 240",
    "mib_per_replica": 60.0,
    "cpu_per_idle_replica": 0.004,
    "bringup_p50_s": 1.1,
    "memory_curve": [{"replicas": 1, "mib_per_replica": 90.0}, {"replicas": 240, "mib_per_replica": 60.0}],
    "sharing_off": {
        "template_sharing": False,
        "held_ready": 64,
        "answering": 64,
        "stop_reason": "less than 2048 MiB of memory left (the reserve)",
        "mib_per_replica": 320.0,
        "memory_curve": [{"replicas": 1, "mib_per_replica": 300.0}, {"replicas": 64, "mib_per_replica": 320.0}],
    },
    "machine": {"hostname": "unit", "cpus": 2, "memory_gib": 23.4, "accelerator": "TCG", "date": "2026-11-30"},
}


@pytest.mark.unit
def test_cost_uses_the_measured_density_and_names_the_binding_resource() -> None:
    fp = footprint_from_density(DENSITY)
    assert fp == Footprint(cpu_cores=0.004, memory_bytes=60 * 2**20, disk_bytes=0.0)
    from osfleet.measure.cost import HostType

    host = HostType("h", vcpus=2, memory_gib=24, usd_per_hour=1.0, source="unit")
    # (24 - 4) GiB / 60 MiB = 341 by RAM; (2 - 1) cores / 0.004 = 250 by CPU: CPU binds
    assert replicas_per_host(host, fp) == (250, "CPU")
    assert replicas_per_host(host, footprint_from_density(DENSITY, cpu_cores=0.001)) == (341, "RAM")
    with pytest.raises(OsfleetError, match="no memory per replica"):
        footprint_from_density({"mib_per_replica": None})


@pytest.mark.integration  # over a second: kept out of the unit tier's 2 minutes
def test_report_draws_memory_per_replica_sharing_on_vs_off_and_costs_from_density(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    (run / "density.json").write_text(json.dumps(DENSITY))
    paths = render(run)
    png = run / "density_memory.png"
    assert png in paths
    with Image.open(png) as img:
        img.verify()
    results = load(run)
    assert results.density is not None and results.cost is not None
    # the density's replicas are the parked ones; the active ones are the load test's (the reset bench's memory)
    assert (
        results.cost.parked_text is not None and "bench density: 240 held, template memory" in results.cost.parked_text
    )
    assert results.cost.footprint.memory_bytes != 60 * 2**20
    assert all(r["parked_binding_resource"] and r["usd_per_parked_replica_day"] > 0 for r in results.cost.rows)
    md = (run / "report.md").read_text()
    assert "## Density" in md and "240 ready desktops held at once" in md and "| USD per parked replica-day |" in md


@pytest.mark.system
def test_a_run_directory_with_only_density_is_reported(tmp_path: Path) -> None:
    (tmp_path / "density.json").write_text(json.dumps(DENSITY))
    paths = render(tmp_path)
    assert tmp_path / "density_memory.png" in paths
    cost = json.loads((tmp_path / "cost.json").read_text())
    assert {r["binding_resource"] for r in cost["rows"]} <= {"CPU", "RAM", "disk"}


@pytest.mark.vm
def test_bench_density_holds_a_few_replicas_each_answering_and_leaves_nothing(no_leftovers: None) -> None:
    out = subprocess.run(
        [str(VENV_BIN / "osfleet"), "bench", "density", "--max", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["held_ready"] == 3 and d["answering"] == 3 and d["stop_reason"] == "reached --max 3"
    for key in ("mib_per_replica", "cpu_per_idle_replica", "bringup_p50_s", "ksm", "template_sharing"):
        assert key in d
    assert d["memory_curve"][-1]["replicas"] == 3
