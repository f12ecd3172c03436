"""Scoring what a guest wrote as untrusted input: every metric runs in a process of its own, under limits.

A file from the guest can be built to hurt whoever parses it: a 4.8 KB workbook with a value in XFD1048576
makes openpyxl walk 17 billion cells, a docx ``gridSpan`` of 2^31 makes python-docx build a list that long, a
zip bomb or a YAML alias bomb expands to gigabytes, malformed XML or a deep nesting raises errors nobody
listed. None of that may reach the host agent, which serves every other tenant's episodes. So a metric never
runs in the host agent's process: ``Sandbox.run`` hands it to a child of a warm zygote
(``osfleet.tasks.jail.zygote``), which runs it with

- an address-space limit (``RLIMIT_AS``: ``memory_bytes`` above the warm worker's own), CPU seconds
  (``RLIMIT_CPU``), a wall-time alarm, a file-size limit for anything it writes, an open-file limit and no
  core dumps;
- the evaluation jail (``osfleet.tasks.jail.bubblewrap``): the zygote runs under bubblewrap as an unprivileged user of
  its own, in new user, mount, PID, IPC, UTS and network namespaces, seeing only a read-only Python and its
  libraries, the spool of evaluation folders and nothing else of the host (no token, no ``$OSFLEET_HOME``, no
  UNIX socket, no network), under a seccomp filter and ``no_new_privs``;
- nothing shared with other evaluations: each one is PID 1 of a PID namespace of its own with its own mount,
  network and IPC namespaces, sees only its own folder (read-only, ``/eval``) and writes only into a tmpfs of its
  own (``/tmp`` and ``/dev/shm``), runs its metric without capabilities under a stricter seccomp filter, and ends
  with everything it started;
- bounds on the evaluation as a whole: a cgroup of its own (``osfleet.tasks.jail.cgroups``) holds its memory (its
  tmpfs files included) and its number of processes, where the host has cgroups to give; ``RLIMIT_NPROC`` bounds
  the processes of every evaluation together in any case.

Whatever happens inside (a parse error, ``zlib.error``, ``BadZipFile``, an encrypted zip, ``RecursionError``,
``MemoryError``, a limit's signal, a crash, a kill) the evaluation scores 0 with the reason in its detail: the
agent did not produce a file that can be scored; a system call the jail forbids ends the metric with
``SIGSYS`` and scores 0 "denied by the evaluation jail". Only the sandbox itself failing (it cannot start, its
zygote died) is an infrastructure failure (``SandboxError``: 503), like failing to reach the guest.

Why a zygote and not a fresh interpreter per evaluation: importing the metric modules with openpyxl and
python-docx took 2.6-3.9 s here (2 cores), a fork of the warm zygote ~16 ms (README, "Security model").
Why a cgroup as well as the limits in the child: ``RLIMIT_AS`` needs no privileges and works the same everywhere,
but it is per process (six children of one evaluation held six times its memory), and ``RLIMIT_NPROC`` is per
user, one pool for every evaluation of the jail. The cgroup needs a root host agent (or a delegated cgroup), so
the per-process limits stay: without a cgroup the sandbox says so in ``info["cgroup"]`` and its memory is bounded
by ``max_jobs`` children at once, each process under ``RLIMIT_AS``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.tasks import rewards
from osfleet.tasks.jail import seccomp as jail_seccomp
from osfleet.tasks.jail.bubblewrap import Jail, JailError, stage
from osfleet.tasks.jail.cgroups import Bounds, Group, Groups, Usage

log = logging.getLogger(__name__)

Score = tuple[float, str]

METRIC_MEMORY_BYTES = 768 * 2**20
METRIC_CPU_SECONDS = 30
METRIC_WALL_SECONDS = 45.0
METRIC_FILE_BYTES = 64 * 2**20
METRIC_OPEN_FILES = 256
# Processes and threads of one evaluation (its cgroup's pids.max); a test suite is two processes, a metric one.
METRIC_PROCESSES = 128
ZYGOTE_TASKS = 8  # the zygote and bubblewrap, counted with the evaluations in the jail user's RLIMIT_NPROC
# Children at once: one per core, 2 to 8 (the sandbox's memory is at most this many times METRIC_MEMORY_BYTES);
# more evaluations wait for a slot, within their wall time.
MAX_JOBS = min(8, max(2, os.cpu_count() or 2))
START_SECONDS = 60.0  # the zygote imports every metric module before it is ready
REPLY_MAX_BYTES = 64 * 1024  # a child's answer; more is refused (the metric's reason is clipped to 500 chars)
KILL_GRACE_SECONDS = 5.0  # after a kill, how long to wait for the zygote to say how a child ended
RECENT_JOBS = 64  # evaluations whose peak memory and CPU time are kept (``Sandbox.recent``)


class SandboxError(OsfleetError):
    """The evaluation sandbox could not run a metric (it cannot start, or its zygote died): infrastructure."""


@dataclass(frozen=True)
class Limits:
    """What one metric evaluation may use; the defaults are the README's "Security model" numbers."""

    memory_bytes: int = METRIC_MEMORY_BYTES
    cpu_seconds: int = METRIC_CPU_SECONDS
    wall_seconds: float = METRIC_WALL_SECONDS
    file_bytes: int = METRIC_FILE_BYTES
    open_files: int = METRIC_OPEN_FILES
    processes: int = METRIC_PROCESSES

    def bounds(self) -> Bounds:
        """The evaluation's cgroup: its processes' memory and its tmpfs (``/tmp``, ``/dev/shm``) in one bound."""
        return Bounds(self.memory_bytes + self.file_bytes, self.processes)


