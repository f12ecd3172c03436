"""Red team: one tenant keeps as much as it can on a host (checkpoints, forks, recordings); another tenant of the same
host must keep its own.

- checkpoints and forks count together against the host-wide fork budget: one client holds at most its share
  (``--client-share``) and is refused past it, 409 ``quota`` with the figure (its own excess: a 4xx, never a 503 or
  507), while another client's go through;
- a checkpoint that would leave the host's disk (or memory file system) nearly full is refused, 503 ``capacity``
  with the reason, whoever asks: the replicas' own overlays and memory live there;
- recordings: a client flooding the store loses its own oldest episodes, never another's.

The host agent runs over the test fakes (the checkpoint book and the records are the real ones); the disk is a
small tmpfs mounted for the test; the recorder and its store are the real ones on real files.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import digest
from osfleet.config import AgentConfig, ClientToken, RecordingConfig, ReplicaShape
from osfleet.recording import Recorder, TrajectoryStore
from tests.fakes import FakeHost
from tests.test_recording import noise_png
from tests.test_tenants import ALICE, BOB, OP, OPERATOR, A, B

CLIENTS = (ClientToken("alice", digest(ALICE)), ClientToken("bob", digest(BOB)))


def client_of(fake: FakeHost) -> TestClient:
    config = AgentConfig(token=OPERATOR, warm=0, clients=CLIENTS, client_share=0.5)
    return TestClient(create_app(config, lambda: fake))


def lease(c: TestClient, who: dict[str, str]) -> tuple[str, str]:
    r = c.post("/v1/leases", json={"holder": "t"}, headers=who)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def checkpoint(c: TestClient, who: dict[str, str], rid: str, lid: str, name: str) -> tuple[int, dict[str, str]]:
    r = c.post(f"/v1/replicas/{rid}/checkpoints", json={"lease_id": lid, "name": name}, headers=who)
    return r.status_code, r.json()


@pytest.mark.integration
def test_a_clients_checkpoints_past_its_share_of_the_fork_budget_are_409_and_anothers_are_kept(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path / "h", ready=2, max_replicas=4)
    fake.shape = ReplicaShape(memory_mib=8)  # each new one counted at 8 MiB before it is saved; the fake's hold 16
    fake.settings = dataclasses.replace(fake.settings, fork_max_bytes=80 * 2**20)  # a share of 0.5: 40 MiB each
    with client_of(fake) as c:
        rid, lid = lease(c, A)
        made = [checkpoint(c, A, rid, lid, f"a{i}")[0] for i in range(3)]  # 16, 32, then 48 MiB kept
        assert made == [201, 201, 201]
        status, body = checkpoint(c, A, rid, lid, "a3")
        assert status == 409 and body["kind"] == "quota", body
        assert "share of the host's fork budget (40 MiB)" in body["error"] and "48 MiB" in body["error"]
        bob_rid, bob_lid = lease(c, B)
        assert checkpoint(c, B, bob_rid, bob_lid, "b0")[0] == 201  # bob's share is his own
        assert c.delete("/v1/checkpoints/a0", headers=A).status_code == 200
        assert checkpoint(c, A, rid, lid, "a3")[0] == 201  # deleting frees alice's share


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: the host's home (its forks and checkpoints) on a disk that can be filled."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.mark.system
def test_a_checkpoint_that_would_fill_the_hosts_disk_is_refused_with_the_reason(small_disk: Path) -> None:
    fake = FakeHost(small_disk / "h", ready=1, max_replicas=2)
    fake.shape = ReplicaShape(memory_mib=8)
    fake.settings = dataclasses.replace(fake.settings, memory_dir=None)
    with client_of(fake) as c:
        rid, lid = lease(c, OP)
        assert checkpoint(c, OP, rid, lid, "fits")[0] == 201  # 8 MiB on a 64 MiB disk
        (small_disk / "ballast").write_bytes(b"\0" * (54 * 2**20))  # the replicas' overlays grew: ~10 MiB left
        status, body = checkpoint(c, OP, rid, lid, "too-much")
        assert status == 503 and body["kind"] == "capacity", body
        assert "MiB free" in body["error"] and "1/20" in body["error"]  # osfleet.api.admission.DISK_RESERVE_SHARE
        assert [x["name"] for x in c.get("/v1/checkpoints", headers=OP).json()] == ["fits"]


@pytest.mark.integration
def test_one_clients_flood_of_recordings_costs_its_own_never_anothers(tmp_path: Path) -> None:
    cap = 4 * 2**20
    store = TrajectoryStore(tmp_path / "trajectories")
    rec = Recorder(store, RecordingConfig(max_bytes=cap, quality=95), client_share=0.5)
    shots = [noise_png(i) for i in range(4)]

    def episode(owner: str, n: int, steps: int) -> str:
        rid, lid = f"r-{owner}-{n}", f"l-{owner}-{n}"
        tid = rec.begin(rid, lid, task={"id": f"{owner}{n}"}, owner=owner)
        assert tid is not None
        for i in range(steps):
            rec.step(rid, lid, f"a{i}", [{"type": "wait"}], [{"type": "wait", "ok": True}], 0.1, False, None,
                     shots[i % 4], owner=owner)  # fmt: skip
        rec.end(rid, lid, "released")
        return tid

    bobs = [episode("bob", n, 3) for n in range(2)]  # bob's, recorded first: the oldest in the store
    alices = [episode("alice", n, 6) for n in range(30)]  # then alice floods it, far past the whole cap
    kept = {m.id: m for m in store.all()}
    assert set(bobs) <= set(kept)  # the oldest episodes, but not the flooder's: kept
    alice_bytes = sum(m.bytes for m in kept.values() if m.owner == "alice")
    assert alice_bytes <= cap // 2  # she holds at most her share
    assert alices[-1] in kept and alices[0] not in kept  # her own oldest went first
