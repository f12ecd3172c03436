"""The processes of one sandbox as E2B's daemon reports them: started, followed, signalled, listed.

Two kinds share one table: **guest** processes, commands running in the guest as the desktop user
(``guest_commands`` says how), and **answered** ones, the lines of e2b-desktop that start the desktop (Xvfb,
startxfce4), which run here until killed (``desktop_lines``). An answered process's pid is above Linux's largest
(``VIRTUAL_PID_BASE``), so it never names a guest process.

A stream of a process is a sequence of ``Event``: ``start`` first (its pid), then output (``stdout``/``stderr``
bytes as the command wrote them), ``keepalive`` while nothing happens (so a client that went away is noticed at the
next one and the following stops), and ``end`` with the exit status. Each follower reads from where the output was
last delivered; the guest's folder of a command is removed once it ended and nobody follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from osfleet.client import FleetError
from osfleet.client.fleet import AsyncSession
from osfleet.e2b import guest_commands as guest
from osfleet.e2b.guest_commands import Frame, GuestProtocolError

log = logging.getLogger(__name__)

VIRTUAL_PID_BASE = 1 << 22  # Linux's largest pid (pid_max's limit): answered processes' pids are above it
KEEPALIVE_SECONDS = 5.0  # an answered process's stream says it is alive this often
FOLLOW_GAP_MIN = 0.2  # seconds between a command's following steps while it prints
FOLLOW_GAP_MAX = 2.0  # and at most, while it is quiet (doubling from the least)
MAX_PROCESSES = 256  # processes one sandbox keeps in its table (running or not yet removed)
EVENT_BYTES = 64 * 1024  # output bytes in one event at most
EventKind = Literal["start", "stdout", "stderr", "keepalive", "end"]


class ProcessError(Exception):
    """A process could not be started or followed: the reason, for the client."""


@dataclass(frozen=True)
class Event:
    kind: EventKind
    pid: int = 0
    data: bytes = b""
    exit_code: int = 0


@dataclass
class Process:
    """One process of the sandbox: a guest command (``nonce`` names its folder) or an answered one (None)."""

    pid: int
    command: str
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    nonce: str | None
    exit_code: int | None = None
    delivered: tuple[int, int] = (0, 0)  # stdout and stderr bytes delivered to a follower so far
    followers: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.exit_code is None


@dataclass
class ProcessTable:
    """A sandbox's processes by pid."""

    processes: dict[int, Process] = field(default_factory=dict)
    _virtual: itertools.count[int] = field(default_factory=lambda: itertools.count(VIRTUAL_PID_BASE + 1))

    def add(self, process: Process) -> None:
        if len(self.processes) >= MAX_PROCESSES:
            done = [pid for pid, p in self.processes.items() if not p.running and p.followers == 0]
            for pid in done[: len(self.processes) - MAX_PROCESSES + 1]:
                del self.processes[pid]
        if len(self.processes) >= MAX_PROCESSES:
            raise ProcessError(f"this sandbox runs {MAX_PROCESSES} processes already")
        self.processes[process.pid] = process

    def virtual_pid(self) -> int:
        return next(self._virtual)

    def find(self, pid: int | None = None, tag: str | None = None) -> Process | None:
        """The running process of that pid (or tag)."""
        for process in self.processes.values():
            if process.running and ((pid is not None and process.pid == pid) or (tag and process.tag == tag)):
                return process
        return None

    def running(self) -> list[Process]:
        return [p for p in self.processes.values() if p.running]

    def clear(self) -> None:
        """Forget every process (the replica they ran on is gone): their streams end."""
        for process in self.processes.values():
            if process.running:
                process.exit_code = -1
            process.ended.set()
        self.processes.clear()


async def _step(session: AsyncSession, command: str, timeout: float) -> Frame:
    """One shell step as the desktop user, its answer read as a frame."""
    result = await session.step({"type": "cli_command", "command": command, "timeout": timeout}, observe=False)
    (outcome,) = result.results
    if not outcome.ok:
        raise ProcessError(f"the guest could not run the command: {outcome.error}")
    if outcome.exit_code == 97:
        raise ProcessError(f"the guest could not start the command: {(outcome.stderr or '').strip()[:300]}")
    try:
        return guest.parse_frame(outcome.stdout or "")
    except GuestProtocolError as exc:
        raise ProcessError(str(exc)) from None


def _output(frame: Frame) -> list[Event]:
    events = []
    for kind, data in (("stdout", frame.out), ("stderr", frame.err)):
        for i in range(0, len(data), EVENT_BYTES):
            events.append(Event(kind, data=data[i : i + EVENT_BYTES]))  # type: ignore[arg-type]
    return events


