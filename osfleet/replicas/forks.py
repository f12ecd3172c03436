"""Forks: a running replica saved mid-episode, so any number of children start exactly where it was.

Saving a fork is the saved-state mechanism applied to a live replica. The parent is paused and its
memory streamed out (QEMU's migration to a file descriptor, as for saved states; the stream's end flushes
its disks), its overlay is copied as the fork's frozen disk layer, and it goes on from where it was.

Where this host has template memory, the stream is then loaded once into a *fork template*: a paused
domain whose RAM is a new file on tmpfs (``share=on``), on an overlay over the frozen layer. Its device
state is saved with ``x-ignore-shared``, as a saved state's is, so every child maps that RAM file
privately and loads a few MiB of device state (~0.2 s) instead of the parent's whole memory. The fork
template is never resumed: QEMU activates its disks when the incoming stream ends and inactivates them
again when the outgoing one ends, so nothing the guest did is missing from the frozen layers. Without
template memory (or when the parent itself runs on anonymous RAM, a cold-booted replica), children load
the parent's full stream (``stream`` mode).

A fork is a directory under ``Settings.forks_dir`` (frozen disk layers, the stream, ``meta.json`` written
last) plus, in template mode, its RAM file. Its reference count is the number of replicas whose disk
chain includes its layer: a child's chain does until the child is reset (back to the image's initial
state) or retired, and a child's fork includes its parent fork's layers, so children of children keep
their ancestors. ``collect`` removes forks no replica refers to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet import qcow2
from osfleet.config import ReplicaShape, Settings
from osfleet.domain_xml import Accel, MemoryFile
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.images import GoldenImage
from osfleet.private import private_dir, shared_layer
from osfleet.replicas import saved_state, template_memory
from osfleet.replicas.records import ReplicaRecord
from osfleet.replicas.saved_state import IGNORE_SHARED, SavedState
from osfleet.replicas.spec import replica_spec
from osfleet.virt import Virt, VirtError

log = logging.getLogger(__name__)

META = "meta.json"
PARENT_DISK = "parent.qcow2"
PARENT_STREAM = "parent.bin"
SCREEN = "screen.png"
NO_IGNORE_SHARED = [{"capability": "x-ignore-shared", "state": False}]
# The backend id osfleet gives file-backed guest RAM (``domain_xml.MemoryFile``).
RAM_OBJECT = "/objects/osfleet-ram"
# A fork directory without meta.json this old was left by a process that died while saving it.
UNFINISHED_AGE_SECONDS = 600.0


@dataclass(frozen=True)
class ForkInfo:
    """One saved fork as ``/v1/host`` and ``/metrics`` show it."""

    id: str
    parent: str
    memory_mode: str
    children: int  # replicas whose disk chain still uses it (its reference count)
    disk_bytes: int
    memory_bytes: int  # RAM file resident on tmpfs (template mode) + the stream file


class Forks:
    """Saved forks of this host's replicas; thread-safe (forks being saved are pinned until their
    children are registered, so ``collect`` never removes one under a fork in progress)."""

    def __init__(self, virt: Virt, image: GoldenImage, accel: Accel, shape: ReplicaShape, settings: Settings) -> None:
        self.virt = virt
        self.image = image
        self.accel = accel
        self.shape = shape
        self.settings = settings
        self._pinned: set[str] = set()
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self.settings.forks_dir

    # --- saving ----------------------------------------------------------------------------------------------
    def save(self, parent: ReplicaRecord) -> SavedState:
        """Save the running replica ``parent`` (whose lock the caller holds) as a new fork, pinned until
        ``unpin``. The parent is paused only while its memory is streamed out and its overlay copied."""
        fork_id = f"f-{uuid.uuid4().hex[:10]}"
        directory = self.root / fork_id
        with self._lock:
            self._pinned.add(fork_id)
        ram: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            directory.mkdir()
            private_dir(directory, self.virt.qemu_ids())  # a tenant's disk and memory
            started = time.monotonic()
            mapped = self._ram_file(parent.domain)
            self._freeze(parent, directory)
            frozen = time.monotonic() - started
            parent_layers = [str(directory / PARENT_DISK), *parent.layers]
            meta: dict[str, Any] = {
                "fork": fork_id,
                "parent": parent.id,
                "parent_generation": parent.generation,
                "image": self.image.name,
                "accel": self.accel,
                "shape": self.shape.__dict__,
                "parent_paused_seconds": frozen,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            why_not = self._template_unavailable(mapped)
            if why_not is None:
                ram = self._ram_path(fork_id)
                self._make_template(directory, parent_layers, ram)
                meta.update(
                    memory_mode="template",
                    ram_path=str(ram),
                    ram_resident_bytes=ram.stat().st_blocks * 512,
                    layers=[str(directory / "disk.qcow2"), *parent_layers],
                )
                (directory / PARENT_STREAM).unlink()
            else:
                (directory / PARENT_STREAM).rename(directory / "memory.bin")
                (directory / PARENT_DISK).rename(directory / "disk.qcow2")
                meta.update(
                    memory_mode="stream",
                    stream_reason=why_not,
                    layers=[str(directory / "disk.qcow2"), *parent.layers],
                )
                if mapped is not None:
                    meta["mapped_ram"] = str(mapped)
            meta["memory_bytes"] = (directory / "memory.bin").stat().st_size
            meta["save_seconds"] = time.monotonic() - started
            tmp = directory / f".{META}.tmp"
            tmp.write_text(json.dumps(meta, indent=2) + "\n")
            tmp.rename(directory / META)  # a fork exists once its meta does
            return SavedState(directory, meta)
        except BaseException:
            self.unpin(fork_id)
            self._remove(directory, ram)
            raise

    def unpin(self, fork_id: str) -> None:
        with self._lock:
            self._pinned.discard(fork_id)

    def _freeze(self, parent: ReplicaRecord, directory: Path) -> None:
        """Pause the parent, stream its memory out and copy its overlay, then let it go on (whatever
        happened: a fork that failed must not leave the parent paused)."""
        self.virt.suspend(parent.domain)
        try:
            with contextlib.suppress(VirtError, OSError):  # the screen is for people (the dashboard), not needed
                self.virt.screenshot(parent.domain).save(directory / SCREEN)
            # A replica restored from template memory still has x-ignore-shared set from its own restore; it
            # changes the stream's format, and this stream carries all of the parent's (private) RAM.
            self.virt.qmp(parent.domain, "migrate-set-capabilities", {"capabilities": NO_IGNORE_SHARED})
            saved_state.hand_over(
                self.virt, parent.domain, directory / PARENT_STREAM, os.O_WRONLY | os.O_CREAT | os.O_EXCL
            )
            self.virt.qmp(parent.domain, "migrate", {"uri": f"fd:{saved_state.FD_NAME}"})
            saved_state.wait_migration(self.virt, parent.domain)
            # The stream's end flushed and inactivated the parent's disks: its overlay is consistent now.
            _copy_file(Path(parent.disk), directory / PARENT_DISK)
            shared_layer(directory / PARENT_DISK, self.virt.qemu_ids())
        finally:
            self.virt.resume(parent.domain)  # QEMU takes its disks back ("cont" after an outgoing stream)

    def _make_template(self, directory: Path, parent_layers: list[str], ram: Path) -> None:
        """Load the parent's stream into a paused domain whose RAM is ``ram`` (shared), then save its
        device state: children then map ``ram`` and load only that."""
        name = f"{self.settings.template_prefix}{directory.name}"
        template_memory.create(ram, self.shape.memory_mib * 2**20, self.virt.qemu_ids())
        template_memory.claim(ram, directory)
        overlay = directory / "disk.qcow2"
        qcow2.create_overlay(overlay, directory / PARENT_DISK)
        spec = replica_spec(
            self.image,
            name,
            overlay,
            tuple(Path(p) for p in parent_layers),
            self.accel,
            self.shape,
            incoming=True,
            metadata={"role": "fork-template"},
            memory=MemoryFile(ram, share=True),
        )
        try:
            self.virt.start_transient(spec, paused=True)
            saved_state.hand_over(self.virt, name, directory / PARENT_STREAM, os.O_RDONLY)
            self.virt.qmp(name, "migrate-incoming", {"uri": f"fd:{saved_state.FD_NAME}"})
            saved_state.wait_migration(self.virt, name)
            self.virt.qmp(name, "migrate-set-capabilities", {"capabilities": IGNORE_SHARED})
            saved_state.hand_over(self.virt, name, directory / "memory.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            self.virt.qmp(name, "migrate", {"uri": f"fd:{saved_state.FD_NAME}"})
            saved_state.wait_migration(self.virt, name)
        finally:
            self.virt.destroy(name)  # the RAM file is final from here on
        template_memory.seal(ram, self.virt.qemu_ids())
        shared_layer(overlay, self.virt.qemu_ids())

    def _ram_file(self, domain: str) -> Path | None:
        """The file the domain's guest RAM is mapped from, or None (anonymous RAM: a cold-booted replica)."""
        try:
            path = self.virt.qmp(domain, "qom-get", {"path": RAM_OBJECT, "property": "mem-path"})
        except VirtError:
            return None
        return Path(path) if isinstance(path, str) and path else None

    def _template_unavailable(self, mapped: Path | None) -> str | None:
        """Why this fork cannot use template memory, or None."""
        if mapped is None:
            return "the parent's RAM is not a file mapping (a cold-booted replica)"
        return template_memory.unavailable(self.settings.memory_dir, self.shape.memory_mib * 2**20)

    def _ram_path(self, fork_id: str) -> Path:
        assert self.settings.memory_dir is not None  # _template_unavailable checked it
        return self.settings.memory_dir / f"{self.image.name}-{fork_id}-{uuid.uuid4().hex[:8]}.ram"

    # --- reference counting ----------------------------------------------------------------------------------
    def load(self, fork_id: str) -> SavedState:
        directory = self.root / fork_id
        try:
            return SavedState(directory, json.loads((directory / META).read_text()))
        except (OSError, ValueError) as exc:
            raise OsfleetError(f"fork {fork_id} is not on this host ({exc})") from None

    def users(self, records: Iterable[ReplicaRecord]) -> dict[str, int]:
        """How many replicas use each saved fork (a disk chain through its directory)."""
        counts = {d.name: 0 for d in self._directories()}
        for rec in records:
            seen = {Path(p).parent.name for p in rec.layers if Path(p).parent.parent == self.root}
            for fork_id in seen & counts.keys():
                counts[fork_id] += 1
        return counts

    def collect(self, records: Iterable[ReplicaRecord]) -> list[str]:
        """Remove every fork that no replica uses and no fork in progress holds; returns their ids."""
        now = time.time()
        counts = self.users(records)
        removed = []
        with self._lock:
            pinned = set(self._pinned)
        for fork_id, n in counts.items():
            directory = self.root / fork_id
            if n or fork_id in pinned:
                continue
            if not (directory / META).exists():
                try:
                    if now - directory.stat().st_mtime < UNFINISHED_AGE_SECONDS:
                        continue  # another process may be saving it right now
                except OSError:
                    continue
            self._remove(directory, None)
            removed.append(fork_id)
        return removed

    def info(self, records: Iterable[ReplicaRecord]) -> list[ForkInfo]:
        out = []
        for fork_id, n in sorted(self.users(records).items()):
            directory = self.root / fork_id
            try:
                meta = json.loads((directory / META).read_text())
            except (OSError, ValueError):
                continue  # being saved
            ram = Path(meta["ram_path"]) if meta.get("ram_path") else None
            ram_bytes = ram.stat().st_blocks * 512 if ram is not None and ram.exists() else 0
            disk = sum(qcow2.allocated_bytes(p) for p in directory.glob("*.qcow2"))
            stream = directory / "memory.bin"
            out.append(
                ForkInfo(
                    id=fork_id,
                    parent=str(meta.get("parent", "")),
                    memory_mode=str(meta.get("memory_mode", "")),
                    children=n,
                    disk_bytes=disk,
                    memory_bytes=ram_bytes + (stream.stat().st_size if stream.exists() else 0),
                )
            )
        return out

    def _directories(self) -> list[Path]:
        if not self.root.exists():
            return []
        return [d for d in self.root.iterdir() if d.is_dir() and d.name.startswith("f-")]

    def _remove(self, directory: Path, ram: Path | None) -> None:
        remove_fork(directory, self.settings.memory_dir, ram)


