"""``check_python_file_by_test_suite``: the task's test suite (a Python file) run against the agent's code.

OSWorld imports the test file in its own process, with the test file's folder (where its getters put the
agent's files too) as the working directory, calls its ``test`` function (option ``test_function_name``)
and scores its answer: a bool as 1/0, a number clamped to [0, 1], anything else by its truth; a file that
is missing, does not import, or whose test raises scores 0.

Here the test runs in a separate Python process (``python -I``), in a fresh folder holding the test file
and the agent's files under the names the task gave them (the getter's numbered prefix dropped), with a
time limit (``TEST_SECONDS``), an address-space limit and an empty environment, inside the evaluation jail
(``osfleet.tasks.jail``): like every metric, this one runs only in the sandbox's jailed evaluation process, so
the agent's code sees its own folder, an empty network and a read-only Python, as an unprivileged user with no
capabilities, under seccomp, and everything it starts ends with the evaluation. The test can import only what
osfleet's Python has installed; OSWorld's host has its own packages, so a test suite that imports something
osfleet lacks scores 0 here.

**How the answer comes back.** The agent's module runs in the suite's interpreter, at import and whenever the
test calls it, so nothing that process prints can be trusted: an agent that printed ``{"score": 1e300}`` and
exited once got that reward. The answer comes instead on a socket of its own (``report``: a UNIX ``SOCK_SEQPACKET``
pair, so each write is one message, and a socket cannot be reopened through ``/proc/self/fd``), made before
anything of the suite is imported: one message that starts with a nonce made for this run and handed over on the
suite's stdin (never in its arguments or environment). The runner takes every function it needs before the suite
is imported (later rebinding of a module's names or of the builtins does not reach them), sends its one message
after the test returned and ends at once. The metric then reads the socket: exactly one message with the nonce is
the answer; none (the suite exited, or was killed, before answering) scores 0 with the reason; anything else on
it (a message without the nonce, a second message) scores 0 as tampered. Standard output and error go to a file
and are only quoted in a reason. The metric's own process is non-dumpable while the suite runs, so the
suite can read neither its memory (the nonce) nor its descriptors through ``/proc``. What the agent's code can
still do inside the test (it shares an interpreter with it) is in docs/explanation/threat-model.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from osfleet.tasks.jail.seccomp import KILLED_BY
from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, file_path, scored, short

TEST_SECONDS = 120
TEST_MEMORY_BYTES = 2 * 2**30
REPORT_MAX_BYTES = 4096  # the runner's message is under 600 bytes
NONCE_BYTES = 16
PR_SET_DUMPABLE = 4
_GETTER_PREFIX = re.compile(r"^\d+-")

# Runs in the child: argv = [test file, test function name, report socket]; the nonce comes on stdin. Its one
# message on the report socket: "<nonce> score <float>" or "<nonce> error <text>".
_RUNNER = r"""
def _run():
    import os, sys, math, importlib.util
    # Taken before the suite (and the agent's module it imports) runs: later rebinding of os.write, json, the
    # builtins or this module's names does not reach these objects.
    write, leave, readv, isfinite, pid_of = os.write, os._exit, os.readv, math.isfinite, os.getpid
    is_a, number, text, name_of, to_bytes, attr, can_call = isinstance, float, str, type, bytes, getattr, callable
    shown = repr
    from_file, new_module = importlib.util.spec_from_file_location, importlib.util.module_from_spec
    path, name, report = sys.argv[1], sys.argv[2], int(sys.argv[3])
    nonce = bytearray(64)
    del nonce[readv(0, [nonce]):]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_inheritable(report, False)  # never passed on to a program the suite starts
    del sys.argv[3:]

    me = pid_of()

    def answer(kind, said):
        if pid_of() != me:  # a process the suite forked, ending in here: the suite's own process answers
            leave(0)
        write(report, to_bytes(nonce) + b" " + kind + b" " + said.encode("utf-8", "replace")[:500])

    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = from_file("osfleet_test_suite", path)
        module = new_module(spec)
        sys.modules["osfleet_test_suite"] = module
        spec.loader.exec_module(module)
        test = attr(module, name, None)
        if not can_call(test):
            answer(b"error", "no test function %r" % (name,))
        else:
            r = test()
            if is_a(r, bool):
                score = 1.0 if r else 0.0
            elif is_a(r, (int, float)):
                value = number(r)
                score = (0.0 if value < 0.0 else 1.0 if value > 1.0 else value) if isfinite(value) else 0.0
            else:
                score = 1.0 if r else 0.0
            answer(b"score", shown(score))
    except BaseException as exc:
        answer(b"error", "%s: %s" % (name_of(exc).__name__, text(exc)[:200]))
    leave(0)


