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

import atexit
import contextlib
import hashlib
import secrets
import shlex
import socket
import threading
import time
from importlib import resources
from pathlib import Path

from osfleet.errors import GuestTimeoutError, OsfleetError
from osfleet.replicas import guest_helper
from osfleet.vm.virt import Virt

CHANNEL = guest_helper.PORT_NAME
REQUEST_TIMEOUT_SECONDS = 10.0
START_TIMEOUT_SECONDS = 60.0
MAX_REPLY = 1024
SEED_BYTES = 64
FIRST_TRY_SECONDS = 2.0  # then once more on a new connection
MAX_CONNECTIONS = 1024  # past this, connections to domains that are gone are pruned


class ControlError(OsfleetError):
    """The guest's control helper did not answer as it should (gone, slow, or said err)."""


def helper_source() -> str:
    return resources.files("osfleet.replicas").joinpath("guest_helper.py").read_text()


def socket_path(virt: Virt, domain: str) -> Path:
    """Where the host end of the domain's control port listens (libvirt picks it at start)."""
    return PORTS.path(virt, domain)


class _Conn:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.buf = b""


class Ports:
    """Connections to guests' control ports, one per socket path, kept open between requests.

    Kept open because each connect and close is an event the guest kernel must see (virtio-serial's port
    open/close messages): measured here, a connect right after a resume was sometimes not seen by the
    guest for 10 s and more (its helper cannot answer while its kernel thinks no host is there). A request
    that gets no answer is sent again once on a new connection with the same sequence number; the helper
    answers a repeated request without applying it twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[Path, _Conn] = {}
        self._paths: dict[str, Path] = {}

    def path(self, virt: Virt, domain: str) -> Path:
        """The domain's control socket (read from libvirt once per domain, then remembered)."""
        with self._lock:
            known = self._paths.get(domain)
        if known is not None:
            return known
        found = virt.channel_path(domain, CHANNEL)
        if found is None:
            raise ControlError(f"{domain} has no {CHANNEL} channel (a replica made by an older osfleet)")
        with self._lock:
            self._paths[domain] = found
        return found

    def request(self, path: Path, line: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        with self._lock:
            if path not in self._conns and len(self._conns) >= MAX_CONNECTIONS:
                self._prune()
            conn = self._conns.setdefault(path, _Conn())
        seq = secrets.randbelow(10**12)
        deadline = time.monotonic() + timeout
        first_try = min(timeout, max(FIRST_TRY_SECONDS, timeout / 4))
        with conn.lock:
            try:
                answer = self._ask(conn, path, f"{seq} {line}\n", str(seq), time.monotonic() + first_try)
            except (OSError, ControlError, GuestTimeoutError):
                self._drop(conn)
                try:
                    answer = self._ask(conn, path, f"{seq} {line}\n", str(seq), deadline)
                except TimeoutError:
                    self._drop(conn)
                    raise GuestTimeoutError(
                        f"the control helper behind {path} did not answer within {timeout:.0f} s"
                    ) from None
                except OSError as exc:
                    self._drop(conn)
                    raise ControlError(f"control port {path}: {exc.strerror or exc}") from None
                except (ControlError, GuestTimeoutError):
                    self._drop(conn)
                    raise
        if answer != "ok":
            raise ControlError(f"the control helper behind {path} answered {answer[:200]!r} to {line.split()[0]}")

    def _ask(self, conn: _Conn, path: Path, data: str, seq: str, deadline: float) -> str:
        """Send ``data`` and return what follows ``seq`` in its answer; older answers are skipped."""
        if conn.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                sock.connect(str(path))
            except OSError:
                sock.close()
                raise
            conn.sock, conn.buf = sock, b""
        conn.sock.sendall(data.encode())
        while True:
            while b"\n" in conn.buf:
                raw, conn.buf = conn.buf.split(b"\n", 1)
                if len(raw) >= MAX_REPLY:
                    raise ControlError(f"the control helper behind {path} sent a line of more than {MAX_REPLY} bytes")
                got, _, rest = raw.decode("ascii", errors="replace").partition(" ")
                if got == seq:
                    return rest
            if len(conn.buf) >= MAX_REPLY:
                raise ControlError(f"the control helper behind {path} sent a line of more than {MAX_REPLY} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            conn.sock.settimeout(left)
            chunk = conn.sock.recv(MAX_REPLY)
            if not chunk:
                raise ControlError(f"the control helper behind {path} closed the port without an answer")
            conn.buf += chunk

    @staticmethod
    def _drop(conn: _Conn) -> None:
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.close()
        conn.sock, conn.buf = None, b""

    def forget(self, domain: str) -> None:
        """Close the connection to a domain that is gone."""
        with self._lock:
            path = self._paths.pop(domain, None)
            conn = self._conns.pop(path, None) if path is not None else None
        if conn is not None:
            with conn.lock:
                self._drop(conn)

    def _prune(self) -> None:
        """Forget connections whose guest side is gone (a domain destroyed without ``forget``); the caller
        holds ``_lock``."""
        for path, conn in list(self._conns.items()):
            if not conn.lock.acquire(blocking=False):
                continue
            try:
                gone = conn.sock is None
                if conn.sock is not None:
                    try:
                        gone = conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                if gone:
                    self._drop(conn)
                    del self._conns[path]
                    for domain in [d for d, p in self._paths.items() if p == path]:
                        del self._paths[domain]
            finally:
                conn.lock.release()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            with conn.lock:
                self._drop(conn)


PORTS = Ports()
# Connections to guests whose domains went away by other means (killed QEMU, another process) stay open until
# a prune finds them; a process that exits closes them itself rather than leave them to the garbage collector.
atexit.register(PORTS.close)


def request(path: Path, line: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """Send one request line to the helper behind ``path`` and wait for its ``ok``."""
    PORTS.request(path, line, timeout)


def ping(path: Path, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    request(path, "ping", timeout)


def set_time(path: Path, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """The guest's clock to the host's (it stood still while the guest was paused)."""
    request(path, f"time {time.time():.6f}", timeout)


def adjust_time(path: Path, seconds: float, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """Move the guest's clock forward by ``seconds`` (how long it stood still), whenever the helper runs."""
    request(path, f"adjust {seconds:.6f}", timeout)


def helper_digest() -> str:
    """Names the helper's version: a saved state keeps the helper it was saved with (``state_key``)."""
    return hashlib.sha256(helper_source().encode()).hexdigest()[:12]


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
