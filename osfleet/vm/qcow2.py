"""The one qcow2 helper: overlays, image facts and conversions.

Creating a copy-on-write overlay is the hot path of replica provisioning and resets. It is written
in-process (a qcow2 v3 header, refcount structures and an empty L1 table, the same layout
``qemu-img create -b`` produces) so that it costs well under a millisecond and no process start,
whatever the size of the golden image. Everything else goes through ``qemu-img``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

from osfleet.errors import CommandFailedError, MissingToolError

QCOW2_MAGIC = b"QFI\xfb"
CLUSTER_BITS = 16
CLUSTER_SIZE = 1 << CLUSTER_BITS
_HEADER = struct.Struct(">4sIQIIQIIQQIIQQQQII")  # qcow2 v3 header, 104 bytes
_EXT_BACKING_FORMAT = 0xE2792ACA
_REFCOUNT_ORDER = 4  # 16-bit refcounts, qemu's default
_MAX_BACKING_NAME = 1023


def _qemu_img() -> str:
    path = shutil.which("qemu-img")
    if path is None:
        raise MissingToolError("qemu-img", "qemu-utils")
    return path


def virtual_size(path: Path) -> int:
    """Guest-visible size of a qcow2 image, read from its header."""
    with open(path, "rb") as f:
        head = f.read(32)
    if len(head) < 32 or head[:4] != QCOW2_MAGIC:
        raise CommandFailedError(f"{path} is not a qcow2 image")
    return int.from_bytes(head[24:32], "big")


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def create_overlay(path: Path, backing: Path, backing_format: str = "qcow2") -> None:
    """Create an empty copy-on-write overlay of ``backing`` at ``path``; never overwrites a file. Mode 0600:
    what a guest writes is its tenant's (libvirt gives the file to QEMU's user while the domain runs).

    The overlay records ``backing`` by absolute path and format, so a moved overlay still finds its
    golden image and qemu never probes the format (a probed raw backing file is a security hole).
    """
    backing = backing.resolve()
    size = virtual_size(backing) if backing_format == "qcow2" else backing.stat().st_size
    name = str(backing).encode()
    if len(name) > _MAX_BACKING_NAME:
        raise CommandFailedError(f"backing file path too long for qcow2: {backing}")

    l2_entries = CLUSTER_SIZE // 8
    l1_size = max(1, -(-size // (CLUSTER_SIZE * l2_entries)))
    l1_clusters = -(-l1_size * 8 // CLUSTER_SIZE)
    refcount_table_at, refcount_block_at, l1_at = CLUSTER_SIZE, 2 * CLUSTER_SIZE, 3 * CLUSTER_SIZE
    total_clusters = 3 + l1_clusters

    extensions = struct.pack(">II", _EXT_BACKING_FORMAT, len(backing_format)) + _pad8(backing_format.encode())
    extensions += struct.pack(">II", 0, 0)
    backing_offset = _HEADER.size + len(extensions)
    header = _HEADER.pack(
        QCOW2_MAGIC,
        3,
        backing_offset,
        len(name),
        CLUSTER_BITS,
        size,
        0,
        l1_size,
        l1_at,
        refcount_table_at,
        1,
        0,
        0,
        0,
        0,
        0,
        _REFCOUNT_ORDER,
        _HEADER.size,
    )
    cluster0 = header + extensions + name

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.pwrite(fd, cluster0, 0)
        os.pwrite(fd, struct.pack(">Q", refcount_block_at), refcount_table_at)
        os.pwrite(fd, struct.pack(f">{total_clusters}H", *([1] * total_clusters)), refcount_block_at)
        os.ftruncate(fd, total_clusters * CLUSTER_SIZE)  # the L1 table is all zeros: left sparse
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def allocated_bytes(path: Path) -> int:
    """Bytes the file really occupies on disk (st_blocks), not its apparent size."""
    return path.stat().st_blocks * 512


def info(path: Path, backing_chain: bool = False) -> Any:
    """``qemu-img info`` as parsed JSON (a list of layers when ``backing_chain``)."""
    cmd = [_qemu_img(), "info", "--output=json", "-U"]
    if backing_chain:
        cmd.append("--backing-chain")
    out = _run(cmd + [str(path)])
    return json.loads(out)


def check(path: Path) -> None:
    """Raise unless ``qemu-img check`` finds the image consistent."""
    _run([_qemu_img(), "check", "-q", str(path)])


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        reason = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise CommandFailedError(f"{' '.join(cmd[:2])} failed: {reason[-1] if reason else proc.returncode}")
    return proc.stdout
