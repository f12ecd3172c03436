"""Forks on real replicas: children start where the parent was, diverge without cross-talk, children of
children work, and a saved fork lives exactly as long as a replica uses it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from PIL import Image, ImageChops

from osfleet.config import Settings
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.errors import LeaseError
from osfleet.replicas.forks import SCREEN
from osfleet.replicas.manager import ReplicaHost

pytestmark = pytest.mark.vm


@pytest.fixture
def host(replica_hosts: Callable[..., ReplicaHost]) -> ReplicaHost:
    return replica_hosts()


def shell(h: ReplicaHost, rid: str, command: str) -> str:
    (res,) = h.act(rid, ACTIONS.validate_python([{"type": "shell", "command": command, "timeout": 30}]))
    assert res.ok, res.error
    return (res.stdout or "").strip()


def test_children_start_from_the_parents_state_and_diverge(host: ReplicaHost, settings: Settings) -> None:
    parent = host.create().replica
    shell(host, parent, "echo before-fork > ~/fork-marker")
    forked = host.fork(parent, 2)
    a, b = (c.record.id for c in forked.children)
    assert {a, b}.isdisjoint({parent}) and all(c.lease is None for c in forked.children)
    with Image.open(settings.forks_dir / forked.fork_id / SCREEN) as img:
        at_fork = img.convert("RGB")
    for rid in (a, b):
        assert shell(host, rid, "cat ~/fork-marker") == "before-fork"
        assert ImageChops.difference(at_fork, host.virt.screenshot(host.get(rid).domain)).getbbox() is None
        assert shell(host, rid, "hostname") == host.get(rid).hostname  # its own identity, not the parent's
    # the parent went on after the save
    shell(host, parent, "echo parent-after > ~/fork-branch")
    shell(host, a, "echo a > ~/fork-branch")
    assert shell(host, b, "cat ~/fork-branch 2>/dev/null || echo none") == "none"
    assert shell(host, a, "cat ~/fork-branch") == "a"
    assert shell(host, parent, "cat ~/fork-branch") == "parent-after"
    # a child of a child keeps the whole chain
    nested = host.fork(a, 1)
    grandchild = nested.children[0].record.id
    assert shell(host, grandchild, "cat ~/fork-marker ~/fork-branch") == "before-fork\na"
    counts = {f.id: f.children for f in host.fork_states()}
    assert counts == {forked.fork_id: 3, nested.fork_id: 1}  # the grandchild's chain goes through both
    # a reset takes a child back to the image's initial state and drops its use of the fork
    host.reset(a)
    assert shell(host, a, "cat ~/fork-marker 2>/dev/null || echo none") == "none"
    assert {f.id: f.children for f in host.fork_states()} == {forked.fork_id: 2, nested.fork_id: 1}
    host.retire(grandchild)
    assert [f.id for f in host.fork_states()] == [forked.fork_id]
    assert not (settings.forks_dir / nested.fork_id).exists()
    host.retire(b)
    assert host.fork_states() == [] and not (settings.forks_dir / forked.fork_id).exists()
    assert host.virt.names(f"{settings.template_prefix}f-") == []


def test_a_leased_replica_forks_only_through_its_lease(host: ReplicaHost) -> None:
    host.create()
    rid, lease = host.lease("tester")
    with pytest.raises(LeaseError):
        host.fork(rid.id, 1)
    with pytest.raises(LeaseError):
        host.fork(rid.id, 1, lease_id="not-the-lease")
    forked = host.fork(rid.id, 1, lease_id=lease.id)
    child = forked.children[0]
    assert child.lease is not None and child.lease.holder == "tester"
    assert host.get(child.record.id).state.value == "leased"
    host.check_lease(child.record.id, child.lease.id)
    host.check_lease(rid.id, lease.id)  # the parent keeps its lease


def test_children_from_ready_slots_are_exact_copies_with_their_own_randomness_and_clock(
    replica_hosts: Callable[..., ReplicaHost], settings: Settings
) -> None:
    """Slots started ahead of the fork take the children; each child is its parent's copy (hostname, machine
    id, files) but its kernel RNG was reseeded (new VM generation ID) and its clock moved on."""
    host = replica_hosts(fork_ready=2)
    parent = host.create().replica
    shell(host, parent, "echo slot-marker > ~/fork-marker")
    host.settle()  # the slots are started
    time.sleep(3)  # the fork's children restore a state 3 s old: their clocks must catch up
    forked = host.fork(parent, 2)
    assert host.forks.load(forked.fork_id).meta["ready_slots"] == 2
    assert forked.paused_seconds < 0.5  # a live save: it did not stand still for its whole memory
    time.sleep(1.0)  # the clock adjustment is sent without waiting for the helper
    seen = set()
    for child in forked.children:
        rid = child.record.id
        assert child.record.hostname == host.get(parent).hostname
        host_id, marker, now, rnd = shell(
            host, rid, "hostname; cat ~/fork-marker; date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
        ).split("\n")
        assert host_id == host.get(parent).hostname and marker == "slot-marker"
        assert abs(int(now) - time.time()) < 3
        seen.add(rnd)
    assert len(seen) == 2
    host.down([c.record.id for c in forked.children])
    assert host.fork_states() == []