SIGNALS = {
    signal.SIGXCPU: "its CPU-time limit",
    signal.SIGALRM: "its wall-time limit",
    signal.SIGXFSZ: "its file-size limit",
    signal.SIGSEGV: "a crash (SIGSEGV)",
    signal.SIGABRT: "an abort (SIGABRT)",
    signal.SIGBUS: "a crash (SIGBUS)",
    signal.SIGSYS: jail_seccomp.KILLED_BY,
}


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class JobStats:
    """One evaluation as the kernel counted it (from the zygote's ``wait4``): what its limits were up against."""

    func: str
    seconds: float
    peak_rss_bytes: int | None
    cpu_seconds: float | None
    score: float
    detail: str


class Sandbox:
    """A zygote process and the children it forks, one per evaluation. Thread-safe; start it once per host
    agent (``default()``) and ``close()`` it on the way out."""

    def __init__(self, limits: Limits | None = None, max_jobs: int = MAX_JOBS) -> None:
        self.limits = limits or Limits()
        self.max_jobs = max_jobs
        self._slots = threading.BoundedSemaphore(max_jobs)
        self._groups: Groups | None = None  # made with the jail (None where the host has no cgroup to give)
        self._cgroup = ""  # where the evaluations' cgroups are, or why there are none
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._jail: Jail | None = None
        self._zygote_pid: int | None = None  # its pid on the host (bwrap's info: it is PID 1 of the jail)
        self.info: dict[str, Any] = {}
        self._starter: threading.Thread | None = None
        self.recent: collections.deque[JobStats] = collections.deque(maxlen=RECENT_JOBS)

    # --- the zygote ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the zygote (if it is not running) and wait until it has imported every metric module."""
        with self._lock:
            self._ensure_locked()

    def start_soon(self) -> None:
        """Start the zygote in the background, so that the first evaluation does not wait for its imports."""
        with self._lock:
            if self._alive_locked() or (self._starter is not None and self._starter.is_alive()):
                return
            self._starter = threading.Thread(target=self._start_quietly, name="osfleet-sandbox-start", daemon=True)
            self._starter.start()

    def _start_quietly(self) -> None:
        try:
            self.start()
        except SandboxError as exc:
            log.warning("%s", exc)

    def _alive_locked(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._control is not None

    def _ensure_locked(self) -> socket.socket:
        if self._alive_locked():
            assert self._control is not None
            return self._control
        self._stop_locked()
        try:
            if self._jail is None:
                self._jail = Jail()
                self._groups, where = Groups.for_sandbox()
                self._cgroup = where
                if self._groups is None:
                    log.warning("evaluation jail: no cgroup per evaluation (%s): RLIMIT_NPROC bounds them", where)
            jail = self._jail
        except (JailError, OSError) as exc:
            raise SandboxError(f"cannot set up the evaluation jail: {exc}") from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        seccomp = -1
        err = open(jail.base / "stderr", "w+b")  # noqa: SIM115 - bwrap's complaints, for the error (closed below)
        try:
            seccomp = jail_seccomp.bpf_fd(evaluation=False)
            inner = [sys.executable, "-I", "-m", "osfleet.tasks.jail.zygote", str(theirs.fileno())]
            argv, _ = jail.command(inner, seccomp, info_w)
            proc = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(), seccomp, info_w),
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # a Ctrl-C meant for the host agent does not reach it first
            )
        except OSError as exc:
            ours.close()
            err.close()
            raise SandboxError(f"cannot start the evaluation sandbox: {exc}") from None
        finally:
            theirs.close()
            os.close(info_w)
            if seccomp >= 0:
                os.close(seccomp)
        try:
            zygote = _read_info(info_r, START_SECONDS)
            ours.settimeout(START_SECONDS)
            info = json.loads(ours.recv(REPLY_MAX_BYTES) or b"{}")
        except (OSError, ValueError) as exc:
            info = {"error": str(exc)}
            zygote = None
        finally:
            os.close(info_r)
        if not info.get("ready") or zygote is None:
            proc.kill()
            proc.wait()
            ours.close()
            err.seek(0)
            said = err.read()[-400:].decode(errors="replace").strip()
            err.close()
            why = info.get("error") or said or "it exited"
            raise SandboxError(f"the evaluation sandbox did not start: {why}")
        err.close()
        ours.settimeout(None)
        self._proc, self._control, self._zygote_pid = proc, ours, zygote
        self.info = {**info, "jail_user": jail.who.name, "jail_uid": jail.who.uid, "cgroup": self._cgroup}
        if not jail.who.switch:
            log.warning("evaluation jail: the host agent is not root: the jail runs as its user %s", jail.who.name)
        return ours

    def _stop_locked(self) -> None:
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.close()  # the zygote kills its children and exits when it reads EOF
            self._control = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
            self._zygote_pid = None

    def close(self) -> None:
        with self._lock:
            self._stop_locked()
            if self._jail is not None:
                self._jail.close()
                self._jail = None
            if self._groups is not None:
                self._groups.close()
                self._groups = None

    def pid(self) -> int | None:
        """The zygote's pid on the host while it runs (tests, and ``ps`` readers)."""
        with self._lock:
            return self._zygote_pid if self._alive_locked() else None

    def _kill_job(self, pid: int) -> None:
        """Ask the zygote to end an evaluation (``pid`` is the zygote's name for it, not the host's)."""
        with self._lock, contextlib.suppress(OSError):
            if self._alive_locked() and self._control is not None:
                self._control.send(b"k" + struct.pack("!Q", pid))

    # --- one evaluation ------------------------------------------------------------------------------------
    def run(self, func: str, result: Any, expected: Any, options: dict[str, Any], wall: float | None = None) -> Score:
        """Score ``func`` on the getters' values in a child process; 0 with the reason for anything that goes
        wrong inside it. ``wall``: at most this many seconds (the evaluation's time left), waiting for a slot
        included. Raises ``SandboxError`` only when the sandbox itself fails."""
        wall = min(wall if wall is not None else self.limits.wall_seconds, self.limits.wall_seconds)
        start = time.monotonic()
        end = start + wall
        if not self._slots.acquire(timeout=max(wall, 0.0)):
            raise SandboxError(f"every evaluation worker stayed busy for {wall:.0f} s")
        try:
            score, status = self._run(func, result, expected, options, end)
        finally:
            self._slots.release()
        status = status or {}
        rss = status.get("peak_rss_kib")
        cpu = status.get("cpu_seconds")
        stats = JobStats(
            func,
            time.monotonic() - start,
            int(rss) * 1024 if isinstance(rss, int) else None,
            float(cpu) if isinstance(cpu, int | float) else None,
            *score,
        )
        self.recent.append(stats)
        log.debug("evaluation sandbox: %s", stats)
        return score

    def _open_job(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for attempt in (1, 2):  # a zygote that died since the last evaluation is started again, once
                with self._lock:
                    control = self._ensure_locked()
                    try:
                        socket.send_fds(control, [b"j"], [theirs.fileno()])
                        return ours
                    except OSError as exc:
                        self._stop_locked()
                        if attempt == 2:
                            raise SandboxError(f"the evaluation sandbox does not take jobs: {exc}") from None
            raise AssertionError("unreachable")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def _run(
        self, func: str, result: Any, expected: Any, options: dict[str, Any], end: float
    ) -> tuple[Score, dict[str, Any] | None]:
        """The score, and the zygote's word on how the evaluation ended (None when it never came)."""
        conn = self._open_job()  # (starts the jail, whose spool the files go to)
        assert self._jail is not None
        try:
            folder = self._jail.folder()
        except OSError as exc:
            conn.close()
            raise SandboxError(f"cannot make an evaluation folder in the jail's spool: {exc}") from None
        try:
            with conn:
                return self._evaluate(conn, func, result, expected, options, end, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _evaluate(
        self,
        conn: socket.socket,
        func: str,
        result: Any,
        expected: Any,
        options: dict[str, Any],
        end: float,
        folder: Path,
    ) -> tuple[Score, dict[str, Any] | None]:
        wall = max(end - time.monotonic(), 1.0)
        try:
            result, expected = stage((result, expected), folder)
        except OSError as exc:
            raise SandboxError(f"cannot copy the getters' files into the jail's spool: {exc}") from None
        jail_processes = self.limits.processes * self.max_jobs + ZYGOTE_TASKS
        job = pickle.dumps(
            {
                "func": func,
                "result": result,
                "expected": expected,
                "options": options,
                "limits": {**asdict(self.limits), "wall_seconds": wall, "jail_processes": jail_processes},
                "folder": folder.name,
            }
        )
        try:
            conn.settimeout(max(end - time.monotonic(), 0.1))
            first = json.loads(_read_line(conn, REPLY_MAX_BYTES) or "{}")
            if "jail_error" in first:
                raise SandboxError(f"the evaluation jail could not be set up: {first['jail_error']}")
            pid = int(first["pid"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"the evaluation sandbox did not take the job: {exc}") from None
        group = self._bound(pid)  # before the job is sent: nothing of the guest's runs outside its cgroup
        try:
            with contextlib.suppress(OSError):  # the child is gone already: the zygote says how it ended
                conn.sendall(struct.pack("!Q", len(job)) + job)
            reply, status = self._answers(conn, end)
            if reply is not None and "jail_error" in reply:
                raise SandboxError(f"the evaluation jail could not be set up: {reply['jail_error']}")
            if reply is None and status is None:  # its wall time is up: the zygote kills it (PID 1 ignores alarms)
                self._kill_job(pid)
                with contextlib.suppress(OSError, SandboxError):  # the zygote reaps it
                    _, status = self._answers(conn, time.monotonic() + KILL_GRACE_SECONDS)
                return (0.0, f"{func}: the metric hit its wall-time limit of {wall:.0f} s (killed)"), status
            usage = group.usage() if group is not None else None
            return _verdict(func, reply, status, self.limits, wall, usage), status
        finally:
            if group is not None and self._groups is not None:
                self._groups.release(group)

    def _bound(self, pid: int) -> Group | None:
        """The evaluation ``pid`` (the zygote's name for it) moved into a new cgroup of its own, where the host
        has cgroups (else None). An evaluation that cannot be bounded does not run: ``SandboxError``."""
        groups, zygote = self._groups, self._zygote_pid
        if groups is None:
            return None
        try:
            host_pid = _host_pid(zygote, pid) if zygote is not None else None
            if host_pid is None:
                raise OSError(f"evaluation {pid} is not among the zygote's children")
            group = groups.evaluation(self.limits.bounds())
        except OSError as exc:
            self._kill_job(pid)
            raise SandboxError(f"cannot bound the evaluation with a cgroup: {exc}") from None
        try:
            group.add(host_pid)
        except ProcessLookupError:  # it ended already: the zygote says how
            pass
        except OSError as exc:
            self._kill_job(pid)
            groups.release(group)
            raise SandboxError(f"cannot move the evaluation into its cgroup: {exc}") from None
        return group

    def _answers(self, conn: socket.socket, end: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The child's reply (if it gave one) and the zygote's word on how it ended, until ``end``."""
        reply: dict[str, Any] | None = None
        buf = b""
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return reply, None
            conn.settimeout(left)
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                return reply, None
            except OSError:  # reset: the zygote died with bytes of ours unread (the job): as its end of file
                chunk = b""
            if not chunk:
                if reply is None:
                    raise SandboxError("the evaluation sandbox went away during an evaluation")
                return reply, None  # the zygote died after the child answered: the answer stands
            buf += chunk
            if len(buf) > REPLY_MAX_BYTES:
                return {"error": f"the metric's answer was over {REPLY_MAX_BYTES} bytes"}, None
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    data = json.loads(line)
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    data = {"error": "the metric's process answered something unreadable"}
                if "exit" in data:
                    return reply, data
                reply = data


def _read_info(fd: int, seconds: float) -> int | None:
    """The zygote's host pid from bubblewrap's ``--info-fd`` (one JSON object, then end of file)."""
    end = time.monotonic() + seconds
    buf = b""
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(end - time.monotonic(), 0))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        with contextlib.suppress(ValueError):
            pid = json.loads(buf).get("child-pid")
            return pid if isinstance(pid, int) else None
    return None


def _host_pid(zygote: int, pid: int) -> int | None:
    """The host's pid of the zygote's child ``pid`` (its pid in the zygote's namespace): the child whose
    ``NSpid`` line says so (the last number is 1: it is its own namespace's PID 1)."""
    try:
        with open(f"/proc/{zygote}/task/{zygote}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return None
    for child in children:
        try:
            with open(f"/proc/{child}/status") as f:
                line = next((x for x in f if x.startswith("NSpid:")), "")
        except OSError:
            continue
        ids = line.split()[1:]
        if len(ids) >= 2 and ids[-2] == str(pid):
            return child
    return None


def _read_line(sock: socket.socket, limit: int) -> str:
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise ValueError(f"a line over {limit} bytes")
    return buf.decode(errors="replace").strip()


def _verdict(
    func: str,
    reply: dict[str, Any] | None,
    status: dict[str, Any] | None,
    limits: Limits,
    wall: float,
    usage: Usage | None = None,
) -> Score:
    """The child's answer, or why it has none, as a score in [0, 1] and a reason; a 0 says what the evaluation's
    cgroup counted against its bounds (a process the kernel ended for memory, forks refused)."""
    score, detail = _answer(func, reply, status, limits, wall)
    notes = []
    if score == 0.0 and usage is not None:
        bounds = limits.bounds()
        if usage.oom_kills:
            notes.append(
                f" (the evaluation reached its memory bound of {_mib(bounds.memory_bytes)}: the kernel ended "
                f"{usage.oom_kills} of its processes)"
            )
        if usage.refused_forks:
            refused = usage.refused_forks
            notes.append(f" (the evaluation reached its bound of {bounds.tasks} processes: {refused} refused)")
    said = "".join(notes)
    return score, detail[: 500 - len(said)] + said  # the bounds it reached are said whatever the metric said


def _answer(
    func: str, reply: dict[str, Any] | None, status: dict[str, Any] | None, limits: Limits, wall: float
) -> Score:
    if reply is not None and "score" in reply:
        score, why = rewards.value(f"{func}", reply["score"])
        return score, why or str(reply.get("detail", ""))[:500]
    if reply is not None and "error" in reply:
        error = str(reply["error"])[:500]
        if error.startswith("MemoryError"):
            return 0.0, f"{func}: the file needs more than the {_mib(limits.memory_bytes)} a metric may use ({error})"
        return 0.0, f"{func}: cannot compare ({error})"
    sig = (status or {}).get("signal")
    if isinstance(sig, int):
        try:
            name = signal.Signals(sig)
        except ValueError:
            return 0.0, f"{func}: the metric's process ended by signal {sig}"
        cpu = (status or {}).get("cpu_seconds")
        if name == signal.SIGXCPU or (
            name == signal.SIGKILL and isinstance(cpu, int | float) and cpu >= 0.75 * limits.cpu_seconds
        ):  # an evaluation is its namespace's PID 1: its CPU limit ends it with SIGKILL (rusage is sampled)
            return 0.0, f"{func}: the metric hit its CPU-time limit of {limits.cpu_seconds} s"
        if name == signal.SIGALRM:
            return 0.0, f"{func}: the metric hit its wall-time limit of {wall:.0f} s"
        why = SIGNALS.get(name, f"{name.name} (the kernel's OOM killer, or an operator)")
        return 0.0, f"{func}: the metric's process was ended by {why}"
    code = (status or {}).get("exit")
    if code is not None:
        return 0.0, f"{func}: the metric's process exited ({code}) without an answer (likely its memory limit)"
    return 0.0, f"{func}: the metric's process ended without an answer"


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default() -> Sandbox:
    """This process's sandbox, made on first use and closed when the process exits."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
            atexit.register(_default.close)
        return _default
