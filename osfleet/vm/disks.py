"""Replica disks from a golden image, by strategy: qcow2 overlay, reflink copy or full copy.

Overlays and reflinks cost the same whatever the image size (metadata only); a full copy costs the
image size in time and disk, and exists here as the baseline the others are measured against.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Literal

from osfleet.errors import DiskFullError, OsfleetError
from osfleet.vm import qcow2

Strategy = Literal["overlay", "reflink", "full"]
STRATEGIES: tuple[Strategy, ...] = ("overlay", "reflink", "full")
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
COPY_CHUNK = 1 << 20


class ReflinkUnsupportedError(OsfleetError):
    """The filesystem cannot share extents between files."""


def provision(strategy: Strategy, golden: Path, dest: Path) -> None:
    """Create one replica disk at ``dest`` (which must not exist) from ``golden``."""
    try:
        if strategy == "overlay":
            qcow2.create_overlay(dest, golden)
        elif strategy == "reflink":
            reflink(golden, dest)
        elif strategy == "full":
            full_copy(golden, dest)
        else:
            raise OsfleetError(f"unknown disk strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            dest.unlink(missing_ok=True)
            raise DiskFullError(f"disk full while creating {dest}") from None
        if exc.errno == errno.EEXIST:
            raise OsfleetError(f"{dest} already exists; replica disks are never overwritten") from None
        raise


def reflink(src: Path, dest: Path) -> None:
    """Copy by sharing extents (FICLONE): O(1) in the file size, copy-on-write on later writes."""
    with open(src, "rb") as s:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.ioctl(fd, FICLONE, s.fileno())
        except OSError as exc:
            os.close(fd)
            dest.unlink(missing_ok=True)
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL):
                raise ReflinkUnsupportedError(
                    f"the filesystem of {dest.parent} does not support reflink copies"
                ) from None
            raise
        os.close(fd)


def full_copy(src: Path, dest: Path) -> None:
    """Byte-for-byte copy through user space, so no filesystem can silently turn it into a reflink."""
    with open(src, "rb") as s, open(dest, "xb") as d:
        while chunk := s.read(COPY_CHUNK):
            d.write(chunk)


def reflink_supported(directory: Path) -> bool:
    probe_src, probe_dst = directory / ".reflink-probe-src", directory / ".reflink-probe-dst"
    try:
        probe_src.write_bytes(b"osfleet")
        reflink(probe_src, probe_dst)
        return True
    except ReflinkUnsupportedError:
        return False
    finally:
        probe_src.unlink(missing_ok=True)
        probe_dst.unlink(missing_ok=True)
