"""The host's side of the guest's control port: identity and clock in one line each, no guest-exec.

Every replica has a virtio-serial channel ``org.osfleet.control.0`` (``domain_xml.DomainSpec``) whose host
end is a UNIX socket libvirt names in the live domain XML. ``start`` launches the resident helper
(``osfleet.replicas.guest_helper``) in a guest once, through the guest agent: that is done in the
template a saved state is taken from, so replicas restored from it (spares, fork children, parked
replicas) have it already and no Python process of their own. After that a request is: connect, write
one line, read one line, close; a few milliseconds in a running guest, where a guest-exec costs a
process start in the guest (150-300 ms just after a restore).

What comes back is the guest's: read with a deadline, at most ``MAX_REPLY`` bytes, and only the exact
``<seq> ok`` counts as success.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import shlex
import socket
import time
from importlib import resources
from pathlib import Path

from osfleet.errors import GuestTimeoutError, OsfleetError
from osfleet.replicas import guest_helper
from osfleet.virt import Virt

CHANNEL = guest_helper.PORT_NAME
REQUEST_TIMEOUT_SECONDS = 10.0
START_TIMEOUT_SECONDS = 60.0
MAX_REPLY = 1024
SEED_BYTES = 64
_seq = itertools.count(1)


class ControlError(OsfleetError):
    """The guest's control helper did not answer as it should (gone, slow, or said err)."""


def helper_source() -> str:
    return resources.files("osfleet.replicas").joinpath("guest_helper.py").read_text()


def socket_path(virt: Virt, domain: str) -> Path:
    """Where the host end of the domain's control port listens (libvirt picks it at start)."""
    path = virt.channel_path(domain, CHANNEL)
    if path is None:
        raise ControlError(f"{domain} has no {CHANNEL} channel (a replica made by an older osfleet)")
    return path


def request(path: Path, line: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """Send one request line to the helper behind ``path`` and wait for its ``ok``."""
    seq = next(_seq)
    deadline = time.monotonic() + timeout
    reply = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(f"{seq} {line}\n".encode())
            while b"\n" not in reply:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(MAX_REPLY - len(reply))
                if not chunk:
                    raise ControlError(f"the control helper behind {path} closed the port without an answer")
                reply += chunk
                if len(reply) >= MAX_REPLY:
                    raise ControlError(f"the control helper behind {path} sent more than {MAX_REPLY} bytes")
    except TimeoutError:
        raise GuestTimeoutError(f"the control helper behind {path} did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise ControlError(f"control port {path}: {exc.strerror or exc}") from None
    answer = reply.split(b"\n", 1)[0].decode("ascii", errors="replace")
    if answer != f"{seq} ok":
        raise ControlError(f"the control helper behind {path} answered {answer[:200]!r} to {line.split()[0]}")


def ping(path: Path, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    request(path, "ping", timeout)


def set_time(path: Path, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """The guest's clock to the host's (it stood still while the guest was paused)."""
    request(path, f"time {time.time():.6f}", timeout)


def set_identity(path: Path, hostname: str, machine_id: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """Hostname, machine id, fresh kernel randomness (reseeded from the host's) and the clock."""
    seed = secrets.token_hex(SEED_BYTES)
    request(path, f"identity {hostname} {machine_id} {seed} {time.time():.6f}", timeout)


def start(virt: Virt, domain: str, timeout: float = START_TIMEOUT_SECONDS) -> Path:
    """Launch the helper in a running guest (detached, so the guest agent does not keep it as a child)
    and wait until it answers on the port; returns the port's socket path."""
    path = socket_path(virt, domain)
    program = shlex.quote(helper_source())
    # The shell returns at once; the helper runs on, reparented to the guest's init.
    code, _, err = virt.guest_exec(
        domain,
        ["/bin/sh", "-c", f"python3 -c {program} </dev/null >/run/osfleet-control.log 2>&1 &"],
        timeout=timeout,
    )
    if code != 0:
        raise ControlError(f"{domain}: starting the control helper failed: {err.strip()[:200]}")
    deadline = time.monotonic() + timeout
    last: OsfleetError | None = None
    while time.monotonic() < deadline:
        try:
            ping(path, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            return path
        except OsfleetError as exc:  # not listening yet (python3 still starting)
            last = exc
            time.sleep(0.1)
    log = ""
    with contextlib.suppress(OsfleetError):
        _, log, _ = virt.guest_exec(domain, ["/bin/sh", "-c", "tail -c 400 /run/osfleet-control.log"], timeout=20)
    raise ControlError(f"{domain}: the control helper did not answer within {timeout:.0f} s ({last}) {log.strip()}")
