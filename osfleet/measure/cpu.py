"""CPU time used by processes on this host, to the nanosecond: what a benchmark charges one request to.

``/proc/<pid>/stat`` counts in clock ticks (10 ms here), coarser than the work of one step, so it cannot tell a
3 ms step from a 9 ms one. The scheduler keeps an exact account per thread (``/proc/<pid>/task/<tid>/schedstat``,
first field: nanoseconds on a CPU); a process's time is the sum over its threads. A thread that ends between two
readings takes its time with it, so a difference across a thread's exit is too low: the processes measured here
(a host agent, QEMU, libvirtd) keep their threads for their lifetime.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

LIBVIRTD_PID_FILE = Path("/run/libvirtd.pid")


def process_cpu_ns(pid: int) -> int | None:
    """Nanoseconds all threads of ``pid`` have run on a CPU, or None when the process is gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split(maxsplit=1)[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total


def processes_cpu_ns(pids: Iterable[int]) -> int:
    """The sum of ``process_cpu_ns`` over ``pids`` (processes that are gone count 0)."""
    return sum(process_cpu_ns(pid) or 0 for pid in pids)


def libvirtd_pid() -> int | None:
    """The pid of this host's libvirtd (from its pid file), or None when it is not found or not running."""
    try:
        pid = int(LIBVIRTD_PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None
