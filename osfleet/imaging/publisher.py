"""Put a golden image into a host's image store once: read-only, checksummed, with metadata.

Files are uploaded under temporary names, checked against the build's checksum and renamed into place,
metadata last; an existing image with the same checksum is left alone; one with another checksum is
replaced only when no process holds it open (replicas' QEMU processes keep their backing file open, and a host
agent its image's disk). A publish holds the store's lock (``build_lock``), so two publishes of one name, or a
publish and a build into the same folder, never interleave their renames.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from pathlib import Path

from osfleet.config import GOLDEN_PREFIX, Settings
from osfleet.errors import CommandFailedError, ImageInUseError
from osfleet.imaging import build_lock
from osfleet.imaging.host import Host
from osfleet.vm.images import GoldenImage


def pids_using(host: Host, path: str) -> list[int]:
    """Processes on ``host`` with ``path`` open (scanned from /proc, no extra tools needed)."""
    # find's -lname compares each fd link's target without starting a process per fd (a host running
    # hundreds of replicas has tens of thousands of them); glob characters in the path are escaped.
    pattern = shlex.quote("".join(f"[{c}]" if c in "*?[]" else c for c in path))
    out = host.run(
        f"find /proc/[0-9]*/fd -maxdepth 1 -lname {pattern} 2>/dev/null; true",
        what="checking image use",
    )
    return sorted({int(line.split("/")[2]) for line in out.split() if line.startswith("/proc/")})  # /proc/PID/fd/N


def _refuse_in_use(host: Host, disk: str) -> None:
    users = pids_using(host, disk)
    if users:
        raise ImageInUseError(
            f"{disk} on {host.name} differs from the build but is in use by pid(s) "
            f"{', '.join(map(str, users))}: stop its host agent and replicas before publishing again"
        )


def publish(host: Host, image: GoldenImage, store: str | None = None) -> str:
    """Publish ``image`` (files on this machine) into ``store`` on ``host``; returns the published disk path."""
    store = store or str(Settings.from_env().image_store)
    stem = f"{store}/{image.name}"
    disk, meta = f"{stem}.qcow2", f"{stem}.json"
    sha = image.manifest["disk_sha256"]
    host.require_tools(["sha256sum", "flock"])
    host.run(f"mkdir -p {shlex.quote(store)}", what=f"creating {store}")
    with build_lock.folder_lock(host, store, f"osfleet image publish of {image.name}"):
        if host.exists(meta) and host.exists(disk):
            current = host.run(f"sha256sum {shlex.quote(disk)}").split()[0]
            if current == sha:
                host.say(f"{image.name} is already published on {host.name} (checksum matches)")
                return disk
            _refuse_in_use(host, disk)

        sources = [image.disk, image.kernel, image.initrd]
        host.require_free(store, int(sum(p.stat().st_size for p in sources) * 1.1) + 2**20, f"publishing {image.name}")
        tag = uuid.uuid4().hex[:8]
        staged: list[tuple[str, str]] = []
        try:
            for src in sources:
                final = f"{stem}{src.suffix}"
                part = f"{store}/.{src.name}.part-{tag}"
                host.say(f"uploading {src.name} ({src.stat().st_size / 2**20:.1f} MiB) to {host.name}:{store}")
                host.put(src, part)
                staged.append((part, final))
            got = host.run(f"sha256sum {shlex.quote(staged[0][0])}").split()[0]
            if got != sha:
                raise CommandFailedError(f"checksum mismatch after upload to {host.name}: {got} != {sha}")
            if host.exists(disk):
                _refuse_in_use(host, disk)  # a host agent may have started on it during the upload
            host.run(f"rm -f {shlex.quote(meta)}")  # never an old manifest over new files: it comes back last
            for part, final in staged:
                host.run(f"chmod 0444 {shlex.quote(part)} && mv -f {shlex.quote(part)} {shlex.quote(final)}")
            metadata = dict(image.manifest)
            metadata.update(published_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), published_to=host.name)
            part = f"{store}/.{Path(meta).name}.part-{tag}"
            host.write_file(part, json.dumps(metadata, indent=2) + "\n", 0o444)
            host.run(f"mv -f {shlex.quote(part)} {shlex.quote(meta)}")
        finally:
            host.probe(f"rm -f {shlex.quote(store)}/.{GOLDEN_PREFIX}*.part-{tag}")
    host.say(f"published {image.name} to {host.name}:{store}")
    return disk
