"""Disk strategies and the disk bench on the real golden image (real files, a real XFS loop filesystem)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from osfleet.bench import disk as disk_bench
from osfleet.bench.tables import disk_table
from osfleet.config import Settings
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import distribution, percentile
from osfleet.vm import disks, qcow2
from osfleet.vm.images import GoldenImage
from tests.conftest import VENV_BIN


@pytest.mark.vm
def test_strategies_make_usable_disks(golden: GoldenImage, tmp_path: Path) -> None:
    ov, full = tmp_path / "ov.qcow2", tmp_path / "full.img"
    disks.provision("overlay", golden.disk, ov)
    disks.provision("full", golden.disk, full)
    assert qcow2.info(ov, backing_chain=True)[1]["filename"] == str(golden.disk)
    assert full.read_bytes()[:4] == b"QFI\xfb" and full.stat().st_size == golden.disk.stat().st_size
    assert qcow2.allocated_bytes(ov) * 100 < qcow2.allocated_bytes(full)
    qcow2.check(full)


@pytest.mark.unit
def test_reflink_is_refused_clearly_where_unsupported(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4096)
    if disks.reflink_supported(tmp_path):
        pytest.skip("this filesystem supports reflinks")
    with pytest.raises(disks.ReflinkUnsupportedError, match="does not support reflink"):
        disks.provision("reflink", src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


@pytest.mark.vm
def test_bench_compares_all_strategies_in_one_run(golden: GoldenImage, settings: Settings, no_leftovers: None) -> None:
    r = disk_bench.run(golden, 6, settings, say=lambda _m: None)
    s = r["strategies"]
    assert {"overlay", "reflink", "full"} <= set(s)
    assert s["overlay"]["replicas_made"] == 6 and s["full"]["copies_made"] == 6
    assert s["reflink"]["available"], s["reflink"].get("reason")
    assert r["speedup_overlay_vs_full"] > 20
    # 6 overlays share one golden image: the saving approaches 1 - 1/6.
    assert 0.80 < r["savings_overlay"] < 1 - 1 / 6 + 0.01
    assert s["full"]["savings_vs_full_copies"] == pytest.approx(0.0)


@pytest.mark.vm
def test_bench_samples_full_copies_when_they_would_not_fit(
    golden: GoldenImage, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_bench, "FULL_COPY_DISK_SHARE", 1e-6)
    r = disk_bench.run(golden, 10, settings, say=lambda _m: None)
    full = r["strategies"]["full"]
    assert full["sampled"] and full["copies_made"] == disk_bench.FULL_COPY_SAMPLE
    assert full["allocated_bytes_total"] == full["per_copy_allocated_bytes"] * 10
    assert "computed from the per-copy bytes" in full["note"]


@pytest.mark.vm
def test_cli_bench_disk_json(golden: GoldenImage) -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "osfleet"), "bench", "disk", "--replicas", "3", "--image", golden.name, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert 0 < doc["savings_overlay"] < 1 and doc["speedup_overlay_vs_full"] > 1


# --- one percentile helper, one key spelling (no VM, no image) ---------------------------------------------
@pytest.mark.unit
def test_percentiles_interpolate_between_closest_ranks() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48.0)  # rank 3.8: 40 + 0.8 * 10
    assert percentile([7.0], 95) == 7.0
    assert (percentile([3, 1, 2], 0), percentile([3, 1, 2], 100)) == (1.0, 3.0)
    for bad in (95.5, 101, -1):
        with pytest.raises(ValueError, match="integer from 0 to 100"):
            percentile([1, 2], bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


@pytest.mark.unit
def test_every_bench_reports_p50_and_p95() -> None:
    assert distribution([1, 2, 3, 4]) == {"n": 4, "p50": 2.5, "p95": pytest.approx(3.85), "min": 1.0, "max": 4.0}
    s = disk_bench._strategy_result([0.1, 0.2, 0.3], replica_bytes=3, golden_bytes=10, shares_golden=True)
    assert (s["seconds_per_replica_p50"], s["seconds_per_replica_p95"]) == (0.2, pytest.approx(0.29))
    assert s["seconds_total"] == pytest.approx(0.6) and s["allocated_bytes_total"] == 13
    assert not [k for k in s if "median" in k]


@pytest.mark.unit
def test_disk_table_speaks_p50() -> None:
    strategy = {
        "available": True,
        "replicas_made": 2,
        "seconds_per_replica_p50": 0.001,
        "seconds_per_replica_p95": 0.002,
        "allocated_bytes_total": 2**20,
        "savings_vs_full_copies": 0.5,
    }
    result = {
        "replicas": 2,
        "image": "golden-x",
        "golden_allocated_bytes": 2**30,
        "golden_virtual_bytes": 2**31,
        "strategies": {"overlay": strategy, "full": {**strategy, "savings_vs_full_copies": 0.0}},
        "speedup_overlay_vs_full": 1.0,
        "savings_overlay": 0.5,
    }
    text = disk_table(result)
    assert "p50/replica" in text and "median" not in text
    assert "overlay       2         1.00 ms" in text


@pytest.mark.unit
def test_machine_facts_come_from_psutil_and_agree_with_proc() -> None:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    facts = describe("qemu")
    assert facts["memory_gib"] == round(mem_kib / 2**20, 1)
    assert facts["cpus"] == os.cpu_count() and facts["accelerator"] == "TCG"