async def start_guest(
    session: AsyncSession,
    table: ProcessTable,
    command: str,
    envs: Mapping[str, str],
    cwd: str | None,
    tag: str | None,
) -> AsyncGenerator[Event, None]:
    """Start ``command`` in the guest and follow it to its end (or until the stream is closed)."""
    nonce = guest.new_nonce()
    try:
        frame = await _step(session, guest.launch_command(nonce, command, envs, cwd), guest.launch_timeout())
    except ValueError as exc:  # an environment the guest's shell cannot take
        raise ProcessError(str(exc)) from None
    if frame.pid is None:
        raise ProcessError(f"the command did not start within {guest.PID_WAIT:.0f} s")
    process = Process(frame.pid, command, dict(envs), cwd, tag, nonce)
    table.add(process)
    yield Event("start", pid=process.pid)
    async for event in _follow(session, table, process, first=frame):
        yield event


async def connect(session: AsyncSession, table: ProcessTable, process: Process) -> AsyncGenerator[Event, None]:
    """Follow a running process from what was delivered last."""
    yield Event("start", pid=process.pid)
    if process.nonce is None:
        async for event in _wait_answered(process):
            yield event
        return
    async for event in _follow(session, table, process):
        yield event


async def _follow(
    session: AsyncSession, table: ProcessTable, process: Process, first: Frame | None = None
) -> AsyncGenerator[Event, None]:
    assert process.nonce is not None
    process.followers += 1
    out, err = process.delivered
    gap = FOLLOW_GAP_MIN
    try:
        frame = first
        while True:
            if frame is None:
                frame = await _step(session, guest.follow_command(process.nonce, out, err), guest.follow_timeout())
            news = _output(frame)
            out, err = out + len(frame.out), err + len(frame.err)
            process.delivered = (max(process.delivered[0], out), max(process.delivered[1], err))
            for event in news:
                yield event
            if frame.exit_code is not None and out >= frame.out_size and err >= frame.err_size:
                process.exit_code = frame.exit_code
                process.ended.set()
                yield Event("end", exit_code=frame.exit_code)
                return
            if process.ended.is_set():  # the sandbox was paused or killed under it
                raise ProcessError("the sandbox's desktop went away while the command ran")
            if news:
                gap = FOLLOW_GAP_MIN
            else:
                yield Event("keepalive")
                await asyncio.sleep(gap)
                gap = min(gap * 2, FOLLOW_GAP_MAX)
            frame = None
    finally:
        process.followers -= 1
        if not process.running and process.followers == 0:
            await _remove(session, table, process)


async def _remove(session: AsyncSession, table: ProcessTable, process: Process) -> None:
    """Remove the ended command's folder from the guest, and the command from the table."""
    table.processes.pop(process.pid, None)
    if process.nonce is None:
        return
    with contextlib.suppress(FleetError, asyncio.CancelledError):
        step = {"type": "cli_command", "command": guest.remove_command(process.nonce), "timeout": 30.0}
        await session.step(step, observe=False)


def start_answered(table: ProcessTable, command: str, tag: str | None, lasts: float | None = None) -> Process:
    """An answered process that runs until killed (what Xvfb and startxfce4 would be), or ends with status 0 after
    ``lasts`` seconds (``sleep S``) whether or not anyone follows it: its start is answered at once, so a client
    that runs it in the background gets its pid and can signal it, as with the real one."""
    process = Process(table.virtual_pid(), command, {}, None, tag, None)
    table.add(process)
    if lasts is not None:
        asyncio.get_running_loop().call_later(lasts, _end_answered, table, process, 0)
    return process


def _end_answered(table: ProcessTable, process: Process, exit_code: int) -> None:
    if process.running:
        process.exit_code = exit_code
        process.ended.set()
        table.processes.pop(process.pid, None)


async def _wait_answered(process: Process) -> AsyncIterator[Event]:
    while not process.ended.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.ended.wait(), KEEPALIVE_SECONDS)
        if not process.ended.is_set():
            yield Event("keepalive")
    yield Event("end", exit_code=process.exit_code if process.exit_code is not None else -1)


async def follow_answered(process: Process) -> AsyncIterator[Event]:
    yield Event("start", pid=process.pid)
    async for event in _wait_answered(process):
        yield event


async def signal(session: AsyncSession, table: ProcessTable, process: Process, name: str) -> None:
    """Send TERM or KILL to the process (its whole process group, in the guest, as the desktop user)."""
    if process.nonce is None:
        process.exit_code = 128 + (9 if name == "KILL" else 15)
        process.ended.set()
        table.processes.pop(process.pid, None)
        return
    result = await session.step(
        {"type": "cli_command", "command": guest.signal_command(process.pid, name), "timeout": 30.0}, observe=False
    )
    (outcome,) = result.results
    if not outcome.ok or outcome.exit_code != 0:
        raise ProcessError(f"process {process.pid} is not running")
