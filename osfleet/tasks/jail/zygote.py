"""The other side of the evaluation sandbox (``osfleet.tasks.jail.sandbox``): a warm zygote in the evaluation jail
(``osfleet.tasks.jail.bubblewrap``), and one namespace set per evaluation.

Started by the host agent, through bubblewrap, as ``python -I -m osfleet.tasks.jail.zygote FD``: the zygote
imports every metric module and the libraries they use once, and then only forks: the host sends it one end of
a fresh socket pair per evaluation (``SCM_RIGHTS`` on the control socket ``FD``, a ``SOCK_SEQPACKET``) and it
forks the evaluation for it. Why this shape:
- importing openpyxl, python-docx and the metric modules costs seconds in a fresh interpreter; a fork of the
  warm zygote costs milliseconds, and each evaluation still gets processes of its own that nothing else shares;
- the zygote itself never touches what a guest wrote: only its evaluations do;
- the zygote outlives each evaluation and knows how it ended (exit code or signal), which it writes on the
  job's socket after the metric's own reply, so the host can say "killed by its CPU limit" instead of "no
  answer".

One evaluation is one process, forked as PID 1 of a new PID namespace (the zygote ``unshare``s
``CLONE_NEWPID`` before the fork and goes back to its own with ``setns`` after it). It makes new mount, network
and IPC namespaces, binds its own folder of the spool read-only at ``/eval``, hides the rest of the spool, mounts
a tmpfs of its own (at most ``file_bytes``) as its ``/tmp`` and ``/dev/shm``, a ``devpts`` of its own and a
``/proc`` that shows only its namespace, drops every capability, loads the evaluation seccomp filter
(``seccomp``), sets its limits (address space, CPU seconds, file size, open files, the jail's processes, no core
dumps) and runs the metric in ``/eval``, writing one JSON line: ``{"score",
"detail"}`` or ``{"error"}``. Whatever the metric raises becomes that error line; what it cannot raise (a
crash, a limit, a denied system call) the zygote reports. When it ends, the kernel kills every process left in
its namespace: nothing an evaluation starts outlives it (``setsid()`` and double forks included).

Being a namespace's PID 1 changes how limits end it: the kernel ignores signals with a default action for such a
process unless they can only kill (``SIGKILL``) or come from a fault (``SIGSEGV``, ``SIGSYS``), so its CPU limit
is a hard one (``SIGKILL`` at the limit, recognised by its CPU time) and its wall time is enforced from outside
(the host asks the zygote to ``SIGKILL`` it). A file-size limit fails the write (``EFBIG``) instead of signalling.

Control messages: ``j`` with a job socket (fork an evaluation for it; the zygote answers ``{"pid"}`` on it), and
``k`` + 8 bytes of pid (kill that evaluation: the host gave up waiting). The zygote exits when the host closes
the control socket, killing its evaluations first; it dies with bubblewrap, and bubblewrap with the host agent.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import pickle
import re
import resource
import selectors
import signal
import socket
import struct
import sys
import warnings
from pathlib import PurePosixPath
from typing import Any

from osfleet.tasks.jail import bubblewrap
from osfleet.tasks.jail import seccomp as jail_seccomp

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
PR_CAPBSET_DROP, PR_SET_SECUREBITS = 24, 28
SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE = 1, 4, 32, 64
CAPABILITY_VERSION_3 = 0x20080522
JOBS, EVAL = "/jobs", "/eval"  # bubblewrap's
# The jail's read-only Python paths that a private /tmp would hide (a venv in a clone under /tmp), found once in
# the zygote, before any evaluation forks.
_PYTHON_UNDER_TMP = [p for p in bubblewrap.python_paths() if PurePosixPath(p).is_relative_to("/tmp")]
# Modules imported once in the zygote so that no child pays for them. The metric registry must import (a zygote
# without it would score everything 0: it does not start instead); the libraries not installed are skipped.
REGISTRY = "osfleet.tasks.osworld_format.metrics"
PRELOAD = ("openpyxl", "docx", "pptx", "yaml", "lxml.etree", "pandas", "numpy")
REQUEST_MAX_BYTES = 256 * 2**20  # a job (what getters fetched) is at most a few 8 MiB files and outputs
DETAIL_MAX_CHARS = 500
SCRATCH_INODES = 16384  # files in an evaluation's /tmp and /dev/shm together (each costs kernel memory)
FOLDER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return _LIBC


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


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
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))  # SIGKILL at the limit (a PID 1 ignores SIGXCPU)
    _limit(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _limit(resource.RLIMIT_CORE, 0)  # a core dump would be a copy of a tenant's files
    # Processes of the jail's user, every evaluation's together (the kernel counts per user of the namespace): a
    # bound for the whole jail; the evaluation's own is its cgroup's (osfleet.tasks.jail.cgroups).
    _limit(resource.RLIMIT_NPROC, int(limits["jail_processes"]))


def _score(value: Any) -> float:
    """A metric's value as a float, whatever number it is: the host judges it (``osfleet.tasks.rewards``), so a
    value out of [0, 1] scores 0 there with the value named."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float):
        raise ValueError(f"the metric returned {type(value).__name__} {str(value)[:40]}, not a score")
    return float(value)  # (an int too large for a float raises OverflowError: an error line)


