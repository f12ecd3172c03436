"""Checkpoints: a replica's running state kept under a client's name, started again any number of times.

The API over the test fakes (real ``CheckpointBook``, real records and leases; the kept "state" is the fake guest's
files): names, tenancy, quota, copies from a checkpoint, delete. Then the real thing on a replica (``vm``): a file
written before the checkpoint is in every replica started from it, by a new ``ReplicaHost`` as after a restart,
and the checkpoint's fork outlives the collection that removes a fork nothing keeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.config import Settings
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.checkpoints import (
    Checkpoint,
    CheckpointBook,
    CheckpointExistsError,
    CheckpointNameError,
    CheckpointNotFoundError,
    CheckpointQuotaError,
)
from osfleet.replicas.manager import ReplicaHost
from tests.fakes import FakeHost
from tests.test_tenants import TASK, A, B, config, lease

unit = pytest.mark.unit


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=2)


@pytest.fixture
def client(fake: FakeHost, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(tmp_path), lambda: fake)) as c:
        yield c


def save(c: TestClient, rid: str, lid: str, name: str, headers: dict[str, str]) -> tuple[int, dict]:
    r = c.post(f"/v1/replicas/{rid}/checkpoints", json={"lease_id": lid, "name": name}, headers=headers)
    return r.status_code, r.json()


@unit
def test_a_checkpoint_is_its_clients_alone(client: TestClient) -> None:
    rid, lid = lease(client, A)
    status, body = save(client, rid, lid, "c1", A)
    assert status == 201 and body["name"] == "c1" and body["bytes"] > 0, body
    assert [c["name"] for c in client.get("/v1/checkpoints", headers=A).json()] == ["c1"]
    assert client.get("/v1/checkpoints", headers=B).json() == []
    r = client.post("/v1/leases", json={"checkpoint": "c1"}, headers=B)
    assert r.status_code == 404 and r.json()["kind"] == "not_found"
    assert client.delete("/v1/checkpoints/c1", headers=B).status_code == 404
    assert client.get("/v1/checkpoints", headers=A).json()[0]["name"] == "c1"  # still alice's


@unit
def test_copies_start_from_a_checkpoint_with_its_task_until_it_is_deleted(client: TestClient) -> None:
    rid, lid = lease(client, A)
    r = client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=A)
    assert r.status_code == 200, r.text
    assert save(client, rid, lid, "mid-task", A)[0] == 201
    assert client.get("/v1/checkpoints", headers=A).json()[0]["task_id"] == TASK["id"]
    r = client.post("/v1/leases", json={"checkpoint": "mid-task", "count": 2}, headers=A)
    assert r.status_code == 201, r.text
    grants = r.json()["leases"]
    assert len(grants) == 2 and r.json()["replica_id"] == grants[0]["replica_id"]
    assert len({g["replica_id"] for g in grants} | {rid}) == 3
    for g in grants:  # each copy is on the checkpoint's task: evaluate is not "no task"
        ev = client.post(f"/v1/replicas/{g['replica_id']}/evaluate", json={"lease_id": g["lease_id"]}, headers=A)
        assert ev.status_code == 200, ev.text
    assert client.delete("/v1/checkpoints/mid-task", headers=A).json() == {"name": "mid-task", "deleted": True}
    assert client.post("/v1/leases", json={"checkpoint": "mid-task"}, headers=A).status_code == 404
    assert client.delete("/v1/checkpoints/mid-task", headers=A).status_code == 404


@unit
@pytest.mark.parametrize("name", ["a/b", "x" * 65, "", ".hidden", "../up", "sp ace"])
def test_a_name_that_cannot_be_a_file_name_is_422(client: TestClient, name: str) -> None:
    rid, lid = lease(client, A)
    status, body = save(client, rid, lid, name, A)
    assert status == 422 and body["kind"] == "invalid_request", body
    assert client.get("/v1/checkpoints", headers=A).json() == []


@unit
def test_a_taken_name_is_409_and_a_full_quota_409_quota_with_the_figure(client: TestClient, fake: FakeHost) -> None:
    rid, lid = lease(client, A)
    assert save(client, rid, lid, "one", A)[0] == 201
    status, body = save(client, rid, lid, "one", A)
    assert status == 409 and "exists" in body["error"]
    for i in range(fake.checkpoints.max_count - 1):
        assert save(client, rid, lid, f"n{i}", A)[0] == 201
    status, body = save(client, rid, lid, "over", A)
    assert status == 409 and body["kind"] == "quota" and f"at most {fake.checkpoints.max_count}" in body["error"]
    rid_b, lid_b = lease(client, B)
    assert save(client, rid_b, lid_b, "one", B)[0] == 201  # bob's quota and names are his own


@unit
def test_count_without_a_checkpoint_is_422_as_the_schema_says(client: TestClient) -> None:
    for body in ({"count": 2}, {"count": 1}, {"count": 2, "checkpoint": None}):
        r = client.post("/v1/leases", json=body, headers=A)
        assert r.status_code == 422 and "checkpoint" in r.text, (body, r.text)
    schema = client.get("/openapi.json", headers=A).json()["components"]["schemas"]["LeaseRequest"]
    assert schema["dependentRequired"] == {"count": ["checkpoint"]}
    assert "anyOf" not in schema["properties"]["checkpoint"]  # no null: leave it out


@unit
@pytest.mark.parametrize("name", ["a b", "x" * 65, ".x", "%2e%2e"])
def test_deleting_a_name_no_checkpoint_can_have_is_404(client: TestClient, name: str) -> None:
    # a path segment is any text by the schema: not a malformed request, a checkpoint the caller does not keep
    r = client.delete(f"/v1/checkpoints/{name}", headers=A)
    assert r.status_code == 404 and r.json()["kind"] == "not_found"


@unit
def test_the_book_counts_bytes_and_one_name_is_saved_once_under_a_race(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path, max_count=10, max_bytes=100)
    with pytest.raises(CheckpointQuotaError, match="larger than its quota"), book.reserving("alice", "big", 101):
        pass
    with pytest.raises(CheckpointNameError), book.reserving("alice", "a/b", 1):
        pass
    with pytest.raises(CheckpointNotFoundError):
        book.get("alice", "a/b")  # a name no checkpoint can have is not found
    with pytest.raises(CheckpointNotFoundError):
        book.get("alice", "nothing")
    won: list[str] = []
    lost: list[Exception] = []
    start = threading.Barrier(8)
    hold = threading.Event()

    def race(i: int) -> None:
        start.wait()
        try:
            with book.reserving("alice", "same", 10):
                won.append(f"t{i}")
                hold.wait(5)  # keep the name while the others try
                book.add(_record("alice", "same", f"f-{i}"))
        except CheckpointExistsError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    while len(won) + len(lost) < 8 and len(lost) < 7:
        threading.Event().wait(0.01)
    hold.set()
    for t in threads:
        t.join(10)
    assert len(won) == 1 and len(lost) == 7
    assert [c.fork_id for c in book.list("alice")] == [f"f-{won[0][1:]}"]
    assert book.list("bob") == [] and book.fork_ids() == {f"f-{won[0][1:]}"}


def _record(owner: str, name: str, fork_id: str) -> Checkpoint:
    return Checkpoint(name, owner, fork_id, "img", "r-1", 0.0, 0.0, 0.0, 10, 0, ("h", "m"), None)


# --- on real replicas ---------------------------------------------------------------------------------------------
def shell(h: ReplicaHost, rid: str, command: str) -> str:
    (res,) = h.act(rid, ACTIONS.validate_python([{"type": "shell", "command": command, "timeout": 30}]))
    assert res.ok, res.error
    return (res.stdout or "").strip()


@pytest.mark.vm
@pytest.mark.slow
def test_a_checkpoint_outlives_its_replica_and_its_host_object(
    replica_hosts: Callable[..., ReplicaHost], settings: Settings
) -> None:
    first = replica_hosts()
    first.create()
    rec, lease_ = first.lease("tester", owner="alice")
    shell(first, rec.id, "echo kept > ~/cp-marker")
    kept = first.checkpoint(rec.id, "cp-test", "alice", lease_.id)
    assert kept.bytes > 0 and (settings.forks_dir / kept.fork_id / "meta.json").exists()
    shell(first, rec.id, "echo later > ~/cp-marker")  # the replica goes on; the checkpoint does not see it
    first.retire(rec.id)
    first.lifecycle.collect_forks()  # nothing but the name keeps the fork now
    assert (settings.forks_dir / kept.fork_id).exists()
    second = replica_hosts()  # a new host object reads the book and the fork from disk, as after a restart
    try:
        second.lifecycle.collect_forks()
        found, copies = second.start_checkpoint("cp-test", "alice", 2, "tester")
        assert found.fork_id == kept.fork_id and len(copies) == 2
        for child in copies:
            assert child.lease is not None and child.lease.owner == "alice"
            assert shell(second, child.record.id, "cat ~/cp-marker") == "kept"
        with pytest.raises(CheckpointNotFoundError):
            second.start_checkpoint("cp-test", "bob", 1, "tester")
        second.delete_checkpoint("cp-test", "alice")
        with pytest.raises(CheckpointNotFoundError):
            second.start_checkpoint("cp-test", "alice", 1, "tester")
        assert (settings.forks_dir / kept.fork_id).exists()  # its copies still run on its layers
        for child in copies:
            second.retire(child.record.id)
        assert not (settings.forks_dir / kept.fork_id).exists()
    finally:
        for c in second.checkpoints.list("alice"):
            second.delete_checkpoint(c.name, "alice")


# --- through a gateway: a checkpoint stays on its host ---------------------------------------------------------------
@unit
def test_the_gateway_finds_each_checkpoint_on_its_host(tmp_path: Path) -> None:
    from osfleet.fleet.app import create_gateway
    from tests.test_fleet import Agent, free_port

    hosts = [Agent(n, FakeHost(tmp_path / n, ready=2), free_port()) for n in ("h1", "h2")]
    for h in hosts:
        h.start()
    try:
        auth = {"Authorization": "Bearer gateway-token-0123456789"}
        with TestClient(create_gateway("gateway-token-0123456789", [h.entry for h in hosts])) as gw:
            r = gw.post("/v1/leases", json={"holder": "t"}, headers=auth)
            assert r.status_code == 201, r.text
            rid, lid = r.json()["replica_id"], r.json()["lease_id"]
            on = rid.split(".")[0]
            r = gw.post(f"/v1/replicas/{rid}/checkpoints", json={"lease_id": lid, "name": "g1"}, headers=auth)
            assert r.status_code == 201 and r.json()["host"] == on, r.text
            listed = gw.get("/v1/checkpoints", headers=auth).json()
            assert [(c["name"], c["host"]) for c in listed] == [("g1", on)]
            # the name is the caller's across the fleet: taken on one host is taken on the other
            rid2, lid2 = next(
                (x["replica_id"], x["lease_id"])
                for x in (gw.post("/v1/leases", json={"holder": "t"}, headers=auth).json() for _ in range(3))
                if x["replica_id"].split(".")[0] != on
            )
            r = gw.post(f"/v1/replicas/{rid2}/checkpoints", json={"lease_id": lid2, "name": "g1"}, headers=auth)
            assert r.status_code == 409, r.text
            r = gw.post("/v1/leases", json={"checkpoint": "g1", "count": 2}, headers=auth)
            assert r.status_code == 201, r.text
            assert {g["replica_id"].split(".")[0] for g in r.json()["leases"]} == {on}  # started where it is kept
            assert gw.delete("/v1/checkpoints/g1", headers=auth).json() == {"name": "g1", "deleted": True}
            assert gw.post("/v1/leases", json={"checkpoint": "g1"}, headers=auth).status_code == 404
            assert gw.delete("/v1/checkpoints/g1", headers=auth).status_code == 404
    finally:
        for h in hosts:
            h.stop()