def remove_fork(directory: Path, memory_dir: Path | None, ram: Path | None = None) -> None:
    """Delete a fork's directory and its RAM file (named in its meta, or given while it is being saved)."""
    try:
        meta = json.loads((directory / META).read_text())
        if meta.get("ram_path"):
            ram = Path(meta["ram_path"])
    except (OSError, ValueError):
        pass
    if ram is None and memory_dir is not None:  # unfinished: find its RAM file by its owner file
        for owner in memory_dir.glob("*.state"):
            with contextlib.suppress(OSError):
                if Path(owner.read_text().strip()) == directory:
                    ram = owner.with_suffix(".ram")
    if ram is not None:
        ram.unlink(missing_ok=True)
        template_memory.owner_file(ram).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def remove_all_forks(settings: Settings) -> int:
    """Every fork of this host (once its replicas are gone, no fork can be used); returns how many."""
    if not settings.forks_dir.exists():
        return 0
    n = 0
    for directory in settings.forks_dir.iterdir():
        if directory.is_dir():
            remove_fork(directory, settings.memory_dir)
            n += 1
    return n


def _copy_file(src: Path, dst: Path) -> None:
    """A copy that shares blocks where the filesystem can (reflink) and keeps holes (an overlay is sparse)."""
    try:
        subprocess.run(
            ["cp", "--reflink=auto", "--sparse=always", str(src), str(dst)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise as_osfleet(exc, f"copying {src} into a fork") from exc
