"""Red team, no VM: a client's inline task may not act with more than the desktop user's rights in the guest.

The real API (``create_app``) over the test host fake (no guest is needed: each request is refused before
anything reaches one, which the fake would record), driven with a client's token and by an OSGym caller let in
by its address: a ``download`` to a root-owned place, a command or check as root, a cache file name that leads
out of the task cache, getters that read outside the user's reach as root. Each is 403 naming the step or the
getter; the operator, and a host started with ``--allow-agent-root``, are not refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.api.policy import within_user_reach
from osfleet.config import AgentConfig
from osfleet.tasks.assets import AssetStore
from tests.fakes import FakeHost

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
A = {"Authorization": f"Bearer {ALICE}"}
OP = {"Authorization": f"Bearer {OPERATOR}"}
URL = "https://example.invalid/osfleet-policy/payload.sh"
SHA = hashlib.sha256(b"#!/bin/sh\nid > /tmp/owned\n").hexdigest()


def config(tmp_path: Path, **over: Any) -> AgentConfig:
    f = tmp_path / "clients"
    f.write_text(f"alice {ALICE}\n")
    return AgentConfig(token=OPERATOR, warm=0, clients=load_clients(f, OPERATOR), **over)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AssetStore:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
    payload = tmp_path / "payload.sh"
    payload.write_bytes(b"#!/bin/sh\nid > /tmp/owned\n")
    s = AssetStore.from_settings()
    s.add(URL, payload)
    return s


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=2)


def app(tmp_path: Path, fake: FakeHost, **over: Any) -> TestClient:
    return TestClient(create_app(config(tmp_path, **over), lambda: fake))


@pytest.fixture
def client(tmp_path: Path, fake: FakeHost, store: AssetStore) -> Iterator[TestClient]:
    with app(tmp_path, fake) as c:
        yield c


def osworld(config: list[dict[str, Any]] | None = None, **evaluator: Any) -> dict[str, Any]:
    ev = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
          "expected": {"type": "rule", "rules": {"expected": ""}}}  # fmt: skip
    return {"id": "policy", "instruction": "Nothing.", "config": config or [], "evaluator": {**ev, **evaluator}}


def raw(getter: dict[str, Any]) -> dict[str, Any]:
    """An osfleet-format task with a converted OSWorld check, as a client could send one (not published)."""
    check = {"type": "osworld", "func": "exact_match", "result": getter, "expected": {"type": "rule", "rules": {}}}
    return {"id": "policy", "instruction": "x", "criteria": [{"name": "c", "check": check}]}


def download(path: str) -> dict[str, Any]:
    return {"type": "download", "parameters": {"files": [{"url": URL, "path": path}]}}


def reset(c: TestClient, headers: dict[str, str], task: dict[str, Any]) -> Any:
    r = c.post("/v1/leases", json={"holder": "t"}, headers=headers)
    assert r.status_code == 201, r.text
    rid, lid = r.json()["replica_id"], r.json()["lease_id"]
    out = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": task, "observe": False}, headers=headers)
    c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=headers)
    return out


HOSTILE = {
    "a download into cron": (osworld([download("/etc/cron.d/osfleet")]), "download to /etc/cron.d/osfleet"),
    "a download climbing out of home": (osworld([download("/home/user/../../root/.bashrc")]), "download to"),
    "a download in post-config": (
        osworld(postconfig=[download("/usr/local/bin/google-chrome")]),
        "post-config step 1 (download to /usr/local/bin/google-chrome)",
    ),
    "a command's output kept out of the cache": (
        {
            "id": "policy",
            "instruction": "x",
            "setup": [{"type": "run", "command": "echo x", "stdout_to": "../../../etc/cron.d/x"}],
            "criteria": [{"name": "c", "check": {"type": "command_output", "command": "true", "exit_code": 0}}],
        },
        "keeps its output as '../../../etc/cron.d/x'",
    ),
    "vm_file on root's files": (
        osworld(
            result={"type": "vm_file", "path": "/etc/shadow", "dest": "s"},
            func="check_include_exclude",
            expected={"type": "rule", "rules": {"include": ["root"], "exclude": []}},
        ),
        "getter vm_file would read '/etc/shadow' as root",
    ),
    # OSWorld's own format checks these names (422); osfleet's format takes a converted check as it is
    "a cache_file climbing out": (
        raw({"type": "cache_file", "path": "../../../etc/shadow"}),
        "getter cache_file names '../../../etc/shadow'",
    ),
    "gimp_config_file climbing out": (
        raw({"type": "gimp_config_file", "file_name": "../../../../../../root/.ssh/id_rsa"}),
        "getter gimp_config_file names",
    ),
    "vm_file on root's files, in osfleet's format": (
        raw({"type": "vm_file", "path": ["/home/user/a", "/root/.ssh/id_rsa"], "multi": True}),
        "getter vm_file would read '/root/.ssh/id_rsa' as root",
    ),
    "osfleet's format with a root command": (
        {
            "id": "policy",
            "instruction": "x",
            "setup": [{"type": "run", "command": "id", "as_root": True}],
            "criteria": [{"name": "c", "check": {"type": "command_output", "command": "true", "exit_code": 0}}],
        },
        "set-up step 1 runs as root",
    ),
    "osfleet's format with a hidden put_file": (
        {
            "id": "policy",
            "instruction": "x",
            "setup": [{"type": "put_file", "path": "/etc/sudoers.d/x", "url": URL, "sha256": SHA}],
            "criteria": [{"name": "c", "check": {"type": "command_output", "command": "true", "exit_code": 0}}],
        },
        "download to /etc/sudoers.d/x",
    ),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_clients_task_that_acts_as_root_is_refused_naming_the_part(
    client: TestClient, fake: FakeHost, name: str
) -> None:
    task, words = HOSTILE[name]
    r = reset(client, A, task)
    assert r.status_code == 403, r.text
    assert r.json()["kind"] == "forbidden" and words in r.json()["error"], r.json()
    assert "--allow-agent-root" in r.json()["error"]
    assert fake.applied == []  # nothing reached the guest


@pytest.mark.system
def test_the_operator_and_an_allow_agent_root_host_are_not_refused(
    tmp_path: Path, fake: FakeHost, store: AssetStore
) -> None:
    task = osworld([download("/etc/cron.d/osfleet")])
    with app(tmp_path, fake) as c:
        assert reset(c, OP, task).status_code == 200
    with app(tmp_path, fake, allow_agent_root=True) as c:
        assert reset(c, A, task).status_code == 200


@pytest.mark.system
def test_a_clients_download_into_its_home_is_allowed(client: TestClient) -> None:
    task = osworld([download("~/Desktop/payload.sh"), download("/tmp/x.sh")])
    assert reset(client, A, task).status_code == 200


@pytest.mark.unit
def test_an_osgym_caller_let_in_by_address_is_a_client(tmp_path: Path, fake: FakeHost, store: AssetStore) -> None:
    with app(tmp_path, fake, osgym_allowed_ips=("testclient",)) as c:
        r = c.post("/reset", json={"task_config": osworld([download("/etc/cron.d/osfleet")]), "timeout": 600})
        assert r.status_code == 403 and "download to /etc/cron.d/osfleet" in r.json()["error"], r.text
        assert [rec for rec in fake.replicas() if rec.lease is not None] == []  # no vm was leased for it


@pytest.mark.unit
@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/home/user/a", True), ("/tmp", True), ("/home/user/../user/x", True),
        ("/home/user/../../etc/shadow", False), ("/home/username/x", False), ("/tmp/../etc", False),
        ("relative", False), ("/etc/shadow", False),
    ],
)  # fmt: skip
def test_within_user_reach_resolves_dots_before_it_decides(path: str, inside: bool) -> None:
    assert within_user_reach(path) is inside
