"""The one libvirt wrapper: connections, domains, screenshots, guest agent and QMP, errors mapped once.

libvirt errors are translated here by error code; expected ones (no such domain, domain not running)
become precise osfleet errors, everything else a ``VirtError`` naming the domain and libvirt's reason.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import math
import os
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import libvirt_qemu
import psutil
from PIL import Image

from osfleet.errors import GuestTimeoutError, OsfleetError, VirtError
from osfleet.vm.domain_xml import DomainSpec

log = logging.getLogger(__name__)
_handler_lock = threading.Lock()
_handler_registered = False


class DomainNotFoundError(VirtError):
    """No domain of that name exists on this host."""


class DomainNotRunningError(VirtError):
    """The domain exists but is not running."""


class GuestAgentUnavailableError(VirtError):
    """The guest agent did not answer (not yet started, hung or gone)."""


def _quiet_libvirt() -> None:
    """libvirt-python prints every error to stderr unless a handler is set; we raise them instead."""
    global _handler_registered
    with _handler_lock:
        if not _handler_registered:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
            _handler_registered = True


def translate(exc: libvirt.libvirtError, domain: str, action: str) -> OsfleetError:
    code = exc.get_error_code()
    msg = (exc.get_error_message() or str(exc)).splitlines()[0]
    if code == libvirt.VIR_ERR_NO_DOMAIN:
        return DomainNotFoundError(f"no domain {domain}")
    if code == libvirt.VIR_ERR_OPERATION_INVALID and "not running" in msg:
        return DomainNotRunningError(f"domain {domain} is not running")
    if code in (libvirt.VIR_ERR_AGENT_UNRESPONSIVE, libvirt.VIR_ERR_AGENT_UNSYNCED) or "guest agent" in msg:
        return GuestAgentUnavailableError(f"{domain}: guest agent: {msg}")
    if code == libvirt.VIR_ERR_OPERATION_TIMEOUT:
        return GuestAgentUnavailableError(f"{domain}: {action} timed out: {msg}")
    return VirtError(f"{action} {domain}: {msg}")


class Virt:
    """A connection to one host's libvirt; cheap to create, closed with ``close()`` or ``with``."""

    def __init__(self, uri: str) -> None:
        _quiet_libvirt()
        self.uri = uri
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            reason = (exc.get_error_message() or str(exc)).splitlines()[0]
            raise VirtError(f"cannot connect to libvirt at {uri}: {reason} (is libvirtd running?)") from None

    def __enter__(self) -> Virt:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            self.conn.close()

    def _domain(self, name: str) -> libvirt.virDomain:
        """The libvirt handle of ``name``; stays inside this module, callers name domains by name."""
        try:
            return self.conn.lookupByName(name)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, "looking up") from None

    def start_transient(self, spec: DomainSpec, paused: bool = False) -> None:
        """Create and start a domain that libvirt forgets once it stops: nothing to undefine later."""
        xml = spec.to_xml()
        log.debug("creating domain %s:\n%s", spec.name, xml)
        flags = libvirt.VIR_DOMAIN_START_PAUSED if paused else 0
        try:
            self.conn.createXML(xml, flags)
        except libvirt.libvirtError as exc:
            raise translate(exc, spec.name, "starting") from None

    def define(self, xml: str, name: str) -> None:
        """Define a persistent domain from XML (tests on libvirt's test:/// driver use this)."""
        log.debug("defining domain %s:\n%s", name, xml)
        try:
            self.conn.defineXML(xml)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, "defining") from None

    def suspend(self, name: str) -> None:
        """Pause the domain's vCPUs (its QEMU stays, memory intact)."""
        try:
            self._domain(name).suspend()
        except libvirt.libvirtError as exc:
            raise translate(exc, name, "pausing") from None

    def resume(self, name: str) -> None:
        try:
            self._domain(name).resume()
        except libvirt.libvirtError as exc:
            raise translate(exc, name, "resuming") from None

    def set_vcpu_nice(self, name: str, nice: int) -> None:
        """Give the domain's vCPU threads (and only them: its QEMU main thread keeps its priority) this nice
        value. A running guest at 19 still runs, but yields a core to anything else that wants it."""
        cpus = self.qmp(name, "query-cpus-fast") or []
        for cpu in cpus:
            with contextlib.suppress(ProcessLookupError):  # the domain went away meanwhile
                os.setpriority(os.PRIO_PROCESS, int(cpu["thread-id"]), nice)

    def destroy(self, name: str) -> bool:
        """Stop (and, if persistent, undefine) ``name``; False when it did not exist."""
        try:
            dom = self.conn.lookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return False
            raise translate(exc, name, "looking up") from None
        try:
            if dom.isActive():
                dom.destroy()
            if dom.isPersistent():
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise translate(exc, name, "destroying") from None
        return True

    def names(self, prefix: str) -> list[str]:
        """Names of every domain (running or defined) whose name starts with ``prefix``."""
        try:
            return sorted(d.name() for d in self.conn.listAllDomains() if d.name().startswith(prefix))
        except libvirt.libvirtError as exc:
            raise translate(exc, prefix + "*", "listing") from None

    def is_running(self, name: str) -> bool:
        try:
            return bool(self.conn.lookupByName(name).isActive())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return False
            raise translate(exc, name, "looking up") from None

    def screenshot(self, name: str) -> Image.Image:
        """The domain's framebuffer as an RGB image (libvirt streams a PPM)."""
        dom = self._domain(name)
        stream = self.conn.newStream(0)
        try:
            dom.screenshot(stream, 0, 0)
            chunks: list[bytes] = []
            while True:
                data = stream.recv(1 << 20)
                if not data:
                    break
                if isinstance(data, int):  # -2: would block; the stream is blocking, so retry
                    continue
                chunks.append(data)
            stream.finish()
        except libvirt.libvirtError as exc:
            with contextlib.suppress(libvirt.libvirtError):
                stream.abort()
            raise translate(exc, name, "taking a screenshot of") from None
        return Image.open(io.BytesIO(b"".join(chunks))).convert("RGB")

    def agent(self, name: str, command: str, arguments: dict[str, Any] | None = None, timeout: int = 5) -> Any:
        """Run one qemu-guest-agent command and return its ``return`` value."""
        payload = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
        try:
            out = libvirt_qemu.qemuAgentCommand(self._domain(name), payload, timeout, 0)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, f"guest agent {command} on") from None
        try:  # the guest agent is the guest's: its answer is checked like any input from it
            answer = json.loads(out)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise GuestAgentUnavailableError(f"{name}: guest agent answered {command} with something unreadable")
        return answer.get("return")

    def guest_exec(self, name: str, argv: list[str], timeout: float = 30.0) -> tuple[int, str, str]:
        """Run a program in the guest through the agent; (exit code, stdout, stderr). Raises on timeout."""
        started = self.agent(name, "guest-exec", {"path": argv[0], "arg": argv[1:], "capture-output": True})
        pid = started.get("pid") if isinstance(started, dict) else None
        if not isinstance(pid, int):
            raise GuestAgentUnavailableError(f"{name}: guest agent started {argv[0]} without a pid")
        deadline = time.monotonic() + timeout
        for _ in _until(timeout, 0.05):
            left = max(1, min(5, math.ceil(deadline - time.monotonic())))
            status = self.agent(name, "guest-exec-status", {"pid": pid}, timeout=left)
            if not isinstance(status, dict):
                raise GuestAgentUnavailableError(f"{name}: guest agent answered guest-exec-status with junk")
            if status.get("exited"):
                try:
                    out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")
                    err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")
                    code = 128 + int(status["signal"]) if "signal" in status else int(status.get("exitcode", -1))
                except (TypeError, ValueError):
                    raise GuestAgentUnavailableError(
                        f"{name}: guest agent answered guest-exec-status with junk"
                    ) from None
                return code, out, err
        raise GuestTimeoutError(f"{name}: {argv[0]} did not finish within {timeout:.0f} s")

    def qmp(self, name: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """Run one QMP command on the domain's QEMU monitor and return its ``return`` value."""
        payload = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
        try:
            out = libvirt_qemu.qemuMonitorCommand(self._domain(name), payload, 0)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, f"QMP {command} on") from None
        return json.loads(out).get("return")

    def qmp_with_files(self, name: str, command: str, arguments: dict[str, Any], files: list[int]) -> Any:
        """A QMP command that passes open file descriptors to QEMU (``getfd``): QEMU reads or writes them
        with its own sandbox intact, unlike ``exec:`` migration URIs which the sandbox forbids."""
        payload = json.dumps({"execute": command, "arguments": arguments})
        try:
            out = libvirt_qemu.qemuMonitorCommandWithFiles(self._domain(name), payload, files, 0)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, f"QMP {command} on") from None
        text = out[0] if isinstance(out, tuple) else out
        return json.loads(text).get("return")

    def channel_path(self, name: str, target: str) -> Path | None:
        """The host end (a UNIX socket) of the running domain's virtio channel ``target``, from its live
        XML (libvirt picks the path at start), or None when it has no such channel."""
        try:
            xml = self._domain(name).XMLDesc(0)
        except libvirt.libvirtError as exc:
            raise translate(exc, name, "reading the XML of") from None
        for channel in ET.fromstring(xml).iterfind("devices/channel"):
            tgt = channel.find("target")
            src = channel.find("source")
            if tgt is not None and tgt.get("name") == target and src is not None and src.get("path"):
                return Path(str(src.get("path")))
        return None

    def qemu_ids(self) -> tuple[int, int] | None:
        """The uid and gid QEMU processes run as (libvirt's DAC label), or None when libvirt names none."""
        try:
            caps = self.conn.getCapabilities()
        except libvirt.libvirtError as exc:
            raise translate(exc, "host", "reading the capabilities of") from None
        for model in ET.fromstring(caps).iterfind("host/secmodel"):
            label = model.find("baselabel[@type='qemu']")
            if model.findtext("model") == "dac" and label is not None and label.text:
                uid, _, gid = label.text.replace("+", "").partition(":")
                return int(uid), int(gid)
        return None

    def qemu_pid(self, name: str) -> int | None:
        """PID of the domain's QEMU process (from libvirt's pid file), or None when it is not running."""
        pidfile = Path("/run/libvirt/qemu") / f"{name}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def rss_bytes(self, name: str) -> int | None:
        """Resident memory of the domain's QEMU process."""
        pid = self.qemu_pid(name)
        if pid is None:
            return None
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None

    def wait_for_agent(self, name: str, timeout: float, interval: float = 0.05) -> float:
        """Poll guest-ping until the agent answers; returns the seconds waited.

        After a restore, libvirt learns that the guest's agent port is open only a moment after resume,
        so callers wait here instead of failing on the first "not connected".
        """
        start = time.monotonic()
        for _ in _until(timeout, interval):
            if not self.is_running(name):
                raise DomainNotRunningError(f"domain {name} stopped while waiting for its guest agent")
            try:
                self.agent(name, "guest-ping", timeout=1)
                return time.monotonic() - start
            except GuestAgentUnavailableError:
                continue
            except VirtError as exc:  # the agent channel is not connected yet
                if "agent" not in str(exc).lower():
                    raise
        raise GuestTimeoutError(f"{name}: guest agent did not answer within {timeout:.0f} s")


def _until(timeout: float, interval: float) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        yield
        time.sleep(interval)