def _run(job: dict[str, Any]) -> dict[str, Any]:
    from osfleet.tasks.osworld_format.metrics import METRICS

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


# --- one evaluation ---------------------------------------------------------------------------------------------
def _drop_capabilities() -> None:
    """No capability left, and none to come back: the zygote's CAP_SYS_ADMIN and CAP_SETPCAP (in its own user
    namespace, where it is uid 0) are for making namespaces. The metric empties its bounding set and locks the
    secure bits that stop uid 0 from regaining capabilities at ``execve`` (a test suite's own interpreter), then
    clears every set; ``no_new_privs`` (bwrap's) already makes set-uid bits and file capabilities inert."""
    libc = _libc()
    bits = SECBIT_NOROOT | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_CAP_AMBIENT_RAISE
    _check(libc.prctl(PR_SET_SECUREBITS, bits | bits << 1 | SECBIT_KEEP_CAPS_LOCKED, 0, 0, 0), "secure bits")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} from the bounding set")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    held = [k for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if int(status[k], 16)]
    if held or status["NoNewPrivs"].strip() != "1":
        raise OSError(f"the metric's process kept capabilities ({', '.join(held)}) or may gain some")


def _numba_cache(func: str) -> None:
    """A metric that uses numba (librosa's) gets a private, writable copy of the host-made cache in its ``/tmp``:
    numba refuses a cache folder it cannot write, and the shared one must stay read-only (``numba_cache``)."""
    from osfleet.tasks.osworld_format.metrics import NEEDS

    shared = os.environ.get("NUMBA_CACHE_DIR")
    if shared and "librosa" in NEEDS.get(func, ()) and os.path.isdir(shared):
        import shutil

        shutil.copytree(shared, "/tmp/numba-cache")
        os.environ["NUMBA_CACHE_DIR"] = "/tmp/numba-cache"


