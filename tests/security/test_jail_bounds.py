"""Red team, no VM: an evaluation is a unit. What one leaves is not there for the next, its memory and its
processes are bounded as a whole (not per process), and nothing of the zygote it was forked from is writable.

Each hostile test suite here is what an agent's code (imported by the suite) would do to one tenant's evaluation to
reach the next tenant's, or to hold the host's memory or processes: it reports what it managed in its failure's
message, which the assertions read.
"""

from __future__ import annotations

import contextlib
import os
import re
import textwrap
import threading
import time
from pathlib import Path

import pytest

from osfleet.tasks.jail import cgroups
from osfleet.tasks.jail.sandbox import Limits, Sandbox

pytestmark = pytest.mark.system

SUITE = "check_python_file_by_test_suite"
OPTIONS = {"test_function_name": "test"}
MARK = "osfleet-bounds-marker"


LIMITS = Limits(wall_seconds=40, memory_bytes=256 * 2**20, file_bytes=8 * 2**20, processes=32)  # (the ``box``)


def run(box: Sandbox, folder: Path, body: str) -> tuple[float, str]:
    """Score a suite whose ``test`` is ``body`` (indented by this function)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suite.py").write_text(
        "import ctypes, mmap, os, socket, time\n\ndef test():\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    (folder / "answer.py").write_text("x = 1\n")
    return box.run(SUITE, folder / "answer.py", folder / "suite.py", OPTIONS)


def said(detail: str, key: str) -> str:
    found = re.search(rf"{key}: ([^'\"]*)", detail)
    assert found, detail
    return found.group(1).strip()


LEAVE = f"""
left = []
for d in ("/dev/shm", "/dev", "/dev/mqueue", "/tmp", "/var/tmp", "/run/user", "/run", "/", "."):
    try:
        with open(os.path.join(d, "{MARK}"), "w") as f:
            f.write("left by the first tenant")
        left.append(d)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0x05F1EE7, 4096, 0o1666) >= 0:  # IPC_CREAT | 0666: System V shared memory
    left.append("sysv-shm")
if ctypes.CDLL("librt.so.1").mq_open(b"/{MARK}", 0o102, 0o666, None) >= 0:  # O_CREAT | O_RDWR
    left.append("mqueue")
raise AssertionError("LEFT: " + ",".join(left))
"""

LOOK = f"""
seen = [d for d in ("/dev/shm", "/dev", "/dev/mqueue", "/tmp", "/var/tmp", "/run/user", "/run", "/", ".")
        if os.path.exists(os.path.join(d, "{MARK}"))]
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0x05F1EE7, 4096, 0o666) >= 0:
    seen.append("sysv-shm")
if ctypes.CDLL("librt.so.1").mq_open(b"/{MARK}", 0o2, 0o666, None) >= 0:
    seen.append("mqueue")
