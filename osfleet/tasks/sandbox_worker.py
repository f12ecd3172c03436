"""The other side of the evaluation sandbox (``osfleet.tasks.sandbox``): a warm zygote and its one-job children.

Started by the host agent as ``python -I -m osfleet.tasks.sandbox_worker FD`` with a clean environment, the
zygote moves into a network namespace of its own (when it may: root), imports every metric module and the
libraries they use once, and then only forks: the host sends it one end of a fresh socket pair per evaluation
(``SCM_RIGHTS`` on the control socket ``FD``) and it forks a child for it. Why this shape:
- importing openpyxl, python-docx and the metric modules costs seconds in a fresh interpreter; a fork of the
  warm zygote costs milliseconds, and each evaluation still gets a process of its own that nothing else shares;
- the zygote itself never touches what a guest wrote: only its children do, under limits set after the fork;
- the zygote outlives each child and knows how it ended (exit code or signal), which it writes on the job's
  socket after the child's own reply, so the host can say "killed by its CPU limit" instead of "no answer".

A child: says its pid, reads the job (a pickle from the host, which is trusted), sets its limits (address space,
CPU seconds, an alarm for wall time, file size, open files, no core dumps), runs the metric, and writes one
JSON line: ``{"score", "detail"}`` or ``{"error"}``. Whatever the metric raises becomes that error line; what
it cannot raise (a crash, a limit's signal) the zygote reports.

The zygote exits when the host closes the control socket, killing its children first; a child dies with the
zygote (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import math
import os
import pickle
import resource
import selectors
import signal
import socket
import struct
import sys
import warnings
from typing import Any

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# Modules imported once in the zygote so that no child pays for them. The metric registry must import (a zygote
# without it would score everything 0: it does not start instead); the libraries not installed are skipped.
REGISTRY = "osfleet.tasks.evaluators"
PRELOAD = ("openpyxl", "docx", "pptx", "yaml", "lxml.etree", "pandas", "numpy")
REQUEST_MAX_BYTES = 256 * 2**20  # a job (what getters fetched) is at most a few 8 MiB files and outputs
DETAIL_MAX_CHARS = 500


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _isolate_network() -> bool:
    """A network namespace with nothing in it (not even loopback up): metrics reach no one. Needs root."""
    return _libc().unshare(CLONE_NEWNET) == 0


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _preload() -> list[str]:
    warnings.simplefilter("ignore")
    importlib.import_module(REGISTRY)
    loaded = [REGISTRY]
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    import gc

    gc.collect()
    gc.freeze()  # children share these pages; a collection in a child would otherwise touch (copy) them all
    return loaded


def _send_line(sock: socket.socket, data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the host stopped waiting (its deadline passed): nothing left to tell
        sock.sendall(json.dumps(data).encode() + b"\n")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the host closed the job")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _limit(kind: int, value: int) -> None:
    soft, hard = resource.getrlimit(kind)
    cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (cap, cap))


def _apply_limits(limits: dict[str, Any]) -> None:
    _limit(resource.RLIMIT_AS, _vm_size() + int(limits["memory_bytes"]))
    cpu = int(limits["cpu_seconds"])
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later
    _limit(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _limit(resource.RLIMIT_CORE, 0)  # a core dump would be a copy of a tenant's files on the host's disk
    signal.alarm(max(1, math.ceil(float(limits["wall_seconds"]))))  # default action: the child ends


def _score(value: Any) -> float:
    """A metric's score as a float: any finite number (OSWorld's ``run_sqlite3`` returns its query's number)."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the metric returned {type(value).__name__} {str(value)[:40]}, not a score")
    return float(value)


def _run(job: dict[str, Any]) -> dict[str, Any]:
    from osfleet.tasks.evaluators import METRICS

    func = job["func"]
    try:
        metric = METRICS[func]
        out = metric(job["result"], job["expected"], job["options"])
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError(f"the metric returned {type(out).__name__}, not (score, reason)")
        return {"score": _score(out[0]), "detail": str(out[1])[:DETAIL_MAX_CHARS]}
    except MemoryError:
        return {"error": "MemoryError: the metric ran out of its memory limit"}
    except RecursionError:
        return {"error": "RecursionError: the file nests too deeply"}
    except BaseException as exc:  # noqa: BLE001 - anything a metric raises on a guest's file is a 0, with its name
        text = f"{type(exc).__name__}: {exc}"
        return {"error": text[:DETAIL_MAX_CHARS]}


def _child(conn: socket.socket) -> None:
    """One evaluation, in a process of its own; never returns."""
    code = 0
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setpgid(0, 0)  # the zygote ends the whole group (anything the metric started) with it
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _send_line(conn, {"pid": os.getpid()})
        (size,) = struct.unpack("!Q", _recv_exact(conn, 8))
        if size > REQUEST_MAX_BYTES:
            raise ValueError(f"job of {size} bytes")
        job = pickle.loads(_recv_exact(conn, size))  # from the host agent, which is trusted
        tmp = job.get("tmpdir")
        if tmp:
            os.chdir(tmp)
            os.environ["TMPDIR"] = os.environ["HOME"] = tmp
            import tempfile

            tempfile.tempdir = tmp
        _apply_limits(job["limits"])
        reply = _run(job)
        _send_line(conn, reply)
    except BaseException:  # noqa: BLE001 - the zygote reports how this process ended
        code = 70
    finally:
        os._exit(code)


class Zygote:
    """Forks a child per job socket received on ``control``; reports each child's end on its socket."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.jobs: dict[int, socket.socket] = {}  # child pid -> its job socket
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD reaches the wake-up pipe
        self.sel.register(self.control, selectors.EVENT_READ, "control")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "control":
                    if not self._accept():
                        self._stop()
                        return
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    self._reap()

    def _accept(self) -> bool:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.control, 16, 4)
        except InterruptedError:
            return True
        if not msg:
            return False
        for fd in fds:
            conn = socket.socket(fileno=fd)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                self.sel.close()
                for other in (self.control, *self.jobs.values()):
                    other.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                _child(conn)
            self.jobs[pid] = conn
        return True

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.jobs.pop(pid, None)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # whatever the metric started dies with it
            if conn is None:
                continue
            end: dict[str, Any] = {"exit": None, "signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {}
            end = end or {"exit": os.WEXITSTATUS(status), "signal": None}
            end |= {"peak_rss_kib": usage.ru_maxrss, "cpu_seconds": usage.ru_utime + usage.ru_stime}
            _send_line(conn, end)
            conn.close()

    def _stop(self) -> None:
        for pid in list(self.jobs):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(self.jobs):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[1]))
    isolated = _isolate_network()
    try:
        loaded = _preload()
    except Exception as exc:  # noqa: BLE001 - the host says why the sandbox did not start
        _send_line(control, {"ready": False, "error": f"importing the metrics failed: {type(exc).__name__}: {exc}"})
        return 1
    _send_line(control, {"ready": True, "network_isolated": isolated, "preloaded": loaded, "vm_size": _vm_size()})
    Zygote(control).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