def _isolate(folder: str, file_bytes: int) -> None:
    """This evaluation's namespaces and mounts (it is PID 1 of its own PID namespace already).

    What it may write is one tmpfs of its own, at most ``file_bytes`` and ``SCRATCH_INODES`` files, shown as its
    ``/tmp`` and its ``/dev/shm`` (so both count in one budget, and in its cgroup's memory: tmpfs lives in RAM),
    and a ``devpts`` of its own (its pseudo-terminals, no one else's). The zygote's ``/dev`` is read-only, its
    root too: the kernel frees all of it with the evaluation's mount namespace, and nothing an evaluation writes is
    there for the next one. POSIX message queues, System V IPC and abstract UNIX sockets belong to the evaluation's
    own IPC and network namespaces, which end with it as well."""
    _check(_libc().unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(f"{JOBS}/{folder}", EVAL, None, MS_BIND)
    _mount(None, EVAL, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # The Python the metric runs on may live under /tmp (a checkout in /tmp): held open across the private /tmp
    # and bound back read-only at its own path, or the metric's own interpreter would be gone.
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in _PYTHON_UNDER_TMP]
    # Its scratch, made on the spool's mount point (which it hides), then shown at /tmp and /dev/shm.
    size = f"size={max(file_bytes, 1 << 20)},nr_inodes={SCRATCH_INODES},mode=0755"
    _mount("tmpfs", JOBS, "tmpfs", MS_NOSUID | MS_NODEV, size)
    for name, target in (("tmp", "/tmp"), ("shm", "/dev/shm")):
        os.mkdir(f"{JOBS}/{name}", 0o700)
        _mount(f"{JOBS}/{name}", target, None, MS_BIND)
    _mount("tmpfs", JOBS, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0")  # covered
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    for path, fd in held:
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only


def _evaluation(conn: socket.socket, seccomp: bytes) -> None:
    """One evaluation, as PID 1 of its own PID namespace; never returns."""
    code = 0
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        (size,) = struct.unpack("!Q", _recv_exact(conn, 8))
        if size > REQUEST_MAX_BYTES:
            raise ValueError(f"job of {size} bytes")
        job = pickle.loads(_recv_exact(conn, size))  # from the host agent, which is trusted
        folder = str(job["folder"])
        if not FOLDER.match(folder):
            raise ValueError(f"bad folder name {folder!r}")
        _isolate(folder, int(job["limits"]["file_bytes"]))
        os.chdir(EVAL)
        _drop_capabilities()
        jail_seccomp.load(seccomp)
    except BaseException as exc:  # noqa: BLE001 - the jail is not what it must be: no metric runs (infrastructure)
        _send_line(conn, {"jail_error": f"{type(exc).__name__}: {exc}"[:DETAIL_MAX_CHARS]})
        os._exit(70)
    try:
        _numba_cache(str(job["func"]))
        _apply_limits(job["limits"])
        _send_line(conn, _run(job))
    except BaseException:  # noqa: BLE001 - the zygote reports how this process ended
        code = 70
    finally:
        os._exit(code)  # and the kernel ends whatever is left in this PID namespace


class Zygote:
    """Forks an evaluation per job socket received on ``control``; reports each one's end on its socket."""

    def __init__(self, control: socket.socket, seccomp: bytes) -> None:
        self.control = control
        self.seccomp = seccomp
        self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.jobs: dict[int, socket.socket] = {}  # an evaluation's pid -> its job socket
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
            msg, fds, _flags, _addr = socket.recv_fds(self.control, 64, 4)
        except InterruptedError:
            return True
        if not msg:
            return False
        if msg[:1] == b"k" and len(msg) == 9:
            (pid,) = struct.unpack("!Q", msg[1:])
            if pid in self.jobs:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)  # its PID 1: the kernel ends the rest of its namespace
        for fd in fds:
            conn = socket.socket(fileno=fd)
            if msg[:1] != b"j":
                conn.close()
                continue
            _check(_libc().unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")  # the next child is a namespace's PID 1
            try:
                pid = os.fork()
            except OSError:
                self._own_pidns()
                raise
            if pid != 0:
                self._own_pidns()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                self.sel.close()
                for other in (self.control, *self.jobs.values()):
                    other.close()
                for fd_ in (self.wake_r, self.wake_w, self.own_pidns):
                    os.close(fd_)
                _evaluation(conn, self.seccomp)
            self.jobs[pid] = conn
            _send_line(conn, {"pid": pid})
        return True

    def _own_pidns(self) -> None:
        """Children in the zygote's own PID namespace again (until the next ``unshare``)."""
        _check(_libc().setns(self.own_pidns, CLONE_NEWPID), "setns back to the zygote's PID namespace")

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.jobs.pop(pid, None)
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
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.jobs):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _close_inherited(keep: int) -> None:
    """Every descriptor but stdio and the control socket (bwrap's own, the seccomp program)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[1]))
    _close_inherited(control.fileno())
    try:
        seccomp = jail_seccomp.program(evaluation=True)
        loaded = _preload()
    except Exception as exc:  # noqa: BLE001 - the host says why the sandbox did not start
        _send_line(control, {"ready": False, "error": f"the zygote cannot start: {type(exc).__name__}: {exc}"})
        return 1
    with open("/proc/self/net/dev") as f:  # this network namespace's interfaces (two header lines)
        interfaces = sorted(line.split(":", 1)[0].strip() for line in f.readlines()[2:])
    _send_line(
        control,
        {"ready": True, "network_isolated": interfaces in ([], ["lo"]), "uid": os.getuid(), "preloaded": loaded,
         "vm_size": _vm_size()},
    )  # fmt: skip
    Zygote(control, seccomp).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
