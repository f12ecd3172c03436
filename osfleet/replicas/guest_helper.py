"""The resident helper inside every snapshot guest: identity and clock over a virtio-serial port.

This file is a guest program (python3's standard library only; it must run on the oldest image's
python3-minimal) and is imported on the host only by tests. ``osfleet.replicas.guest_control`` starts it
in the template a saved state is taken from, before the save, so every replica restored from that state
(and every child of a fork) already has it running. Its pages are then the template's: a replica pays
only for the few pages the helper writes, where a helper started per replica (the clock helper of
earlier versions) cost ~30 MiB of private guest memory each.

Why a port and not the guest agent: a guest-exec costs a process start in a just-restored TCG guest
(150-300 ms, ~1 s for a shell script) and each agent call is a sync round trip plus a command. The helper
blocks on the port ``org.osfleet.control.0`` (a virtio-serial channel osfleet gives every replica); the
host writes one line and reads one line back. While no host is connected the helper sleeps in
``sigtimedwait`` for the SIGIO the guest kernel sends when the host connects, so an idle or parked guest
has no wake-ups from it.

The protocol is one request line and one reply line, ASCII, at most ``MAX_LINE`` bytes:

    <seq> time <unix-seconds>                                   -> <seq> ok
    <seq> adjust <seconds>                                      -> <seq> ok
    <seq> identity <hostname> <machine-id> <seed-hex> <unix-seconds> -> <seq> ok
    <seq> ping                                                  -> <seq> ok
    anything else, or a failure                                 -> <seq> err <reason>

``adjust`` moves the clock by the time the guest stood still (a fork's child: the host knows when the
parent stopped), so it is right whenever the helper gets to run; the host need not wait for it.
``identity`` sets the hostname, /etc/machine-id, mixes the host's seed into the kernel's entropy pool and
forces the kernel RNG to reseed (RNDADDENTROPY + RNDRESEEDCRNG: clones must not share random streams,
and a VM generation ID alone reseeds only where the guest kernel has its driver), then sets the clock.
Every field is validated here too: the host is trusted, but a malformed line must not become a write to
an arbitrary path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import sys
import time
from collections.abc import Callable

PORT_NAME = "org.osfleet.control.0"  # domain_xml.CONTROL_CHANNEL (this file imports nothing of osfleet)
MAX_LINE = 512
IDLE_WAIT_SECONDS = 60.0  # a safety net only: the host's connect wakes the helper by SIGIO
WRITE_TRIES = 100
WRITE_RETRY_SECONDS = 0.02
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207
HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")
SEED = re.compile(r"^[0-9a-f]{16,256}$")
# Fewer wake-ups of an idle guest (each costs host CPU under TCG): no proactive compaction, vmstat every
# 10 s, no soft-lockup watchdog. Set once, in the template, so every replica inherits them.
QUIET = {
    "/proc/sys/vm/compaction_proactiveness": "0",
    "/proc/sys/vm/stat_interval": "10",
    "/proc/sys/kernel/watchdog": "0",
}


class Guest:
    """What the helper changes in the guest; a test replaces it with a recorder."""

    def set_time(self, seconds: float) -> None:
        time.clock_settime(time.CLOCK_REALTIME, seconds)

    def now(self) -> float:
        return time.clock_gettime(time.CLOCK_REALTIME)

    def set_identity(self, hostname: str, machine_id: str, seed: bytes) -> None:
        _write("/proc/sys/kernel/hostname", hostname)
        _write("/etc/hostname", hostname + "\n")
        _write("/etc/machine-id", machine_id + "\n")
        fd = os.open("/dev/urandom", os.O_WRONLY)
        try:
            # struct rand_pool_info {int entropy_count (bits); int buf_size (bytes); u32 buf[];}
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
            fcntl.ioctl(fd, RNDRESEEDCRNG)
        finally:
            os.close(fd)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not 1e9 < value < 1e11:  # 2001..5138: a clock, not a typo
        raise ValueError(f"implausible time {text}")
    return value


def handle(line: bytes, guest: Guest) -> bytes:
    """One request line (without its newline) to one reply line (with it)."""
    try:
        fields = line.decode("ascii").split()
    except UnicodeDecodeError:
        return b"- err not ascii\n"
    if not fields or not fields[0].isdigit() or len(fields[0]) > 12:
        return b"- err no sequence number\n"
    seq, op, args = fields[0], fields[1] if len(fields) > 1 else "", fields[2:]
    try:
        if op == "ping" and not args:
            pass
        elif op == "time" and len(args) == 1:
            guest.set_time(_seconds(args[0]))
        elif op == "adjust" and len(args) == 1:
            delta = float(args[0])
            if not -86400.0 < delta < 1e8:  # a day back .. three years forward
                raise ValueError(f"implausible adjustment {args[0]}")
            guest.set_time(guest.now() + delta)
        elif op == "identity" and len(args) == 4:
            hostname, machine_id, seed, now = args
            if not HOSTNAME.match(hostname) or not MACHINE_ID.match(machine_id) or not SEED.match(seed):
                raise ValueError("malformed identity")
            if len(seed) % 2:
                raise ValueError("odd seed length")
            when = _seconds(now)
            guest.set_identity(hostname, machine_id, bytes.fromhex(seed))
            guest.set_time(when)
        else:
            raise ValueError(f"unknown request {op!r} with {len(args)} argument(s)")
    except (ValueError, OSError) as exc:
        reason = re.sub(r"[^ -~]", "?", str(exc))[:200]
        return f"{seq} err {reason}\n".encode()
    return f"{seq} ok\n".encode()


def find_port(sysfs: str = "/sys/class/virtio-ports") -> str | None:
    """The device of the port the host named ``PORT_NAME`` (no udev symlinks in osfleet's guests)."""
    try:
        entries = sorted(os.listdir(sysfs))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"{sysfs}/{entry}/name") as f:
                if f.read().strip() == PORT_NAME:
                    return f"/dev/{entry}"
        except OSError:
            continue
    return None


