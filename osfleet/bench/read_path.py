"""``osfleet bench read-path``: a getter's guest file read through the guest agent vs from the replica's disk.

Both ways read the same files on one real replica, alternated, as a ``vm_file`` getter would:
- ``guest_agent`` (what osfleet does): ``test -f`` in the guest, then qemu-ga's ``guest-file-open/read/close``;
- ``host_disk`` (measured, not adopted; README "Security model"): the guest's page cache flushed
  (``guest-fsfreeze-freeze`` + ``thaw``: a guest that lies only hides its own file), the domain paused (QEMU
  flushes its qcow2 caches when it stops), the overlay chain exported read-only by ``qemu-storage-daemon`` over
  FUSE, the file read by ``debugfs`` (ext4 in user space: never mounted in the host's kernel), the domain
  resumed. Each read checks that both ways got the same bytes.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import MissingToolError, OsfleetError
from osfleet.measure.stats import distribution
from osfleet.protocol.actions import MAX_READ_BYTES
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

Say = Callable[[str], None]
SIZES = {"small": 4844, "large": 2**20}  # the acceptance check's workbook; a 1 MiB document
EXPORT_WAIT_SECONDS = 10.0


def _via_agent(host: ReplicaHost, rid: str, path: str) -> tuple[dict[str, float], bytes]:
    t = time.perf_counter()
    out = host.shell(rid, f"test -f {shlex.quote(path)} && echo present || echo absent", 30, True)
    if out["stdout"].strip() != "present":
        raise OsfleetError(f"{path} is not in the guest")
    data = host.read_file(rid, path, MAX_READ_BYTES)
    return {"total": time.perf_counter() - t}, data


def _via_disk(host: ReplicaHost, rid: str, path: str) -> tuple[dict[str, float], bytes]:
    rec = host.get(rid)
    t0 = time.perf_counter()
    host.virt.agent(rec.domain, "guest-fsfreeze-freeze", timeout=30)
    host.virt.agent(rec.domain, "guest-fsfreeze-thaw", timeout=30)
    t1 = time.perf_counter()
    host.virt.suspend(rec.domain)
    folder = Path(tempfile.mkdtemp(prefix="osfleet-read-"))
    view = folder / "disk.raw"
    view.touch()
    daemon = None
    try:
        daemon = subprocess.Popen(
            [
                "qemu-storage-daemon",
                "--blockdev",
                f"driver=file,filename={rec.disk},node-name=f,read-only=on,locking=off",
                "--blockdev",
                "driver=qcow2,file=f,node-name=q,read-only=on",
                "--export",
                f"type=fuse,id=e,node-name=q,mountpoint={view},writable=off",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + EXPORT_WAIT_SECONDS
        while view.stat().st_size == 0:
            if time.monotonic() > end or daemon.poll() is not None:
                raise OsfleetError(f"qemu-storage-daemon did not export {rec.disk}")
            time.sleep(0.005)
        t2 = time.perf_counter()
        out = subprocess.run(["debugfs", "-c", "-R", f'cat "{path}"', str(view)], capture_output=True, timeout=30)
        t3 = time.perf_counter()
    finally:
        if daemon is not None:
            daemon.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(10)
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()
        host.virt.resume(rec.domain)
        t4 = time.perf_counter()
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)  # only if the daemon died
        shutil.rmtree(folder, ignore_errors=True)
    parts = {"flush": t1 - t0, "export": t2 - t1, "debugfs": t3 - t2, "stop_resume": t4 - t3, "total": t4 - t0}
    return parts, out.stdout


def _put(host: ReplicaHost, rid: str, path: str, blob: bytes) -> None:
    text = base64.b64encode(blob).decode()
    q = shlex.quote(path)
    host.shell(rid, f"rm -f {q}.b64", 30, True)
    for i in range(0, len(text), 60000):
        host.shell(rid, f"printf %s {text[i : i + 60000]} >> {q}.b64", 60, True)
    out = host.shell(rid, f"base64 -d {q}.b64 > {q} && rm {q}.b64 && chown user {q}", 60, True)
    if out["exit_code"] != 0:
        raise OsfleetError(f"writing {path} in the guest failed: {out['stderr'][:200]}")


def run(image: GoldenImage, rounds: int = 5, settings: Settings | None = None, say: Say = print) -> dict[str, Any]:
    from osfleet.measure.host_facts import describe

    for tool, package in (("qemu-storage-daemon", "qemu-system-x86"), ("debugfs", "e2fsprogs")):
        if shutil.which(tool) is None:
            raise MissingToolError(tool, package)
    if not Path("/dev/fuse").exists():
        raise MissingToolError("/dev/fuse", "fuse3")
    settings = settings or Settings.from_env()
    host = ReplicaHost(image, settings, ReplicaShape(), mode="snapshot", auto_recover=False, say=say)
    result: dict[str, Any] = {"benchmark": "read-path", "image": image.name, "rounds": rounds}
    try:
        rid = host.create().replica
        for name, size in SIZES.items():
            blob, path = os.urandom(size), f"/home/user/osfleet-read-{name}.bin"
            _put(host, rid, path, blob)
            say(f"{name} file ({size} bytes): {rounds} reads each way, alternated")
            agent: list[dict[str, float]] = []
            disk: list[dict[str, float]] = []
            for _ in range(rounds):
                for way, out in ((_via_agent, agent), (_via_disk, disk)):
                    parts, data = way(host, rid, path)
                    if data != blob:
                        raise OsfleetError(f"{way.__name__} read {len(data)} bytes that differ from what was written")
                    out.append(parts)
            result[name] = {
                "bytes": size,
                "guest_agent_s": distribution([p["total"] for p in agent]),
                "host_disk_s": distribution([p["total"] for p in disk]),
                "host_disk_parts_p50_s": {k: distribution([p[k] for p in disk])["p50"] for k in disk[0]},
            }
    finally:
        try:
            host.down(host.made_here())
        finally:
            host.close()
    result["machine"] = describe(host.accel)
    return result


def summary(result: dict[str, Any]) -> str:
    lines = []
    for name in SIZES:
        r = result[name]
        parts = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["host_disk_parts_p50_s"].items())
        lines.append(
            f"{name} ({r['bytes']} bytes): guest agent p50 {r['guest_agent_s']['p50'] * 1000:.0f} ms, "
            f"host disk p50 {r['host_disk_s']['p50'] * 1000:.0f} ms ({parts})"
        )
    return "\n".join(lines)
