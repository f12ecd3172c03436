"""One saved running state per image and replica shape, restored into any number of replicas.

Saving: a template replica boots to a ready desktop, is paused, and QEMU's migration stream is written
to a file through a file descriptor handed over with ``getfd``; the template's overlay is then frozen as
the state's disk layer. Restoring: a new domain with its own name, UUID and overlay on that frozen layer
starts paused with ``-incoming defer`` and reads the stream the same way, then resumes. This uses only
QEMU's documented migration commands: libvirt's save files are tied to one domain UUID and their format
is never touched. libvirt marks such domains "tainted" (custom monitor commands and argv); that is
expected.

The template starts osfleet's resident guest helper (``osfleet.replicas.guest_helper``) before it is
saved, so every replica restored from the state has it running, in pages it shares with the template.

Two memory modes (``template_memory.MemoryMode``): ``template`` keeps the guest RAM in a file on tmpfs
that every replica maps privately, and the stream carries only device state (``x-ignore-shared``; see
``osfleet.replicas.template_memory`` for how and why it is safe); ``stream`` puts all RAM in the stream
and every restore copies it (the fallback where the template path is unavailable). Each mode is its own
saved state (the key includes it).

A saved state is tied to the bytes of the image it sits on, not to its name: its guest's page cache holds
blocks of that image, so the same name with other bytes under it (a rebuild, a second build of one output
published after the first) breaks every replica restored from it (``guest-exec ... Bad message``). The key
therefore includes what identifies the image's disk (its inode, size and mtime, and the build's digest from the
manifest), ``meta.json`` records it, and a state whose disk is no longer that file is removed, with a log line,
and made again (``remove_stale``). Hashing the disk instead would cost seconds per GiB at every start; a rebuild
renames a new file into place (a new inode) and a write in place changes the mtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import GuestTimeoutError, OsfleetError
from osfleet.replicas import guest_control, template_memory
from osfleet.replicas.spec import replica_spec
from osfleet.replicas.template_memory import MemoryMode
from osfleet.vm import qcow2
from osfleet.vm.domain_xml import Accel, MemoryFile
from osfleet.vm.images import GoldenImage
from osfleet.vm.readiness import wait_until_ready
from osfleet.vm.virt import Virt

log = logging.getLogger(__name__)

STATE_FORMAT = "4"  # 3: the control channel, a VM generation ID and the resident helper; 4: the tunnel channel
MIGRATION_TIMEOUT_SECONDS = 120.0
MIGRATION_POLL_SECONDS = 0.005
FD_NAME = "osfleet-state"
IGNORE_SHARED = [{"capability": "x-ignore-shared", "state": True}]


@dataclass(frozen=True)
class SavedState:
    directory: Path
    meta: dict[str, Any]

    @property
    def disk(self) -> Path:
        """The template's overlay as it was at save time; read-only from then on."""
        return self.directory / "disk.qcow2"

    @property
    def memory(self) -> Path:
        """The migration stream: all of memory (``stream`` mode) or device state only (``template``)."""
        return self.directory / "memory.bin"

    @property
    def memory_mode(self) -> MemoryMode:
        return "template" if self.meta.get("memory_mode") == "template" else "stream"

    @property
    def ram(self) -> Path | None:
        """The template RAM file on tmpfs that replicas map (``template`` mode only)."""
        return Path(self.meta["ram_path"]) if self.memory_mode == "template" else None

    @property
    def ram_copy(self) -> Path:
        """The RAM file's sparse copy on disk, put back on tmpfs after a reboot."""
        return self.directory / "ram.bin"

    def memory_file(self) -> MemoryFile | None:
        """How a replica restored from this state maps the template RAM (None: no file).

        A full-stream fork of a replica whose RAM was a file mapping maps that same file privately
        (``mapped_ram``): QEMU checks RAM block names, so the child needs the parent's backend, and the
        stream then overwrites every page."""
        ram = self.ram or (Path(p) if (p := self.meta.get("mapped_ram")) else None)
        if ram is None:
            return None
        return MemoryFile(ram, share=False, rom_off=template_memory.maps_readonly_files())

    def layers(self, image: GoldenImage) -> tuple[Path, ...]:
        """The read-only disk chain a replica restored from this state sits on, nearest first (a fork's
        chain is longer: its own layers, then its parent's)."""
        if "layers" in self.meta:
            return tuple(Path(p) for p in self.meta["layers"])
        return (self.disk, image.disk)

    def stale(self) -> str | None:
        """Why this state may no longer be restored (a disk under it is not the file it was saved on), or None.
        A fork's state (a checkpoint's) records the image's disk it sits on the same way (``forks.image_changed``)."""
        return stale_reason(self.meta)


