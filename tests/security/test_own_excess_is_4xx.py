"""Red team: a tenant keeps more than its share on a host (checkpoints, forks) and must be told so as *its own*
excess: a 4xx with the reason, never a 503 or 507 that says the host is short of something.

- what it keeps fills its share: 409 ``quota`` with the figure (delete or release: waiting does not help), while
  another tenant's checkpoint goes through;
- one fork or checkpoint larger than the whole share: 413 ``too_large`` (it can never be kept there);
- only its own saves under way are in the way: 429 ``throttled`` with ``Retry-After`` (whether it fits is known when
  they end), then the answer the saved ones give;
- a fork of a fork as deep as the host allows: 409 ``conflict`` (fork its ancestor), not 503 ``capacity``;
- the SDK raises ``QuotaError`` for the new 409 and for an older host's 507 alike.

The host agent runs over the test fakes (the checkpoint book, the records and the leases are the real ones).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api import errors
from osfleet.api.errors import LargerThanShare, SavesPending, ShareFull
from osfleet.client.errors import InvalidRequestError, QuotaError, from_response
from osfleet.config import ReplicaShape, Settings
from osfleet.protocol.errors import STATUS
from osfleet.replicas.checkpoints import (
    Checkpoint,
    CheckpointBook,
    CheckpointQuotaError,
    CheckpointSavesPendingError,
    CheckpointTooLargeError,
)
from osfleet.replicas.errors import CapacityError, ForkTooDeepError
from osfleet.replicas.forks import Forks
from tests.fakes import FakeHost
from tests.security.test_fair_share_requests import wait_for
from tests.security.test_fair_share_storage import checkpoint, client_of, lease
from tests.test_fork_units import make_fork, record
from tests.test_tenants import OP, A, B

MIB = 2**20


def shares(tmp_path: Path, fork_budget_mib: int, fork_mib: int) -> FakeHost:
    """A host whose fork budget is ``fork_budget_mib`` (a share of 0.5 each); every fork or checkpoint is counted at
    ``fork_mib`` while it is saved, and the fake keeps 16 MiB for each checkpoint saved."""
    fake = FakeHost(tmp_path / "h", ready=3, max_replicas=6)
    fake.shape = ReplicaShape(memory_mib=fork_mib)
    fake.settings = dataclasses.replace(fake.settings, fork_max_bytes=fork_budget_mib * MIB)
    return fake


def kept(owner: str, name: str) -> Checkpoint:
    """A checkpoint of 10 bytes, as the book records one once it is saved."""
    return Checkpoint(name, owner, f"f-{name}", "img", "r-1", 0.0, 0.0, 0.0, 10, 0, ("h", "m"))


def keeping(c: TestClient, client: str) -> float:
    """The bytes ``client`` has being saved now, as the host's /metrics says (``osfleet_client_in_use``)."""
    line = f'osfleet_client_in_use{{client="{client}",resource="keeping_bytes"}} '
    found = [x for x in c.get("/metrics", headers=OP).text.splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


@pytest.mark.integration
def test_what_a_tenant_keeps_past_its_share_is_409_quota_and_one_too_large_is_413(tmp_path: Path) -> None:
    fake = shares(tmp_path, fork_budget_mib=40, fork_mib=8)  # a share of 20 MiB each
    with client_of(fake) as c:
        rid, lid = lease(c, A)
        assert checkpoint(c, A, rid, lid, "a0")[0] == 201  # 16 MiB kept
        status, body = checkpoint(c, A, rid, lid, "a1")  # 16 + 8 > 20
        assert status == 409 and body["kind"] == "quota", body
        assert "hold 16 MiB" in body["error"] and "(20 MiB)" in body["error"] and "delete a checkpoint" in body["error"]
        r = c.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 1}, headers=A)
        assert r.status_code == 409 and r.json()["kind"] == "quota", r.text  # forks count against the same share
        bob_rid, bob_lid = lease(c, B)
        assert checkpoint(c, B, bob_rid, bob_lid, "b0")[0] == 201  # never another tenant's loss
        fake.shape = ReplicaShape(memory_mib=32)  # one alone larger than the 20 MiB share
        status, body = checkpoint(c, B, bob_rid, bob_lid, "b1")
        assert status == 413 and body["kind"] == "too_large", body
        assert "larger than its share of the host's fork budget (20 MiB) by itself" in body["error"]


