"""Parked replicas on real replicas: ready ones wait paused, a lease resumes one with its clock right, a
release parks it again, and the failure monitor leaves parked replicas alone."""

from __future__ import annotations

import time
from collections.abc import Callable

import libvirt
import pytest

from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import State

pytestmark = pytest.mark.vm


@pytest.fixture
def host(replica_hosts: Callable[..., ReplicaHost]) -> ReplicaHost:
    return replica_hosts(park=True, spares=False)


def paused(h: ReplicaHost, rid: str) -> bool:
    dom = h.virt.conn.lookupByName(h.get(rid).domain)
    return bool(dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED)


def test_a_parked_replica_resumes_on_lease_with_the_right_time_and_parks_after_release(host: ReplicaHost) -> None:
    rid = host.create().replica
    assert host.get(rid).parked and paused(host, rid)
    time.sleep(3)  # its clock stands still meanwhile
    for _ in range(3):  # the monitor's detection round must not take a parked replica for a hung one
        assert host.check() == []
    rec, lease = host.lease("tester")
    assert rec.id == rid and not rec.parked and not paused(host, rid)
    (res,) = host.act(rid, ACTIONS.validate_python([{"type": "shell", "command": "date +%s", "timeout": 30}]))
    assert res.ok and abs(int((res.stdout or "0").strip()) - time.time()) < 3
    assert host.release(rid, lease.id)
    rec = host.get(rid)
    assert rec.state == State.READY and rec.parked and paused(host, rid)


def test_a_parked_replica_forks_and_parent_and_children_wait_parked(host: ReplicaHost) -> None:
    rid = host.create().replica
    forked = host.fork(rid, 1)
    child = forked.children[0].record.id
    for r in (rid, child):
        assert host.get(r).parked and paused(host, r)
    rec, lease = host.lease("tester")  # either one resumes and answers
    (res,) = host.act(rec.id, ACTIONS.validate_python([{"type": "shell", "command": "echo up", "timeout": 30}]))
    assert res.ok and (res.stdout or "").strip() == "up"
