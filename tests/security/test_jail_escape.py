"""Red team, no VM: a hostile test suite fed straight to the evaluation sandbox tries to get out of the jail.

``check_python_file_by_test_suite`` imports the task's test suite, and the suite imports the agent's own file:
whatever either does runs in the jail (``osfleet.tasks.jail``). Each suite here is what an agent would write to
reach something of the host (the operator's token, libvirt's socket, ``/etc/shadow``, the host's network, a
file outside its folder, a process that outlives the evaluation, another evaluation's files) or to break out
(ptrace, mount, unshare, setns, keyctl, bpf). A suite returns 1.0 only when it reached nothing; when it reaches
something it raises, naming it, so the assertion shows what leaked. Forbidden system calls end the evaluation:
0 "denied by the evaluation jail", and the sandbox goes on serving.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from osfleet.tasks.jail.bubblewrap import JAIL_USER
from osfleet.tasks.jail.sandbox import Limits, Sandbox

pytestmark = pytest.mark.system

SUITE = "check_python_file_by_test_suite"
OPTIONS = {"test_function_name": "test"}


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    os.environ["OSFLEET_JAIL_TEST_SECRET"] = "the-host-agents-environment"
    try:
        sandbox = Sandbox(Limits(wall_seconds=40))
        sandbox.start()
    finally:
        del os.environ["OSFLEET_JAIL_TEST_SECRET"]
    yield sandbox
    sandbox.close()


def run(box: Sandbox, tmp: Path, body: str, agent: str = "x = 1\n") -> tuple[float, str]:
    """Score a suite whose module body is ``body`` (it fills ``reached``) and whose test fails naming it."""
    suite = tmp / "suite.py"
    suite.write_text(
        "import os, json, socket, ctypes, sys, time\nreached = {}\n"
        + textwrap.dedent(body)
        + "\ndef test():\n    if reached:\n        raise AssertionError('REACHED ' + json.dumps(reached))\n"
        + "    return 1.0\n"
    )
    answer = tmp / "answer.py"
    answer.write_text(agent)
    return box.run(SUITE, answer, suite, OPTIONS)


def test_the_operator_token_and_the_hosts_secrets_are_out_of_reach(box: Sandbox, tmp_path: Path) -> None:
    token = tmp_path / "operator-token"
    token.write_text("operator-secret\n")
    token.chmod(0o600)
    body = f"""
    for name, path in [("token", {str(token)!r}), ("shadow", "/etc/shadow"), ("passwd", "/etc/passwd"),
                       ("ssh", "/etc/ssh/ssh_host_ed25519_key"), ("root", "/root/.bash_history")]:
        try:
            reached[name] = open(path).read(40)
        except OSError:
            pass
    for name, folder in [("osfleet_home", "/var/lib/osfleet"), ("run", "/run"), ("home", "/home"),
                         ("checkout", {str(tmp_path)!r})]:
        try:
            if os.listdir(folder):
                reached[name] = folder
        except OSError:
            pass
    if any("the-host-agents-environment" in v for v in os.environ.values()):
        reached["environment"] = "the host agent's"
    """
    assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")


def test_no_unix_socket_of_the_host_answers(box: Sandbox, tmp_path: Path) -> None:
    ours = tmp_path / "service.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ours))
    server.listen()
    server.settimeout(0.1)
    body = f"""
    for path in ({str(ours)!r}, "/run/libvirt/libvirt-sock", "/var/run/libvirt/libvirt-sock",
                 "/run/libvirt/libvirt-sock-ro", "/run/dbus/system_bus_socket"):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        try:
            s.connect(path)
            reached[path] = "connected"
        except OSError:
            pass
    for name in ("\\0/org/freedesktop/systemd1/private", "\\0osfleet-jail-test"):  # abstract sockets: per netns
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(name)
            reached[name] = "connected"
        except OSError:
            pass
    """
    try:
        assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected
    finally:
        server.close()


def test_the_network_is_empty(box: Sandbox, tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    body = f"""
    for host in ("127.0.0.1", "10.0.2.2", "169.254.169.254"):
        try:
            socket.create_connection((host, {port}), timeout=2)
            reached[host] = "connected"
        except OSError:
            pass
    for family, kind in ((socket.AF_NETLINK, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW),
                         (socket.AF_INET, socket.SOCK_RAW)):
        try:
            socket.socket(family, kind)
            reached[f"socket {{family}} {{kind}}"] = "opened"
        except OSError:
            pass
    names = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
    if names not in ([], ["lo"]):
        reached["interfaces"] = names
    """
    try:
        assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_nothing_is_written_outside_the_evaluation(box: Sandbox, tmp_path: Path) -> None:
    marker = f"osfleet-jail-escape-{os.getpid()}"
    body = f"""
    for path in ({str(tmp_path / "escaped")!r}, "/tmp/{marker}", "/eval/written", "/usr/{marker}",
                 "/etc/{marker}"):
        try:
            with open(path, "w") as f:
                f.write("out")
            if not path.startswith("/tmp/"):  # its own /tmp is private to the evaluation: that is allowed
                reached[path] = "written"
        except OSError:
            pass
    """
    assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")
    assert not (tmp_path / "escaped").exists() and not Path(f"/tmp/{marker}").exists()


def test_a_process_the_suite_leaves_behind_dies_with_the_evaluation(box: Sandbox, tmp_path: Path) -> None:
    seconds = f"{1000 + os.getpid() % 1000}.{time.time_ns() % 1000:03d}"  # a sleep no one else runs
    body = f"""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/usr/bin/sleep", ["/usr/bin/sleep", "{seconds}"])
        os._exit(0)
    time.sleep(0.5)
    """
    assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")
    left = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [seconds]]
    assert left == []


@pytest.mark.parametrize(
    "call",
    [
        "ptrace(16, 1, 0, 0)",  # PTRACE_ATTACH to its namespace's PID 1
        "mount(b'none', b'/tmp', b'tmpfs', 0, None)",
        "unshare(0x10000000)",  # CLONE_NEWUSER
        "unshare(0x00020000)",  # CLONE_NEWNS
        "setns(os.open('/proc/self/ns/net', 0), 0)",
        "syscall(250, 0, 0, 0, 0, 0)",  # keyctl
        "syscall(321, 0, 0, 0)",  # bpf
        "syscall(298, 0, 0, 0, 0, 0)",  # perf_event_open
        "syscall(425, 1, 0)",  # io_uring_setup
    ],
)
def test_a_forbidden_system_call_ends_the_evaluation_with_the_reason(box: Sandbox, tmp_path: Path, call: str) -> None:
    body = f"""
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.{call}
    reached["{call}"] = f"returned {{result}} errno {{ctypes.get_errno()}}"
    """
    score, detail = run(box, tmp_path, body)
    assert score == 0.0 and "denied by the evaluation jail" in detail, detail
    assert box.run("literal_match", "a", "a", {})[0] == 1.0  # the sandbox serves the next evaluation


def test_the_agents_code_has_no_capability_and_no_way_to_gain_one(box: Sandbox, tmp_path: Path) -> None:
    body = """
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status[key], 16):
            reached[key] = status[key].strip()
    if status["NoNewPrivs"].strip() != "1" or status["Seccomp"].strip() != "2":
        reached["no_new_privs/seccomp"] = status["NoNewPrivs"].strip() + "/" + status["Seccomp"].strip()
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) > 3:  # the evaluation, its suite, and this listing's own process at most
        reached["processes"] = pids
    try:
        if os.listdir("/jobs"):
            reached["other evaluations"] = os.listdir("/jobs")
    except OSError:
        pass
    """
    assert run(box, tmp_path, body) == (1.0, "the test suite gave 1.0")


@pytest.mark.skipif(os.geteuid() != 0, reason="a host agent that is not root runs the jail as its own user")
def test_the_jail_runs_as_its_own_unprivileged_user_on_the_host(box: Sandbox, tmp_path: Path) -> None:
    jail_uid = pwd.getpwnam(JAIL_USER).pw_uid
    zygote = box.pid()
    assert zygote is not None and jail_uid != 0
    assert psutil.Process(zygote).uids().real == jail_uid
    seen: list[set[int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for child in psutil.Process(zygote).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    seen.append(set(child.uids()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run(box, tmp_path, "time.sleep(2)\n") == (1.0, "the test suite gave 1.0")
    finally:
        done.set()
        watcher.join()
    assert seen and all(uids == {jail_uid} for uids in seen), seen


def test_two_evaluations_cannot_see_each_other(box: Sandbox, tmp_path: Path) -> None:
    """The first holds its folder open for a while; the second looks for it everywhere it could be."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    out: list[tuple[float, str]] = []
    holder = threading.Thread(target=lambda: out.append(run(box, first, "time.sleep(4)\n", "SECRET_OF_FIRST = 1\n")))
    holder.start()
    time.sleep(1.5)
    body = f"""
    secret = bytes.fromhex({b"SECRET_OF_FIRST".hex()!r})  # (not spelled out: its own files hold this code)
    found = []
    for top in ("/jobs", "/eval", "/tmp", "/proc"):
        for root, dirs, files in os.walk(top):
            if root.startswith("/proc/") and root.count("/") > 2:
                dirs[:] = []
            for name in files:
                try:
                    with open(os.path.join(root, name), "rb") as f:
                        if secret in f.read(1 << 16):
                            found.append(os.path.join(root, name))
                except OSError:
                    pass
    if found:
        reached["first"] = found
    """
    try:
        assert run(box, second, body) == (1.0, "the test suite gave 1.0")
    finally:
        holder.join(60)
    assert out == [(1.0, "the test suite gave 1.0")]