def _send(fd: int, data: bytes) -> bool:
    """Write a reply; a port whose host connection the guest kernel has not seen yet (its open event is
    on the way) refuses writes for a moment, so wait a little before giving up."""
    for _ in range(WRITE_TRIES):
        try:
            os.write(fd, data)
            return True
        except BlockingIOError:
            time.sleep(WRITE_RETRY_SECONDS)
        except OSError:
            return False
    return False


def serve(fd: int, guest: Guest, wait: Callable[[], object]) -> None:
    """Answer requests on ``fd`` forever; ``wait()`` blocks until a host may have connected.

    A request the host sends again (same sequence number: it did not see the answer) is answered again
    without being applied twice (``adjust`` is relative)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = b""
    last: tuple[bytes, bytes] = (b"", b"")
    while True:
        events = 0
        for _, ev in poller.poll():
            events |= ev
        if events & select.POLLIN:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if chunk:
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    seq = line.split(b" ", 1)[0]
                    reply = last[1] if seq and seq == last[0] else handle(line[:MAX_LINE], guest)
                    last = (seq, reply)
                    if not _send(fd, reply):
                        break  # the host went away before the answer: it asks again
                if len(buf) > MAX_LINE:
                    buf = b""  # no line that long is a request
                continue
        # Read end of file, or only POLLHUP: no host is connected (the port reads empty until one is).
        buf = b""  # a half line from a host that left is void
        wait()


def main() -> None:
    for path, value in QUIET.items():
        with contextlib.suppress(OSError):
            _write(path, value)
    port = None
    for _ in range(100):
        port = find_port()
        if port:
            break
        time.sleep(0.1)
    if port is None:
        sys.exit(f"no virtio-serial port named {PORT_NAME}")
    # SIGIO stays blocked: it is only waited for (sigtimedwait), so it never interrupts a read or write.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})
    fd = os.open(port, os.O_RDWR | os.O_NONBLOCK)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    with open("/run/osfleet-control.pid", "w") as f:
        f.write(f"{os.getpid()}\n")
    serve(fd, Guest(), lambda: signal.sigtimedwait({signal.SIGIO}, IDLE_WAIT_SECONDS))


if __name__ == "__main__":
    main()
