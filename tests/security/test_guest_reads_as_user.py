"""Red team: a client's task reads the guest as the desktop user, in every check and getter.

The guest here is this machine, played faithfully where it matters: root is root, the desktop user is ``nobody``
(``runuser``), and the files and their permissions are real, so the kernel decides what "the desktop user may
read" means, as in a guest. The host agent is the real API with a client token (``create_app`` over the test
host fake, ``FakeHost``, whose shell and file reads are this machine's): a client's inline task that reads
``/etc/shadow``, or a link the agent planted in its home, scores 0 and its detail says why and nothing of the
file; the operator's task reads as root. A getter's file swapped for a link to root's file between a look and
the read cannot make root read it: the desktop user's own open is the only one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from osfleet.api.auth import Principal
from osfleet.api.policy import reads_as_root
from osfleet.config import AgentConfig
from osfleet.errors import GuestFileTooLargeError
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.model import find_task, parse_task
from osfleet.tasks.osworld_format import getters
from tests import fake_guest_reads
from tests.fakes import FakeHost

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
USER = "nobody"  # the desktop user's part, played by this machine's unprivileged user
SECRET = "root:$6$osfleet-test-secret$"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing root and the desktop user needs root")


def run_as(user: str | None, command: str, timeout: float) -> dict[str, Any]:
    argv = ["sh", "-c", command] if user is None else ["runuser", "-u", user, "--", "sh", "-c", command]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
    return {"exit_code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def the_desktop_user(command: str) -> str:
    """osfleet's read as the guest's user ``user``, for this machine's ``nobody``."""
    if fake_guest_reads.parsed(command) is None:
        return command
    argv = shlex.split(command)
    argv[6] = USER
    return shlex.join(argv)


@dataclass
class LocalDesktop(FakeHost):
    """The API's test host, whose guest is this machine (``shell`` as root or as ``nobody``, files read as root by
    the "guest agent"). ``after``: called once, after the first command that runs (an agent's race)."""

    after: Callable[[], None] | None = None

    def shell(self, rid: str, command: str, timeout: float, as_root: bool = False, claim: Any = None) -> dict[str, Any]:
        out = run_as(None if as_root else USER, the_desktop_user(command), timeout)
        if self.after is not None:
            swap, self.after = self.after, None
            swap()
        return out

    def read_file(self, rid: str, path: str, limit: int, timeout: float = 60.0, claim: Any = None) -> bytes:
        data = Path(path).read_bytes()
        if len(data) > limit:
            raise GuestFileTooLargeError(f"file over {limit} bytes: {path}")
        return data


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Path]:
    """A folder the desktop user can read (0755), as a home is, holding a file of root's it may not (0600)."""
    folder = Path(f"/tmp/osfleet-guest-reads-{os.getpid()}-{tmp_path.name}")
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    secret = folder / "root-only"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


@pytest.fixture
def guest(tmp_path: Path) -> LocalDesktop:
    return LocalDesktop(tmp_path / "records", ready=1)


@pytest.fixture
def client(serve: Callable[..., TestClient], guest: LocalDesktop) -> TestClient:
    return serve(guest, OPERATOR, {"alice": ALICE})


def reading(path: str) -> dict[str, Any]:
    check = {"type": "file_content", "path": path, "match": {"regex": "root:"}}
    return {"id": "reads", "instruction": "x", "criteria": [{"name": "secret", "check": check}]}


def evaluated(c: TestClient, token: str, task: dict[str, Any]) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {token}"}
    r = c.post("/v1/leases", json={"holder": "rl"}, headers=auth)
    assert r.status_code == 201, r.text
    rid, lid = r.json()["replica_id"], r.json()["lease_id"]
    try:
        r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": task, "observe": False}, headers=auth)
        assert r.status_code == 200, r.text
        r = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=auth)
        assert r.status_code == 200, r.text
        return dict(r.json())
    finally:
        c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=auth)


@pytest.mark.system
@needs_root
def test_a_clients_task_reading_etc_shadow_scores_zero_and_tells_nothing_of_it(client: TestClient) -> None:
    body = evaluated(client, ALICE, reading("/etc/shadow"))
    detail = body["criteria"][0]["detail"]
    assert body["reward"] == 0.0 and detail == "the desktop user may not read /etc/shadow", body
    assert "root:" not in str(body) and "$" not in str(body)


@pytest.mark.system
@needs_root
def test_a_link_the_agent_planted_to_roots_file_reads_as_the_user(client: TestClient, desk: Path) -> None:
    (desk / "notes.txt").symlink_to(desk / "root-only")
    body = evaluated(client, ALICE, reading(str(desk / "notes.txt")))
    assert body["reward"] == 0.0 and SECRET not in str(body), body
    assert body["criteria"][0]["detail"] == f"the desktop user may not read {desk / 'notes.txt'}"


@pytest.mark.system
@needs_root
def test_the_operators_task_reads_as_root(client: TestClient, desk: Path) -> None:
    body = evaluated(client, OPERATOR, reading(str(desk / "root-only")))
    assert body["reward"] == 1.0, body


@pytest.mark.system
@needs_root
def test_what_the_user_may_read_a_clients_task_reads(client: TestClient, desk: Path) -> None:
    mine = desk / "mine.txt"
    mine.write_text("root: is a word here\n")
    mine.chmod(0o644)
    assert evaluated(client, ALICE, reading(str(mine)))["reward"] == 1.0


@pytest.mark.system
@needs_root
def test_a_getters_file_swapped_for_a_link_after_a_look_is_still_the_users(
    guest: LocalDesktop, desk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's race: a readable file while the desktop user looks, a link to root's file when it is read."""
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
    target = desk / "result.txt"
    target.write_text("the agent's honest work\n")
    target.chmod(0o644)

    def swap() -> None:
        target.unlink()
        target.symlink_to(desk / "root-only")

    guest.after = swap
    work = tmp_path / "work"
    work.mkdir()
    spec = {"type": "vm_file", "path": str(target), "dest": "result.txt"}
    got = getters.get(guest, "r-1", spec, work, AssetStore.from_settings(), 30.0)
    assert got is None or got.read_text() == "the agent's honest work\n"
    assert not any(SECRET in p.read_text() for p in work.rglob("*") if p.is_file())


@pytest.mark.unit
def test_who_reads_as_root() -> None:
    config = AgentConfig(token=OPERATOR)
    operator, alice = Principal("operator", operator=True), Principal("alice", operator=False)
    builtin = find_task("cli-write-note")
    changed = builtin.model_copy(update={"instruction": "something else"})
    inline = parse_task(reading("/etc/shadow"))
    assert reads_as_root(inline, operator, config)
    assert reads_as_root(builtin, alice, config)  # a built-in task as it ships is the operator's
    assert not reads_as_root(changed, alice, config)  # the same id with the client's own content is not
    assert not reads_as_root(inline, alice, config)
    assert reads_as_root(inline, alice, AgentConfig(token=OPERATOR, allow_agent_root=True))
