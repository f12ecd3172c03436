"""Episodes on disk (osfleet/replicas/episodes.py) through the host agent over the test fakes (no VM): an
append-only log instead of a file rewritten per step, results bounded (digests past the caps), fork children
inheriting the parent's steps through one linked file, a damaged episode set aside at start-up."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from osfleet.protocol.actions import ActionResult
from osfleet.replicas import episodes
from osfleet.replicas.episodes import AppliedStep, Episode, EpisodeStore
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

TOKEN = "episodes-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = AgentConfig(token=TOKEN, warm=0)
TASK = {
    "id": "fake-task",
    "instruction": "Run something.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": "yes"}}}],
}


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path, ready=1)


@pytest.fixture
def client(fake: FakeHost) -> Iterator[TestClient]:
    with TestClient(create_app(CONFIG, lambda: fake)) as c:
        yield c


def lease(c: TestClient) -> tuple[str, str]:
    r = c.post("/v1/leases", json={}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def step(c: TestClient, rid: str, lid: str, action_id: str, command: str = "echo") -> Any:
    body = {
        "lease_id": lid,
        "action_id": action_id,
        "actions": [{"type": "shell", "command": command}],
        "observe": False,
    }
    r = c.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def test_steps_are_appended_to_a_log_and_the_header_is_not_rewritten(client: TestClient, tmp_path: Path) -> None:
    rid, lid = lease(client)
    assert (
        client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH).status_code == 200
    )
    store = EpisodeStore(tmp_path / "replicas")
    header = store.path(rid, lid)
    before = header.stat()
    for i in range(5):
        step(client, rid, lid, f"a{i}")
    after = header.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # never rewritten per step
    lines = store.path(rid, lid, ".log").read_text().splitlines()
    assert lines == [line for i in range(5) for line in (f'{{"pending":"a{i}"}}', lines[2 * i + 1])]
    assert all(line.startswith('{"applied":') for line in lines[1::2])


def test_a_long_episode_keeps_its_log_bounded(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episodes, "STEPS_REMEMBERED", 4)
    monkeypatch.setattr(episodes, "COMPACT_EVERY", 8)
    rid, lid = lease(client)
    for i in range(30):
        step(client, rid, lid, f"a{i}")
    lines = EpisodeStore(tmp_path / "replicas").path(rid, lid, ".log").read_text().splitlines()
    assert len(lines) < 8 + 4
    assert step(client, rid, lid, "a29")["replayed"] is True  # the newest are still replayed
    assert step(client, rid, lid, "a0")["replayed"] is False  # the oldest forgotten (as before: 256 remembered)


def test_results_over_the_caps_are_kept_as_digests_and_replayed_as_such(
    client: TestClient, fake: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = "x" * (300 * 1024)  # one step's results over STEP_RESULTS_MAX_BYTES

    def act(rid: str, actions: list[Any], claim: Any = None) -> list[ActionResult]:
        fake.applied.append((rid, actions))
        size = int(actions[0].command.split()[-1])  # type: ignore[union-attr]
        return [ActionResult(type="shell", ok=True, seconds=0.0, exit_code=0, stdout="y" * size)]

    monkeypatch.setattr(fake, "act", act)
    rid, lid = lease(client)
    fresh = step(client, rid, lid, "big", f"print {len(big)}")
    assert len(fresh["results"][0]["stdout"]) == len(big)  # the answer to the step itself is whole
    again = step(client, rid, lid, "big", f"print {len(big)}")
    assert again["replayed"] and again["results"][0]["stdout"] is None
    assert again["results"][0]["digests"]["stdout"].startswith("sha256:") and f"({len(big)} bytes)" in str(again)
    # small steps are kept whole until the episode's cap, then as digests
    for i in range(12):
        step(client, rid, lid, f"s{i}", "print 100000")
    kept = [step(client, rid, lid, f"s{i}", "print 100000")["results"][0]["stdout"] for i in range(12)]
    whole = [k for k in kept if k is not None]
    assert 0 < len(whole) < 12 and len(whole) * 100_000 <= episodes.EPISODE_RESULTS_MAX_BYTES
    assert len(fake.applied) == 13  # replays are never applied again


def test_fork_children_link_the_parents_steps_once(client: TestClient, fake: FakeHost, tmp_path: Path) -> None:
    rid, lid = lease(client)
    for i in range(3):
        step(client, rid, lid, f"a{i}")
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 3}, headers=AUTH)
    assert r.status_code == 201, r.text
    store = EpisodeStore(tmp_path / "replicas")
    bases = [store.path(c["replica_id"], c["lease_id"], ".base") for c in r.json()["children"]]
    inodes = {b.stat().st_ino for b in bases}
    assert len(inodes) == 1 and bases[0].stat().st_nlink == 3  # one file, linked into every child
    assert not list((tmp_path / "replicas" / rid).glob("*.base*"))  # the parent keeps no copy
    for child in r.json()["children"]:
        assert step(client, child["replica_id"], child["lease_id"], "a1")["replayed"] is True
    assert len(fake.applied) == 3


def test_a_child_restarted_agent_still_knows_its_inherited_steps(fake: FakeHost, tmp_path: Path) -> None:
    with TestClient(create_app(CONFIG, lambda: fake)) as c:
        rid, lid = lease(c)
        step(c, rid, lid, "a0")
        r = c.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 1}, headers=AUTH)
        (child,) = r.json()["children"]
    again = FakeHost(tmp_path, ready=0)
    with TestClient(create_app(CONFIG, lambda: again)) as c:
        assert step(c, child["replica_id"], child["lease_id"], "a0")["replayed"] is True
        assert again.applied == []


def test_a_damaged_episode_is_set_aside_at_start_up(
    fake: FakeHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(create_app(CONFIG, lambda: fake)) as c:
        rid, lid = lease(c)
        assert (
            c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH).status_code == 200
        )
        step(c, rid, lid, "a0")
    header = EpisodeStore(tmp_path / "replicas").path(rid, lid)
    header.write_bytes(b'{"replica_id": "' + rid.encode() + b'", "lease_id": \xff\xfe garbage')
    again = FakeHost(tmp_path, ready=0)
    with caplog.at_level(logging.ERROR), TestClient(create_app(CONFIG, lambda: again)) as c:
        assert c.get("/health").status_code == 200  # the agent started
        aside = list((tmp_path / "replicas" / rid).glob("episode-*.corrupt-*"))
        assert {p.name.split(".corrupt-")[0] for p in aside} == {header.name, header.with_suffix(".log").name}
        assert any("unreadable and was set aside" in r.getMessage() and rid in r.getMessage() for r in caplog.records)
        r = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH)
        assert r.status_code == 409 and "no task" in r.json()["error"]  # the lease holds; its episode starts over


def test_a_line_torn_by_a_crash_is_ignored(tmp_path: Path) -> None:
    store = EpisodeStore(tmp_path)
    (tmp_path / "r-1").mkdir()
    ep = Episode(replica_id="r-1", lease_id="abcdef0123456789")
    store.start(ep)
    store.pending(ep, "a1")
    store.applied(ep, AppliedStep(action_id="a1", done=False, results=[]))
    with open(store.path("r-1", ep.lease_id, ".log"), "a") as f:
        f.write('{"pending":"a2"')  # the process died in the middle of this write
    back = store.load("r-1", ep.lease_id)
    assert back is not None and back.applied("a1") is not None and back.pending is None
