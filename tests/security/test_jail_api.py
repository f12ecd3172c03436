"""Red team through the API: a client's inline task scored by ``check_python_file_by_test_suite``, whose test suite
(written in the guest, as an agent would write it) tries to reach the host. It reaches nothing, the episode still
scores what its test returns, and a suite the jail stops scores 0 with the reason while the host serves on.

The host agent is the real API (``create_app``, a client token from a clients file) with the real runner,
getters, sandbox and jail; the guest is the test host fake with files (``FileGuest``): the hole is on the host, so
the guest only has to hand over the suite and the agent's file, as the guest agent would.
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient

from osfleet.errors import OsfleetError
from tests import fake_guest_reads
from tests.fakes import FakeHost

pytestmark = pytest.mark.system

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
A = {"Authorization": f"Bearer {ALICE}"}


@dataclass
class FileGuest(FakeHost):
    """A fake guest with files the getters can fetch: the user's copy, the size probe, the guest agent's reads."""

    guest_files: dict[str, bytes] = field(default_factory=dict)

    def shell(self, rid: str, command: str, timeout: float, as_root: bool = False, claim: Any = None) -> dict[str, Any]:
        done = fake_guest_reads.answer(self.guest_files, command)  # a getter's read as the desktop user
        if done is not None:
            return done
        if "stat -c %s" in command:  # the getters' size probe: its paths are its last arguments
            paths = shlex.split(command)[4:]
            sizes = [str(len(self.guest_files[p])) if p in self.guest_files else "-" for p in paths]
            return {"exit_code": 0, "stdout": "\n".join(sizes) + "\n", "stderr": ""}
        return super().shell(rid, command, timeout, as_root, claim)

    def read_file(self, rid: str, path: str, limit: int, timeout: float = 60.0, claim: Any = None) -> bytes:
        if path not in self.guest_files:
            raise OsfleetError(f"no {path} in the fake guest")
        return self.guest_files[path][:limit]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "operator-token"
    f.write_text(OPERATOR + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture
def guest(tmp_path: Path) -> FileGuest:
    return FileGuest(tmp_path / "home", ready=1)


@pytest.fixture
def client(serve: Callable[..., TestClient], guest: FileGuest) -> TestClient:
    return serve(guest, OPERATOR, {"alice": ALICE})


TASK = {
    "id": "jail-api",
    "instruction": "Write answer.py.",
    "evaluator": {
        "func": "check_python_file_by_test_suite",
        "options": {"test_function_name": "test"},
        "result": {"type": "vm_file", "path": "/home/user/answer.py", "dest": "answer.py"},
        "expected": {"type": "vm_file", "path": "/home/user/suite.py", "dest": "suite.py"},
    },
}


def episode(c: TestClient, guest: FileGuest, suite: str) -> tuple[int, Any]:
    guest.guest_files = {"/home/user/suite.py": suite.encode(), "/home/user/answer.py": b"ANSWER = 42\n"}
    r = c.post("/v1/leases", json={"holder": "rl"}, headers=A)
    assert r.status_code == 201, r.text
    rid, lid = r.json()["replica_id"], r.json()["lease_id"]
    r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=A)
    assert r.status_code == 200, r.text
    r = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=A)
    c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=A)
    return r.status_code, r.json()


def test_a_clients_test_suite_reaches_nothing_on_the_host_and_still_scores(
    client: TestClient, guest: FileGuest, token_file: Path, tmp_path: Path
) -> None:
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "host-service.sock"))
    unix.listen()
    unix.settimeout(0.1)
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.settimeout(0.1)
    seconds = f"{2000 + time.time_ns() % 1000}.5"
    suite = f"""
import os, socket
from answer import ANSWER
got = []
def attempt(name, fn):
    try:
        fn()
        got.append(name)
    except BaseException:
        pass
attempt("token", lambda: open({str(token_file)!r}).read())
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("libvirt", lambda: socket.socket(socket.AF_UNIX).connect("/run/libvirt/libvirt-sock"))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect({str(tmp_path / "host-service.sock")!r}))
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {tcp.getsockname()[1]}), timeout=2))
attempt("write", lambda: open({str(tmp_path / "escaped")!r}, "w").write("x"))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["/usr/bin/sleep", "{seconds}"])
    os._exit(0)
def test():
    return ANSWER == 42 and not got
"""
    try:
        status, body = episode(client, guest, suite)
        assert status == 200 and body["reward"] == 1.0, body
        for server in (unix, tcp):
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        unix.close()
        tcp.close()
    assert not (tmp_path / "escaped").exists()
    assert [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [seconds]] == []


def test_a_suite_the_jail_stops_scores_zero_with_the_reason_and_the_host_serves_on(
    client: TestClient, guest: FileGuest
) -> None:
    suite = "import ctypes\nctypes.CDLL(None).ptrace(16, 1, 0, 0)\ndef test():\n    return True\n"
    status, body = episode(client, guest, suite)
    assert status == 200 and body["reward"] == 0.0, body
    assert "denied by the evaluation jail" in body["criteria"][0]["detail"], body
    status, body = episode(client, guest, "def test():\n    return 1.0\n")
    assert status == 200 and body["reward"] == 1.0, body
