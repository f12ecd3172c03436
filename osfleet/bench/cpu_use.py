"""Where a machine's CPU went over a measured window, by kind of process: QEMU (the guests), host agents, the
evaluation jail, the gateway, the load generator, libvirt, and everything else.

Not ``osfleet.measure.cpu`` (the exact time of a few known processes across one request): this is every process
of the machine across minutes, while processes come and go (a QEMU per reset, a jailed evaluation per episode).
A ``CpuUse`` samples ``/proc/<pid>/stat`` every ``SAMPLE_SECONDS`` on a thread of its own and adds up, per kind:

- each process's own CPU (utime + stime) from the first to the last sample that saw it (one born in the window
  counts from 0, so a process that lived a second and a half is counted up to its last sample);
- for kinds whose children are helpers of their own kind, too short-lived to be sampled (a host agent's
  ``qemu-img``, the jail zygote's forked evaluations, Locust's workers), the CPU of children they reaped
  (cutime + cstime); not for the others: PID 1 reaps every QEMU a reset ended, and that is QEMU's, counted already.

The machine's busy time over the window comes from ``/proc/stat``; ``unaccounted`` is what no sampled process
explains (the kernel's own threads, processes that lived less than a sample), ``other`` what processes of no kind
above used (on a shared machine: everyone else's work).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 0.5
# (kind, what its command line holds): the first match wins, so the jail comes before the host agent that runs it
KINDS = (
    ("qemu", ("qemu-system",)),
    ("evaluation_jail", ("osfleet.tasks.jail", "bwrap")),
    ("host_agents", ("osfleet host serve",)),
    ("gateway", ("osfleet fleet serve",)),
    ("load_generator", ("locust",)),
    ("libvirt", ("libvirtd", "virtlogd", "virtqemud")),
)
WITH_CHILDREN = frozenset({"evaluation_jail", "host_agents", "gateway", "load_generator"})
OTHER_COMMAND_CHARS = 100
OTHERS_LISTED = 8


Kinds = tuple[tuple[str, tuple[str, ...]], ...]


def kind_of(cmdline: str, kinds: Kinds = KINDS) -> str:
    """The kind of process a command line names (``other`` when none matches)."""
    cmdline = cmdline.replace("-m osfleet", "osfleet")  # "python -m osfleet host serve" as "osfleet host serve"
    for kind, needles in kinds:
        if any(n in cmdline for n in needles):
            return kind
    return "other"


@dataclass
class _Seen:
    kind: str
    command: str  # its command line, cut short: what ``others`` names
    first: float  # CPU seconds counted for it at its first sample (0 when it was born in the window)
    last: float


def _busy_seconds() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def _processes() -> dict[int, tuple[str, float, float, float]]:
    """pid -> (command line, start time in ticks since boot, its own CPU seconds, its reaped children's)."""
    out: dict[int, tuple[str, float, float, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone already
            continue
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        out[int(entry.name)] = (cmdline, float(fields[19]), (utime + stime) / TICK, (cutime + cstime) / TICK)
    return out


class CpuUse:
    """``with CpuUse() as use: ...`` then ``use.result()``: core-seconds by kind over the block."""

    def __init__(self, sample_seconds: float = SAMPLE_SECONDS, kinds: Kinds = KINDS) -> None:
        """``kinds``: (kind, what its command line holds) pairs, the first match winning."""
        self.sample_seconds = sample_seconds
        self.kinds = kinds
        self._seen: dict[tuple[int, float], _Seen] = {}  # (pid, start time): a reused pid is another process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-use", daemon=True)
        self._busy = (0.0, 0.0)
        self._wall = (0.0, 0.0)

    def __enter__(self) -> CpuUse:
        self._sample(first=True)
        self._busy = (_busy_seconds(), 0.0)
        self._wall = (time.monotonic(), 0.0)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self._busy = (self._busy[0], _busy_seconds())
        self._wall = (self._wall[0], time.monotonic())

    def _loop(self) -> None:
        while not self._stop.wait(self.sample_seconds):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        for pid, (cmdline, started, own, children) in _processes().items():
            key = (pid, started)
            seen = self._seen.get(key)
            if seen is None:
                kind = kind_of(cmdline, self.kinds)
                counted = own + (children if kind in WITH_CHILDREN else 0.0)
                self._seen[key] = _Seen(kind, cmdline[:OTHER_COMMAND_CHARS], counted if first else 0.0, counted)
            else:
                seen.last = own + (children if seen.kind in WITH_CHILDREN else 0.0)

    @property
    def seconds(self) -> float:
        return self._wall[1] - self._wall[0]

    def result(self) -> dict[str, float]:
        """Core-seconds per kind, ``all`` (the machine's busy time) and ``unaccounted``."""
        out: dict[str, float] = {kind: 0.0 for kind, _ in self.kinds} | {"other": 0.0}
        for seen in self._seen.values():
            out[seen.kind] += max(0.0, seen.last - seen.first)
        busy = self._busy[1] - self._busy[0]
        out = {k: round(v, 3) for k, v in out.items()}
        out["all"] = round(busy, 3)
        out["unaccounted"] = round(max(0.0, busy - sum(v for k, v in out.items() if k != "all")), 3)
        return out

    def others(self) -> list[tuple[str, float]]:
        """The processes of no kind that used the most CPU (command line, core-seconds): on a shared machine,
        whose work the measured window shared the CPU with."""
        by_command: dict[str, float] = {}
        for seen in self._seen.values():
            if seen.kind == "other" and seen.last > seen.first:
                by_command[seen.command] = by_command.get(seen.command, 0.0) + seen.last - seen.first
        top = sorted(by_command.items(), key=lambda item: -item[1])[:OTHERS_LISTED]
        return [(command.strip(), round(seconds, 2)) for command, seconds in top]
