"""Folders and files that hold a tenant's disk or memory: readable by root and QEMU's user, by no one else.

A replica's overlay, a fork's frozen disk layers, its memory stream and its RAM file are a tenant's desktop:
anything a local user could read there (typed passwords, documents, the screen) is the tenant's. QEMU runs
as its own user (libvirt's DAC label, ``Virt.qemu_ids``) and opens disks by path, so:
- a folder is ``0710`` owned by root with QEMU's group: QEMU may pass through it, no one else may even list
  it (``0700`` where libvirt names no QEMU user);
- an overlay is created ``0600`` by root (``qcow2.create_overlay``); libvirt's dynamic ownership chowns it to
  QEMU's user while its domain runs and back to root after, the mode untouched;
- a frozen layer several QEMUs read at once is ``0440`` root with QEMU's group (libvirt does not chown the
  read-only layers of a backing chain).
Measured on this host with ``osfleet bench fork`` (README, "Security model").
"""

from __future__ import annotations

import os
from pathlib import Path

QemuIds = tuple[int, int] | None


def private_dir(path: Path, qemu: QemuIds) -> None:
    """``path`` (an existing folder) reachable by root and QEMU only."""
    if qemu is None:
        path.chmod(0o700)
        return
    os.chown(path, 0, qemu[1])
    path.chmod(0o710)


def shared_layer(path: Path, qemu: QemuIds) -> None:
    """A frozen, read-only disk layer that QEMU processes read through their backing chains."""
    if qemu is None:
        path.chmod(0o400)
        return
    os.chown(path, 0, qemu[1])
    path.chmod(0o440)