def disk_identity(path: Path) -> dict[str, Any]:
    """What tells the file at ``path`` from another one put there later: its inode, size and mtime
    (``missing`` when nothing is there). Two stat fields change with any rebuild: a new file renamed into place
    has a new inode, a file written in place a new mtime."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return {"path": str(path), "missing": True}
    return {"path": str(path), "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def stale_reason(meta: dict[str, Any]) -> str | None:
    """Why a saved state with this ``meta.json`` sits on disks that changed since it was saved, or None when
    each disk it recorded (``disks``) is still the same file. A state that recorded none (saved by an osfleet
    before 2026-12) cannot be trusted either."""
    recorded = meta.get("disks")
    if not isinstance(recorded, list) or not recorded:
        return "it records nothing that identifies the image it was saved on (saved by an older osfleet)"
    for was in recorded:
        now = disk_identity(Path(str(was.get("path"))))
        if now != was:
            return f"{was.get('path')} is no longer the file it was saved on ({_difference(was, now)})"
    return None


def _difference(was: dict[str, Any], now: dict[str, Any]) -> str:
    if now.get("missing"):
        return "it is gone"
    changed = [f"{k} {was.get(k)} -> {now[k]}" for k in ("inode", "size", "mtime_ns") if was.get(k) != now[k]]
    return ", ".join(changed) or "its record is unreadable"


def state_key(image: GoldenImage, accel: Accel, shape: ReplicaShape, memory: MemoryMode = "stream") -> str:
    """The name of the saved state of this image's bytes (``disk_identity`` and the build's digest), accelerator,
    replica shape, resident helper and memory mode: a change to any of them is another state."""
    fields: list[Any] = [STATE_FORMAT, image.name, accel, shape.memory_mib, shape.vcpus, shape.tb_cache_mib]
    if shape.network_bridge:  # a NIC is part of the device model a state restores into
        fields.append(f"nic={shape.network_bridge}")
    fields += [shape.kernel_args, guest_control.helper_digest()]  # the helper lives in the saved state
    if memory == "template":  # stream states keep the key they had before template memory existed
        fields.append(memory)
    fields += [disk_identity(image.disk), image.manifest.get("disk_sha256")]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]


def choose_memory_mode(settings: Settings, shape: ReplicaShape) -> tuple[MemoryMode, str | None]:
    """``template`` where this host can keep template RAM on tmpfs, else ``stream`` and the reason."""
    reason = template_memory.unavailable(settings.memory_dir, shape.memory_mib * 2**20)
    if reason:
        return "stream", reason
    assert settings.memory_dir is not None
    template_memory.sweep_orphans(settings.memory_dir)
    return "template", None


def _load(virt: Virt, final: Path) -> SavedState:
    state = SavedState(final, json.loads((final / "meta.json").read_text()))
    if state.ram is not None and not state.ram.exists():  # tmpfs emptied by a reboot: put the RAM back
        template_memory.put_back(state.ram_copy, state.ram, virt.qemu_ids())
    if state.ram is not None and not template_memory.owner_file(state.ram).exists():
        template_memory.claim(state.ram, final)
    return state


def ensure_saved_state(
    virt: Virt,
    image: GoldenImage,
    accel: Accel,
    shape: ReplicaShape,
    settings: Settings,
    say: Any = None,
    memory: MemoryMode = "stream",
) -> SavedState:
    """The saved state for this image, shape and memory mode, made once (about one cold boot), reused after;
    states of this image whose disk changed since are removed first (``remove_stale``)."""
    disks = [disk_identity(image.disk)]
    key = state_key(image, accel, shape, memory)
    final = settings.states_dir / f"{image.name}-{key}"
    remove_stale(settings, image.name, say)
    if (final / "meta.json").exists():
        return _load(virt, final)
    settings.states_dir.mkdir(parents=True, exist_ok=True)
    work = settings.states_dir / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    work.chmod(0o755)
    name = f"{settings.template_prefix}{uuid.uuid4().hex[:8]}"
    ram: Path | None = None
    published = False
    try:
        if say:
            say(f"saving a ready running state of {image.name} ({memory} memory; one cold boot, once per image)")
        qcow2.create_overlay(work / "disk.qcow2", image.disk)
        mem_file = None
        if memory == "template":
            assert settings.memory_dir is not None  # choose_memory_mode checked it
            template_id = uuid.uuid4().hex[:12]
            ram = settings.memory_dir / f"{image.name}-{key}-{template_id}.ram"
            template_memory.create(ram, shape.memory_mib * 2**20, virt.qemu_ids())
            template_memory.claim(ram, final)
            mem_file = MemoryFile(ram, share=True)
        spec = replica_spec(
            image,
            name,
            work / "disk.qcow2",
            (image.disk,),
            accel,
            shape,
            metadata={"role": "template"},
            memory=mem_file,
        )
        start = time.monotonic()
        virt.start_transient(spec)
        agent_s, desktop_s, _ = wait_until_ready(virt, image, name, start, 300, after_agent=120)
        # The resident helper runs in the saved state: every replica restored from it has it already.
        guest_control.start(virt, name)
        # Clean page cache is free to drop: fewer pages in the stream make every restore faster.
        virt.guest_exec(name, ["/bin/sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], timeout=60)
        started = time.monotonic()
        virt.suspend(name)
        if ram is not None:
            virt.qmp(name, "migrate-set-capabilities", {"capabilities": IGNORE_SHARED})
        hand_over(virt, name, work / "memory.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        virt.qmp(name, "migrate", {"uri": f"fd:{FD_NAME}"})
        wait_migration(virt, name)
        save_seconds = time.monotonic() - started
        virt.destroy(name)  # the RAM file is final from here on
        meta: dict[str, Any] = {
            "image": image.name,
            "key": key,
            "accel": accel,
            "shape": shape.__dict__,
            "memory_mode": memory,
            "memory_bytes": (work / "memory.bin").stat().st_size,
            "boot_to_agent_seconds": agent_s,
            "boot_to_desktop_seconds": desktop_s,
            "save_seconds": save_seconds,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "disks": disks,
            "image_sha256": image.manifest.get("disk_sha256"),
        }
        if (why := stale_reason(meta)) is not None:  # replaced while the template booted: its pages are mixed
            raise OsfleetError(f"the saved state of {image.name} was not kept: {why} while it was being saved")
        if ram is not None:
            template_memory.seal(ram, virt.qemu_ids())
            meta["ram_path"] = str(ram)
            meta["ram_bytes"] = ram.stat().st_size
            meta["ram_resident_bytes"] = ram.stat().st_blocks * 512
            template_memory.copy_sparse(ram, work / "ram.bin")
        (work / "disk.qcow2").chmod(0o444)
        (work / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        try:
            work.rename(final)
        except OSError:  # another process saved the same state first: use theirs
            shutil.rmtree(work, ignore_errors=True)
            return _load(virt, final)
        published = True
        return SavedState(final, meta)
    finally:
        virt.destroy(name)
        guest_control.PORTS.forget(name)
        shutil.rmtree(work, ignore_errors=True)
        if ram is not None and not published:
            ram.unlink(missing_ok=True)
            template_memory.owner_file(ram).unlink(missing_ok=True)


def start_incoming(
    virt: Virt,
    state: SavedState,
    image: GoldenImage,
    name: str,
    overlay: Path,
    shape: ReplicaShape,
    metadata: dict[str, str],
) -> None:
    """Create ``overlay`` on the state's disk and start domain ``name`` paused, waiting for the saved memory.

    Split from ``load_memory`` so a host can start the next generation ahead of time (a standby).
    """
    overlay.unlink(missing_ok=True)  # a standby made before a crash may have left this generation's file
    qcow2.create_overlay(overlay, state.disk)
    spec = replica_spec(
        image,
        name,
        overlay,
        state.layers(image),
        state.meta["accel"],
        shape,
        incoming=True,
        metadata=metadata,
        memory=state.memory_file(),
    )
    virt.start_transient(spec, paused=True)


def load_memory(virt: Virt, state: SavedState, name: str, vcpu_nice: int | None = None) -> None:
    """Feed the saved memory into a domain made by ``start_incoming`` and let it run; its vCPUs at
    ``vcpu_nice`` when given (set before they run)."""
    if state.memory_mode == "template":
        virt.qmp(name, "migrate-set-capabilities", {"capabilities": IGNORE_SHARED})
    hand_over(virt, name, state.memory, os.O_RDONLY)
    virt.qmp(name, "migrate-incoming", {"uri": f"fd:{FD_NAME}"})
    wait_migration(virt, name)
    if vcpu_nice is not None:
        virt.set_vcpu_nice(name, vcpu_nice)
    virt.resume(name)


def hand_over(virt: Virt, name: str, path: Path, flags: int) -> None:
    """Open ``path`` here (as root) and give QEMU its descriptor under FD_NAME; QEMU keeps its own copy."""
    fd = os.open(path, flags, 0o600)
    try:
        virt.qmp_with_files(name, "getfd", {"fdname": FD_NAME}, [fd])
    finally:
        os.close(fd)


def wait_migration(virt: Virt, name: str) -> tuple[dict[str, Any], float]:
    """Poll until the domain's migration stream completed; (its final status, the monotonic time the
    poll that saw it completed was sent). A stream that failed raises; one that outlives the timeout is
    cancelled (an outgoing one would otherwise stop its guest later, unattended) and raises."""
    deadline = time.monotonic() + MIGRATION_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        asked = time.monotonic()
        status = virt.qmp(name, "query-migrate") or {}
        state = status.get("status")
        if state == "completed":
            return status, asked
        if state in ("failed", "cancelled"):
            raise OsfleetError(f"{name}: migration stream {state}: {status.get('error-desc', 'no reason given')}")
        time.sleep(MIGRATION_POLL_SECONDS)
    with contextlib.suppress(OsfleetError):
        virt.qmp(name, "migrate_cancel")
    raise GuestTimeoutError(f"{name}: migration stream did not complete within {MIGRATION_TIMEOUT_SECONDS:.0f} s")


def remove_stale(settings: Settings, image_name: str, say: Any = None) -> list[Path]:
    """Remove the saved states of ``image_name`` whose disks changed since they were saved (``stale_reason``),
    each with a warning in the log (and through ``say``); returns their folders. Replicas still running from
    one keep their open files; their next generation comes from the state made anew."""
    removed = []
    for d in sorted(settings.states_dir.glob(f"{image_name}-*")) if settings.states_dir.is_dir() else []:
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            continue  # not a state (or one being renamed into place): not ours to judge
        if meta.get("image") != image_name:
            continue
        why = stale_reason(meta)
        if why is None:
            continue
        message = f"saved state {d.name} is stale: {why}; it is removed and made again"
        log.warning(message)
        if say:
            say(message)
        _remove(d, meta)
        removed.append(d)
    return removed


def _remove(directory: Path, meta: dict[str, Any] | None) -> None:
    """Delete one saved state's folder and its RAM file on tmpfs (with the file naming its owner)."""
    ram = (meta or {}).get("ram_path")
    if ram:
        Path(ram).unlink(missing_ok=True)
        template_memory.owner_file(Path(ram)).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def remove_saved_states(settings: Settings) -> int:
    """Delete every saved state (e.g. after the image changed); returns how many were removed."""
    if not settings.states_dir.exists():
        return 0
    n = 0
    for d in settings.states_dir.iterdir():
        try:
            meta = json.loads((d / "meta.json").read_text())
        except (OSError, ValueError):
            meta = None
        _remove(d, meta)
        n += 1
    return n
