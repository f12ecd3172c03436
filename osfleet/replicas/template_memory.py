"""Template memory: clones of one saved state map the template's RAM from one file instead of copying it.

How. The template replica a state is saved from runs with its guest RAM in a file on tmpfs
(``memory-backend-file``, ``share=on``). It is saved with the migration capability ``x-ignore-shared``:
QEMU leaves shared RAM out of the stream, so the saved state is the RAM file plus a few MiB of device
state. A clone maps the same file ``share=off`` (``MAP_PRIVATE``: pages are read from the file until the
guest writes them, then copied for that clone alone), sets ``x-ignore-shared`` too and loads only the
device state. A clone goes from nothing to a running desktop in ~0.15 s and costs the pages it wrote.

How libvirt is made to do it. libvirt builds the guest's RAM backend itself (``-object memory-backend-ram,
id=pc.ram`` and ``-machine ...,memory-backend=pc.ram``) and has no way to name an existing file (its
``<memoryBacking><source type='file'/>`` makes a fresh per-start path under ``memory_backing_dir``, which
is created just before QEMU starts and removed after, so it cannot hold a template). The domain XML adds,
through ``<qemu:commandline>`` (libvirt's documented pass-through; the domain is marked "tainted", as for
``-incoming defer`` already), a ``memory-backend-file`` object and a second ``-machine
memory-backend=osfleet-ram``: QEMU merges ``-machine`` options, the later value wins, so the file backend
becomes the machine's RAM and libvirt's own backend stays an unused reservation (never touched, never
migrated: a RAM block that no device uses has no migration name). An ``<emulator>`` wrapper rewriting
arguments would also work, but it would parse libvirt's private command line and run as QEMU's user;
the pass-through keeps everything in one typed ``DomainSpec``.

Why it is safe.
- The file never changes while a clone maps it: only the template (``share=on``) writes it, and the
  template is destroyed before its state is published; clones map it privately (their writes never reach
  the file). The state directory is published by a rename only after the save completed, so no clone
  ever maps a half-written template. The RAM file is named by a random id made at save time, so a new
  save never overwrites a file that running clones still map; it is removed only with its state.
- Devices and machine arguments are identical between template and clones (one ``replica_spec``); only
  ``share`` differs. A clone whose arguments differ fails its incoming migration (QEMU checks RAM block
  names and sizes), it is never silently wrong.
- Permissions: QEMU 7.2 opens a file backend read-write even for a private mapping (its ``readonly=on``
  maps the RAM read-only, which a guest cannot run on), so the file belongs to QEMU's user (mode 0600).
  That is no weaker than the rest of a DAC-only host, where every replica's QEMU runs as that same user
  and can already write every other replica's overlay. Where QEMU has ``rom=off`` (8.2 and later), the
  file is opened read-only and mapped writable privately; then it is root's and read-only (0444).
- Tenants: the only pages clones share through this file are the template's, which are the same public
  golden state for everyone; a page a clone writes is private to it. (KSM, which merges pages clones wrote,
  is a different matter: ``osfleet.vm.host_tune``.)
- tmpfs is lost at reboot: the state directory keeps a sparse copy of the RAM file on disk and it is put
  back on tmpfs the first time the state is used again.

When the template path is unavailable (no ``memory_dir`` configured, not a tmpfs, too little room, or
QEMU without file backends), saved states fall back to the full migration stream (``stream`` mode), as
before: the choice is made per host, automatically, and the reason is said.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Literal

from osfleet.errors import OsfleetError

MemoryMode = Literal["template", "stream"]
"""``template``: RAM in a shared file, device state in the stream. ``stream``: everything in the stream."""

# Memory-backed filesystems: a RAM file there never waits for a disk.
MEMORY_FILESYSTEMS = ("tmpfs", "hugetlbfs")
# Room left on the tmpfs besides the template files (other users of /dev/shm).
TMPFS_SLACK_BYTES = 256 * 2**20
COPY_CHUNK = 1 << 20
# A RAM file whose state directory is gone is removed after this long (a save in progress is younger).
ORPHAN_AGE_SECONDS = 600.0


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing parent) is on, from /proc/mounts."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    best, fstype = "", None
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


@lru_cache(maxsize=4)
def qemu_file_backend_properties(qemu: str = "qemu-system-x86_64") -> frozenset[str]:
    """The properties this QEMU's ``memory-backend-file`` accepts (empty when it has none)."""
    binary = shutil.which(qemu)
    if binary is None:
        return frozenset()
    try:
        out = subprocess.run(
            [binary, "-object", "memory-backend-file,help"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.split("=", 1)[0].strip() for line in out.splitlines()[1:] if "=" in line)


def maps_readonly_files() -> bool:
    """QEMU can open the RAM file read-only yet map it writable (``rom=off``, QEMU 8.2+)."""
    return "rom" in qemu_file_backend_properties()


def unavailable(memory_dir: Path | None, ram_bytes: int) -> str | None:
    """Why template memory cannot be used on this host, or None when it can."""
    if memory_dir is None:
        return "template memory is off (OSFLEET_MEMORY_DIR is empty)"
    props = qemu_file_backend_properties()
    if not {"mem-path", "share"} <= props:
        return "this QEMU has no memory-backend-file with mem-path and share"
    fstype = filesystem_type(memory_dir)
    if fstype not in MEMORY_FILESYSTEMS:
        return f"{memory_dir} is on {fstype or 'an unknown filesystem'}, not tmpfs"
    try:
        memory_dir.mkdir(parents=True, exist_ok=True)
        memory_dir.chmod(0o711)  # QEMU's user needs to reach its file, not to list the others
        st = os.statvfs(memory_dir)
    except OSError as exc:
        return f"cannot use {memory_dir}: {exc.strerror}"
    if st.f_bavail * st.f_frsize < ram_bytes + TMPFS_SLACK_BYTES:
        return f"{memory_dir} has less than {(ram_bytes + TMPFS_SLACK_BYTES) >> 20} MiB free"
    return None


def create(path: Path, size: int, owner: tuple[int, int] | None) -> None:
    """A new, empty RAM file for a template QEMU to fill (``share=on`` needs it writable by QEMU)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def seal(path: Path, owner: tuple[int, int] | None) -> None:
    """After the save: read-only root's file where QEMU can map it so, else QEMU's own (see above)."""
    if maps_readonly_files():
        os.chown(path, 0, 0)
        path.chmod(0o444)
    else:
        if owner is not None:
            os.chown(path, *owner)
        path.chmod(0o600)


def copy_sparse(src: Path, dst: Path) -> int:
    """Copy ``src`` to a new file ``dst``, leaving holes where ``src`` has zero chunks; bytes written."""
    written = 0
    zero = bytes(COPY_CHUNK)
    with src.open("rb") as fin, dst.open("xb") as fout:
        while chunk := fin.read(COPY_CHUNK):
            if chunk == zero[: len(chunk)]:
                fout.seek(len(chunk), os.SEEK_CUR)
            else:
                fout.write(chunk)
                written += len(chunk)
        fout.truncate()
    return written


def put_back(disk_copy: Path, ram: Path, owner: tuple[int, int] | None) -> None:
    """Restore a RAM file lost with tmpfs (a reboot) from its copy on disk; atomic by rename."""
    ram.parent.mkdir(parents=True, exist_ok=True)
    tmp = ram.with_name(f".{ram.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        copy_sparse(disk_copy, tmp)
        seal(tmp, owner)
        tmp.rename(ram)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OsfleetError(f"cannot put the template RAM {ram} back from {disk_copy}: {exc.strerror}") from None


def owner_file(ram: Path) -> Path:
    """Beside each RAM file: the state directory it belongs to (homes come and go; tmpfs is shared)."""
    return ram.with_suffix(".state")


def claim(ram: Path, state_dir: Path) -> None:
    owner_file(ram).write_text(f"{state_dir}\n")


def sweep_orphans(memory_dir: Path, now: float | None = None) -> list[Path]:
    """Remove RAM files whose saved state no longer exists (its home was deleted without
    ``replicas down --states``, e.g. a lab host's); returns what was removed."""
    now = time.time() if now is None else now
    removed = []
    for owner in memory_dir.glob("*.state"):
        ram = owner.with_suffix(".ram")
        try:
            state_dir = Path(owner.read_text().strip())
            old = now - owner.stat().st_mtime > ORPHAN_AGE_SECONDS
        except OSError:
            continue
        if old and not (state_dir / "meta.json").exists():
            ram.unlink(missing_ok=True)
            owner.unlink(missing_ok=True)
            removed.append(ram)
    return removed
