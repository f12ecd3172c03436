"""``osfleet bench disk``: provision N replica disks with each strategy in one run and compare.

Allocated bytes are measured (st_blocks), never apparent sizes. Reflinked files each report the full
size in st_blocks although their extents are shared, so the reflink strategy is measured as the
growth of its filesystem's used space instead. Full copies cost the image size each: when N of them
would not fit comfortably on the disk, a sample is copied and the N-copy total is extrapolated from
the measured per-copy bytes, and the result says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import distribution
from osfleet.vm import disks, qcow2
from osfleet.vm.disks import Strategy
from osfleet.vm.images import GoldenImage

FULL_COPY_SAMPLE = 4
# Full copies may use at most this share of the free disk; beyond it they are sampled.
FULL_COPY_DISK_SHARE = 0.25
XFS_MIN_BYTES = 512 * 2**20

Progress = Callable[[str], None]


def _used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _time_provision(strategy: Strategy, golden: Path, directory: Path, count: int, say: Progress) -> list[float]:
    seconds: list[float] = []
    step = max(1, count // 4)
    for i in range(count):
        dest = directory / f"replica-{i:04d}.{'qcow2' if strategy == 'overlay' else 'img'}"
        start = time.perf_counter()
        disks.provision(strategy, golden, dest)
        seconds.append(time.perf_counter() - start)
        if (i + 1) % step == 0 or i + 1 == count:
            say(f"  {strategy}: {i + 1}/{count} replica disks")
    return seconds


def _strategy_result(
    seconds: list[float], replica_bytes: int, golden_bytes: int, shares_golden: bool
) -> dict[str, Any]:
    stats = distribution(seconds)
    total = replica_bytes + (golden_bytes if shares_golden else 0)
    return {
        "available": True,
        "replicas_made": stats["n"],
        "seconds_per_replica_p50": stats["p50"],
        "seconds_per_replica_p95": stats["p95"],
        "seconds_total": sum(seconds),
        "replica_allocated_bytes_total": replica_bytes,
        "allocated_bytes_total": total,
    }


class _XfsScratch:
    """A reflink-capable XFS filesystem in a loop-mounted sparse file, made and removed by the bench."""

    def __init__(self, directory: Path, size: int) -> None:
        self.image = directory / "xfs.img"
        self.mount = directory / "xfs"
        self.size = size
        self.mounted = False

    def __enter__(self) -> Path:
        if shutil.which("mkfs.xfs") is None:
            raise OsfleetError("mkfs.xfs not found (apt-get install xfsprogs)")
        self.mount.mkdir()
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        for cmd in (
            ["mkfs.xfs", "-q", "-m", "reflink=1", str(self.image)],
            ["mount", "-o", "loop", str(self.image), str(self.mount)],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise OsfleetError(f"{cmd[0]} failed: {(proc.stderr.strip() or '?').splitlines()[-1]}")
        self.mounted = True
        return self.mount

    def __exit__(self, *_: object) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.mount)], capture_output=True, check=False)
        self.image.unlink(missing_ok=True)


def run(
    image: GoldenImage,
    replicas: int,
    settings: Settings | None = None,
    boot: int = 0,
    say: Progress = print,
) -> dict[str, Any]:
    """Measure every strategy on ``replicas`` disks; optionally boot ``boot`` overlay replicas."""
    if replicas < 1:
        raise OsfleetError("--replicas must be at least 1")
    settings = settings or Settings.from_env()
    golden = image.disk
    golden_alloc = qcow2.allocated_bytes(golden)
    golden_apparent = golden.stat().st_size
    workdir = settings.scratch_dir / f"bench-disk-{os.getpid()}-{int(time.time())}"
    workdir.mkdir(parents=True)
    workdir.chmod(0o755)
    result: dict[str, Any] = {
        "benchmark": "disk",
        "image": image.name,
        "golden_apparent_bytes": golden_apparent,
        "golden_allocated_bytes": golden_alloc,
        "golden_virtual_bytes": qcow2.virtual_size(golden),
        "replicas": replicas,
        "strategies": {},
    }
    strategies: dict[str, Any] = result["strategies"]
    try:
        # Full copies first: their measured size is the baseline of every saving.
        full_dir = workdir / "full"
        full_dir.mkdir()
        budget = int(_free_bytes(full_dir) * FULL_COPY_DISK_SHARE)
        sampled = replicas * golden_apparent > budget
        copies = min(replicas, FULL_COPY_SAMPLE) if sampled else replicas
        say(
            f"full copy: {copies} of {replicas} copies of {golden_apparent / 2**20:.0f} MiB"
            + (" (sampled: N copies would not fit comfortably)" if sampled else "")
        )
        secs = _time_provision("full", golden, full_dir, copies, say)
        per_copy = [qcow2.allocated_bytes(p) for p in full_dir.iterdir()]
        per_copy_bytes = int(sum(per_copy) / len(per_copy))
        full_total = per_copy_bytes * replicas
        full = _strategy_result(secs, full_total, golden_alloc, shares_golden=False)
        full.update(sampled=sampled, copies_made=copies, per_copy_allocated_bytes=per_copy_bytes)
        if sampled:
            full["note"] = f"{copies} copies made and measured; total for {replicas} computed from the per-copy bytes"
        strategies["full"] = full
        shutil.rmtree(full_dir)

        overlay_dir = workdir / "overlay"
        overlay_dir.mkdir()
        say(f"qcow2 overlay: {replicas} overlays on {golden.name}")
        secs = _time_provision("overlay", golden, overlay_dir, replicas, say)
        for p in overlay_dir.iterdir():
            qcow2.check(p) if p.name.endswith("0000.qcow2") else None
        overlay_bytes = sum(qcow2.allocated_bytes(p) for p in overlay_dir.iterdir())
        strategies["overlay"] = _strategy_result(secs, overlay_bytes, golden_alloc, shares_golden=True)

        strategies["reflink"] = _reflink(golden, golden_alloc, workdir, replicas, say)

        if boot > 0:
            result["boot"] = _boot_overlays(image, overlay_dir, min(boot, replicas), settings, say)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    for s in strategies.values():
        if s.get("available"):
            s["savings_vs_full_copies"] = 1.0 - s["allocated_bytes_total"] / full_total
    ov, fu = strategies["overlay"], strategies["full"]
    result["speedup_overlay_vs_full"] = fu["seconds_per_replica_p50"] / ov["seconds_per_replica_p50"]
    result["savings_overlay"] = ov["savings_vs_full_copies"]
    if strategies["reflink"].get("available"):
        result["speedup_reflink_vs_full"] = (
            fu["seconds_per_replica_p50"] / strategies["reflink"]["seconds_per_replica_p50"]
        )
        result["savings_reflink"] = strategies["reflink"]["savings_vs_full_copies"]
    if "boot" in result and result["boot"].get("overlay_allocated_bytes_p50"):
        booted = golden_alloc + replicas * result["boot"]["overlay_allocated_bytes_p50"]
        result["boot"]["savings_overlay_after_boot"] = 1.0 - booted / full_total
    result["machine"] = describe()
    return result


def _reflink(golden: Path, golden_alloc: int, workdir: Path, replicas: int, say: Progress) -> dict[str, Any]:
    size = max(XFS_MIN_BYTES, 2 * golden.stat().st_size + replicas * 2**20 + 256 * 2**20)
    try:
        with _XfsScratch(workdir, size) as mount:
            source = mount / golden.name
            disks.full_copy(golden, source)
            os.sync()  # the first reflink of freshly written data would otherwise wait for writeback
            replica_dir = mount / "replicas"
            replica_dir.mkdir()
            used_before = _used_bytes(mount)
            say(f"reflink: {replicas} copies on a reflink XFS loop filesystem")
            secs = _time_provision("reflink", source, replica_dir, replicas, say)
            os.sync()
            grown = max(0, _used_bytes(mount) - used_before)
            res = _strategy_result(secs, grown, golden_alloc, shares_golden=True)
            res["measured_as"] = "growth of the XFS filesystem's used bytes (shared extents counted once)"
            return res
    except OsfleetError as exc:
        say(f"reflink: unavailable here ({exc})")
        return {"available": False, "reason": str(exc)}


def _boot_overlays(
    image: GoldenImage, overlay_dir: Path, count: int, settings: Settings, say: Progress
) -> dict[str, Any]:
    """Boot ``count`` of the overlays once each; their growth is what a replica writes while booting."""
    from osfleet.imaging.verify import boot_overlay

    grown: list[int] = []
    seconds: list[float] = []
    for i, overlay in enumerate(sorted(overlay_dir.iterdir())[:count]):
        say(f"  boot {i + 1}/{count}: {overlay.name}")
        res = boot_overlay(image, overlay, settings, progress=False)
        grown.append(qcow2.allocated_bytes(overlay))
        seconds.append(res.desktop_seconds)
    return {
        "replicas_booted": count,
        "overlay_allocated_bytes_p50": distribution([float(g) for g in grown])["p50"],
        "overlay_allocated_bytes_max": max(grown),
        "boot_to_desktop_seconds": distribution(seconds),
    }
