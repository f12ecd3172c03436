"""Disk strategies and the disk bench on the real golden image (real files, a real XFS loop filesystem)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from osfleet import disks, qcow2
from osfleet.bench import disk as disk_bench
from osfleet.config import Settings
from osfleet.images import GoldenImage
from tests.conftest import VENV_BIN


def test_strategies_make_usable_disks(golden: GoldenImage, tmp_path: Path) -> None:
    ov, full = tmp_path / "ov.qcow2", tmp_path / "full.img"
    disks.provision("overlay", golden.disk, ov)
    disks.provision("full", golden.disk, full)
    assert qcow2.info(ov, backing_chain=True)[1]["filename"] == str(golden.disk)
    assert full.read_bytes()[:4] == b"QFI\xfb" and full.stat().st_size == golden.disk.stat().st_size
    assert qcow2.allocated_bytes(ov) * 100 < qcow2.allocated_bytes(full)
    qcow2.check(full)


def test_reflink_is_refused_clearly_where_unsupported(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4096)
    if disks.reflink_supported(tmp_path):
        pytest.skip("this filesystem supports reflinks")
    with pytest.raises(disks.ReflinkUnsupportedError, match="does not support reflink"):
        disks.provision("reflink", src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


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


def test_bench_samples_full_copies_when_they_would_not_fit(
    golden: GoldenImage, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_bench, "FULL_COPY_DISK_SHARE", 1e-6)
    r = disk_bench.run(golden, 10, settings, say=lambda _m: None)
    full = r["strategies"]["full"]
    assert full["sampled"] and full["copies_made"] == disk_bench.FULL_COPY_SAMPLE
    assert full["allocated_bytes_total"] == full["per_copy_allocated_bytes"] * 10
    assert "computed from the per-copy bytes" in full["note"]


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