raise AssertionError("SEEN: " + ",".join(seen))
"""


def test_nothing_one_evaluation_leaves_is_there_for_the_next(box: Sandbox, tmp_path: Path) -> None:
    _, first = run(box, tmp_path / "first", LEAVE)
    _, second = run(box, tmp_path / "second", LOOK)
    left = said(first, "LEFT").split(",")
    assert "/dev/shm" in left and "/dev" not in left, left  # its own /dev/shm (and /tmp) only
    assert said(second, "SEEN") == "", f"the first left {left}; the second saw {said(second, 'SEEN')}"


def test_dev_shm_and_tmp_share_one_size_capped_budget(box: Sandbox, tmp_path: Path) -> None:
    """8 MiB of files in all (the evaluation's ``file_bytes``): 6 MiB in /tmp leave less than 6 in /dev/shm."""
    body = """
    wrote = {}
    for d in ("/tmp", "/dev/shm"):
        n = 0
        try:
            with open(os.path.join(d, "fill"), "wb") as f:
                for _ in range(6):
                    f.write(b"x" * (1 << 20))
                    f.flush()
                    n += 1
        except OSError:
            pass
        wrote[d] = n
    raise AssertionError("WROTE: %d+%d" % (wrote["/tmp"], wrote["/dev/shm"]))
    """
    tmp_mib, shm_mib = (int(n) for n in said(run(box, tmp_path, body)[1], "WROTE").split("+"))
    assert tmp_mib == 6 and shm_mib < 3, (tmp_mib, shm_mib)


MEMORY = """
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            m = mmap.mmap(-1, 128 << 20)
            for i in range(0, 128 << 20, 4096):
                m[i] = 1
            time.sleep(1)
            os._exit(0)
        except BaseException:
            os._exit(3)
    kids.append(pid)
held = sum(1 for p in kids if os.waitpid(p, 0)[1] == 0)
raise AssertionError("HELD: %d" % held)
"""


def test_an_evaluations_memory_is_bounded_as_a_whole(box: Sandbox, tmp_path: Path) -> None:
    """Four children of 128 MiB each under a bound of 256 MiB (and 8 MiB of files): at most two hold theirs. Each
    alone is far under the per-process limit, so only a bound on the evaluation as a whole stops them."""
    score, detail = run(box, tmp_path, MEMORY)
    assert score == 0.0
    assert int(said(detail, "HELD")) <= 2, detail
    assert "reached its memory bound of 264 MiB" in detail, detail


def fork_loop(hold: float = 0.0) -> str:
    """Fork children that sleep until refused, hold them ``hold`` seconds, and say how many there were."""
    return f"""
n = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
time.sleep({hold})
raise AssertionError("FORKED: %d" % n)
"""


def test_a_fork_loop_stops_at_the_evaluations_bound(box: Sandbox, tmp_path: Path) -> None:
    score, detail = run(box, tmp_path, fork_loop())
    assert score == 0.0 and int(said(detail, "FORKED")) < 32, detail
    assert "reached its bound of 32 processes" in detail, detail


def _busiest_evaluation(sandbox: Sandbox) -> int:
    """The most tasks any evaluation of ``sandbox`` holds now (its pids cgroups)."""
    where = str(sandbox.info["cgroup"]).removeprefix("cgroup v1: ").split(", ")
    counts = []
    for base in where:
        for e in Path(base).glob("e*/pids.current"):
            with contextlib.suppress(OSError):  # (an evaluation that has just ended)
                counts.append(int(e.read_text()))
    return max(counts, default=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="a host agent that is not root makes no cgroup here")
def test_a_fork_loop_in_one_evaluation_leaves_processes_for_another(box: Sandbox, tmp_path: Path) -> None:
    """The bound is the evaluation's own: another tenant's evaluation at the same time still forks (a bound per
    user, RLIMIT_NPROC alone, would be one pool that the loop empties)."""
    out: list[tuple[float, str]] = []  # (the loop holds its processes for 4 s while the other evaluation runs)
    loop = threading.Thread(target=lambda: out.append(run(box, tmp_path / "loop", fork_loop(hold=4))))
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while _busiest_evaluation(box) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)  # (polling the kernel's count, with a deadline)
        assert _busiest_evaluation(box) >= 30, "the fork loop did not start"
        body = """
        kids = []
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            kids.append(pid)
        return all(os.waitpid(k, 0)[1] == 0 for k in kids)
        """
        other = run(box, tmp_path / "other", body)
        assert other == (1.0, "the test suite gave 1.0"), other
    finally:
        loop.join(60)
    assert out and int(said(out[0][1], "FORKED")) < 32


WRITABLE = """
written = []
for line in open("/proc/self/mountinfo"):
    point = line.split()[4].replace("\\\\040", " ")
    if point.startswith("/proc"):
        continue
    try:
        path = os.path.join(point, ".%d-probe" % os.getpid())
        with open(path, "w"):
            pass
        os.unlink(path)
        written.append(point)
    except OSError:
        pass
raise AssertionError("WRITABLE: " + ",".join(sorted(set(written))))
"""


def test_an_evaluation_writes_only_its_own_scratch(box: Sandbox, tmp_path: Path) -> None:
    """Every mount it sees is read-only to it but its own tmpfs (its /tmp and /dev/shm, and the test suite's own
    folder in it): nothing of the zygote (its root, its /dev, the spool, the Python) takes a file."""
    writable = set(said(run(box, tmp_path, WRITABLE)[1], "WRITABLE").split(","))
    assert writable <= {"/tmp", "/dev/shm"}, writable


def test_without_cgroups_rlimit_nproc_still_bounds_the_jails_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host agent with no cgroup to give (not root, no delegated cgroup; this machine has one, so the test takes
    it away) still bounds processes: RLIMIT_NPROC, per user, so for every evaluation of the jail together."""
    monkeypatch.setattr(cgroups.Groups, "for_sandbox", classmethod(lambda cls: (None, "no cgroup (this test)")))
    sandbox = Sandbox(Limits(wall_seconds=40, processes=32), max_jobs=2)
    try:
        sandbox.start()
        assert sandbox.info["cgroup"] == "no cgroup (this test)"
        score, detail = run(sandbox, tmp_path, fork_loop())
    finally:
        sandbox.close()
    assert score == 0.0 and int(said(detail, "FORKED")) < 32 * 2 + 8, detail


@pytest.mark.skipif(os.geteuid() != 0, reason="a host agent that is not root makes no cgroup here")
def test_the_sandbox_leaves_no_cgroup_behind(tmp_path: Path) -> None:
    sandbox = Sandbox(Limits(wall_seconds=40))
    sandbox.start()
    where = str(sandbox.info["cgroup"])
    assert where.startswith("cgroup v1: "), where
    folders = [Path(p) for p in where.removeprefix("cgroup v1: ").split(", ")]
    assert all(f.is_dir() for f in folders)
    assert run(sandbox, tmp_path, "return True\n") == (1.0, "the test suite gave 1.0")
    assert all(not any(p.is_dir() for p in f.iterdir()) for f in folders)  # the evaluation's own: removed
    sandbox.close()
    assert not any(f.exists() for f in folders)