_run()
"""


def _limits() -> None:
    """Never above the limits it already runs under (the evaluation sandbox's): a hard limit cannot be raised. The
    suite's processes are the first the kernel ends when the evaluation's memory bound is reached, so the metric
    lives to say why."""
    for kind, cap in ((resource.RLIMIT_AS, TEST_MEMORY_BYTES), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(kind)
        cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        resource.setrlimit(kind, (cap, cap))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def _files(value: Any) -> list[Path]:
    if value is None:
        return []
    values = value if isinstance(value, list | tuple) else [value]
    return [file_path(v) for v in values if v]


@contextlib.contextmanager
def _undumpable() -> Iterator[None]:
    """This process non-dumpable meanwhile: a process of the same user can then open neither its memory nor its
    descriptors through ``/proc`` (and ptrace is refused by the jail's seccomp filter anyway)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _messages(report: socket.socket) -> list[bytes]:
    """The messages on the report socket now, at most two (never waits: the suite has ended, and a process it left
    behind may hold its end open)."""
    report.setblocking(False)
    found: list[bytes] = []
    with contextlib.suppress(BlockingIOError):
        while len(found) < 2:
            message = report.recv(REPORT_MAX_BYTES)
            if not message:
                break
            found.append(message)
    return found


def _reported(messages: list[bytes], nonce: bytes) -> dict[str, str] | str:
    """The runner's answer on the report socket ({kind: text}), or why there is none to trust ("" for none)."""
    if not messages:
        return ""
    if len(messages) != 1 or not messages[0].startswith(nonce + b" "):
        return "the test suite's report socket carried something its runner did not send: scored 0"
    kind, _, said = messages[0][len(nonce) + 1 :].partition(b" ")
    return {kind.decode(errors="replace"): said.decode(errors="replace")}


@scored("test_function_name")
def check_python_file_by_test_suite(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not expected:
        return 0.0, "no test suite"
    suite = file_path(expected)
    if not suite.is_file():
        return 0.0, "the test suite does not exist"
    name = str(options.get("test_function_name", "test"))
    nonce = secrets.token_hex(NONCE_BYTES).encode()
    with tempfile.TemporaryDirectory(prefix="osfleet-test-suite-") as tmp:
        folder = Path(tmp)
        for f in _files(result):
            if f.is_file():
                shutil.copyfile(f, folder / _GETTER_PREFIX.sub("", f.name))
        test = folder / _GETTER_PREFIX.sub("", suite.name)
        shutil.copyfile(suite, test)
        err = folder / ".stderr"
        report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with report, theirs, _undumpable(), err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _RUNNER, str(test), name, str(theirs.fileno())],
                cwd=folder,
                env={"PATH": "/usr/bin:/bin", "HOME": str(folder)},
                stdin=subprocess.PIPE,
                stdout=stderr,
                stderr=stderr,
                pass_fds=(theirs.fileno(),),
                preexec_fn=_limits,
            )
            theirs.close()
            assert proc.stdin is not None
            with contextlib.suppress(OSError):  # a suite that ended at once: it has no answer either
                proc.stdin.write(nonce)
                proc.stdin.close()
            try:
                code = proc.wait(TEST_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return 0.0, f"the test suite ran longer than {TEST_SECONDS} s"
            answer = _reported(_messages(report), nonce)
        said = _tail(err)
    if isinstance(answer, str):
        if answer:
            return 0.0, answer
        answer = {}
    if "score" in answer:
        try:
            score = float(answer["score"])
        except ValueError:
            return 0.0, f"the test suite's runner answered {short(answer['score'], 40)}, not a score"
        return score, f"the test suite gave {answer['score']}"
    if "error" in answer:
        return 0.0, f"the test suite failed: {short(answer['error'], 200)}"
    if code == -signal.SIGSYS:
        return 0.0, f"the test suite was stopped: {KILLED_BY}"
    how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    raise CannotScore(f"the test suite ended without an answer ({how}): {short(said[-200:])}")


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    """The last ``limit`` bytes of a file the suite wrote (it may have written up to its file-size limit)."""
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - limit, 0))
        return f.read().decode(errors="replace")


METRICS: dict[str, Metric] = {"check_python_file_by_test_suite": check_python_file_by_test_suite}
NEEDS: dict[str, tuple[str, ...]] = {}