@pytest.mark.integration
def test_a_save_kept_out_only_by_the_tenants_own_saves_under_way_is_429_then_answered(tmp_path: Path) -> None:
    fake = shares(tmp_path, fork_budget_mib=24, fork_mib=8)  # a share of 12 MiB: one save of 8 fits, two do not
    with client_of(fake) as c, ThreadPoolExecutor(1) as pool:
        first_rid, first_lid = lease(c, A)
        rid, lid = lease(c, A)
        with fake.registry.locked(first_rid):  # the first save is under way: counted, not kept yet
            first = pool.submit(checkpoint, c, A, first_rid, first_lid, "first")
            wait_for(lambda: keeping(c, "alice") == 8 * MIB)
            r = c.post(f"/v1/replicas/{rid}/checkpoints", json={"lease_id": lid, "name": "second"}, headers=A)
            assert r.status_code == 429 and r.json()["kind"] == "throttled", r.text
            assert r.headers["Retry-After"] == "2" and "being saved now" in r.json()["error"]
        assert first.result()[0] == 201  # kept: 16 MiB
        status, body = checkpoint(c, A, rid, lid, "second")  # now the answer is known: her share is full
        assert status == 409 and body["kind"] == "quota", body


@pytest.mark.unit
def test_a_fork_of_a_fork_as_deep_as_the_host_allows_is_409_conflict(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", memory_dir=tmp_path / "shm", fork_max_depth=1)
    assert settings.memory_dir is not None
    settings.memory_dir.mkdir()
    f1 = make_fork(settings, "f-one")
    forks = Forks(None, None, "qemu", ReplicaShape(memory_mib=1), settings)  # type: ignore[arg-type]
    child = record("r-c", f1 / "disk.qcow2", tmp_path / "golden.qcow2")
    with pytest.raises(ForkTooDeepError, match="1 fork\\(s\\) deep; forks go at most 1 deep") as caught:
        forks.check_limits(child, [child])
    assert errors.classify(caught.value) == (409, "conflict")


@pytest.mark.unit
def test_the_checkpoint_book_tells_a_full_quota_from_one_too_large_and_from_its_own_saves_under_way(
    tmp_path: Path,
) -> None:
    book = CheckpointBook(tmp_path, max_count=2, max_bytes=25)  # each one kept holds 10 bytes
    with book.reserving("alice", "first", 10):
        with (
            pytest.raises(CheckpointSavesPendingError, match="being saved now") as pending,
            book.reserving("alice", "second", 20),
        ):
            pass
        with book.reserving("bob", "b", 20):  # bob's quota is his own
            pass
        book.add(kept("alice", "first"))
    assert errors.classify(pending.value) == (429, "throttled") and pending.value.retry_after == 2
    with pytest.raises(CheckpointQuotaError) as full, book.reserving("alice", "second", 20):
        pass  # 10 kept + 20 > 25, nothing being saved: waiting does not help
    assert type(full.value) is CheckpointQuotaError and errors.classify(full.value) == (409, "quota")
    with pytest.raises(CheckpointTooLargeError) as large, book.reserving("bob", "huge", 26):
        pass
    assert errors.classify(large.value) == (413, "too_large")
    with book.reserving("alice", "second", 1):  # the count: one kept, one being saved, at most 2
        with pytest.raises(CheckpointSavesPendingError, match="saves 1 more now"), book.reserving("alice", "t", 1):
            pass
        book.add(kept("alice", "second"))
    with pytest.raises(CheckpointQuotaError, match="keeps 2 checkpoint") as count, book.reserving("alice", "t", 1):
        pass
    assert errors.classify(count.value) == (409, "quota")


@pytest.mark.unit
def test_the_sdk_raises_quota_error_for_a_full_share_and_invalid_request_for_one_too_large() -> None:
    full = from_response(409, {"error": "share full", "kind": "quota"}, "checkpoint")
    assert isinstance(full, QuotaError) and full.status == 409
    older = from_response(507, {"error": "share full", "kind": "quota"}, "checkpoint")  # a host before 2026-12-06
    assert isinstance(older, QuotaError)
    assert type(from_response(413, {"error": "larger", "kind": "too_large"}, "fork")) is InvalidRequestError


@pytest.mark.unit
def test_every_refusal_of_a_tenants_own_excess_is_a_4xx_and_a_shortage_stays_503() -> None:
    own = [ShareFull, LargerThanShare, SavesPending, CheckpointQuotaError, CheckpointTooLargeError]
    own += [CheckpointSavesPendingError, ForkTooDeepError]
    for cls in own:
        status, _ = errors.classify(cls("x"))
        assert 400 <= status < 500, cls
    assert errors.classify(CapacityError("the disk would be nearly full")) == (503, "capacity")
    assert 507 not in STATUS.values()  # no kind answers 507 any more: a shortage is 503, an excess its own 4xx
