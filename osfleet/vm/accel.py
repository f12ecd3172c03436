"""Which accelerator really runs guests on this host: KVM when a probe boot finishes under it, else TCG.

``/dev/kvm`` existing is not enough: with broken nested virtualisation a KVM guest hangs during boot.
So the probe boots the golden image's own kernel under KVM, bounded in time, with no root disk; the
kernel's panic line on the serial port proves it ran to the end of its initialisation. The answer is
remembered per host (hostname, host kernel and QEMU version).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from osfleet.config import Settings
from osfleet.errors import MissingToolError
from osfleet.vm.domain_xml import Accel

PROBE_TIMEOUT_SECONDS = 20.0
PROBE_MARKER = b"Kernel panic"


def _qemu_binary() -> str:
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        raise MissingToolError("qemu-system-x86_64", "qemu-system-x86")
    return path


def _host_key(qemu: str) -> str:
    version = subprocess.run([qemu, "--version"], capture_output=True, text=True, check=False).stdout
    return f"{platform.node()}|{os.uname().release}|{version.splitlines()[0] if version else '?'}"


def probe_kvm(kernel: Path, timeout: float = PROBE_TIMEOUT_SECONDS) -> tuple[bool, float, str]:
    """Boot ``kernel`` under KVM until it panics for lack of a root disk; (works, seconds, reason)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, 0.0, "/dev/kvm is missing or not accessible"
    cmd = [
        _qemu_binary(),
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-m",
        "128",
        "-nodefaults",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-append",
        "console=ttyS0 panic=-1 root=/dev/osfleet-probe-none",
    ]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False, time.monotonic() - start, f"a KVM guest did not finish booting within {timeout:.0f} s"
    seconds = time.monotonic() - start
    if PROBE_MARKER in out:
        return True, seconds, "a KVM guest booted"
    return False, seconds, f"the KVM probe exited ({proc.returncode}) before the kernel finished booting"


def detect_accelerator(kernel: Path, settings: Settings | None = None, refresh: bool = False) -> Accel:
    """``"kvm"`` if guests really run under KVM here, else ``"qemu"`` (TCG); cached per host."""
    settings = settings or Settings.from_env()
    key = _host_key(_qemu_binary())
    cache: dict[str, dict[str, object]] = {}
    if settings.accel_cache.exists():
        try:
            cache = json.loads(settings.accel_cache.read_text())
        except (OSError, ValueError):
            cache = {}
    if not refresh and key in cache and cache[key].get("accel") in ("kvm", "qemu"):
        return "kvm" if cache[key]["accel"] == "kvm" else "qemu"
    works, seconds, reason = probe_kvm(kernel)
    accel: Accel = "kvm" if works else "qemu"
    cache[key] = {
        "accel": accel,
        "reason": reason,
        "probe_seconds": round(seconds, 2),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    settings.accel_cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = settings.accel_cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=2) + "\n")
    tmp.replace(settings.accel_cache)
    return accel


def cached_reason(settings: Settings | None = None) -> str | None:
    """Why the cached answer for this host was chosen, for reports."""
    settings = settings or Settings.from_env()
    try:
        cache = json.loads(settings.accel_cache.read_text())
        return str(cache[_host_key(_qemu_binary())]["reason"])
    except (OSError, ValueError, KeyError):
        return None
