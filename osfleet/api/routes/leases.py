"""``POST /v1/leases`` and ``POST /v1/replicas/{rid}/release``: a lease is its client's until released or
expired; a released replica is reset before anyone else can lease it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from osfleet.api.auth import Caller, Principal
from osfleet.api.contract import Routes
from osfleet.api.models import LeaseBody, LeaseRequest, LeaseResponse, Released
from osfleet.api.operations import LEASE, RELEASE
from osfleet.api.state import AgentState, LiveEpisode
from osfleet.protocol.models import LeaseGrant
from osfleet.replicas.errors import LeaseError


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(LEASE)
    def lease(req: LeaseRequest, who: Caller) -> LeaseResponse:
        s = state()
        seconds = req.ttl_seconds or s.config.lease_seconds
        if req.checkpoint is not None:
            return from_checkpoint(s, req.checkpoint, req.count, req.holder, seconds, who)
        rec, lease_ = s.host.lease(req.holder, seconds, owner=who.name)
        return LeaseResponse(replica_id=rec.id, lease_id=lease_.id, expires_at=lease_.expires_at)

    @routes(RELEASE)
    def release(rid: str, req: LeaseBody, who: Caller) -> Released:
        s = state()
        live = s.episode(rid, req.lease_id, who)
        with live.lock:
            ready = release_episode(s, live, who)
        return Released(replica_id=rid, released=True, ready_again=ready)


def release_episode(s: AgentState, live: LiveEpisode, who: Principal, quiet: bool = False) -> bool:
    """End the episode's lease (the caller holds its lock); ``quiet``: a lease that ended already (expired:
    the replica was reset then) is no error. Returns whether the replica is ready again."""
    rid, lease_id = live.data.replica_id, live.data.lease_id
    if s.recorder is not None:
        s.recorder.end(rid, lease_id, "released")
    if s.taken_over.get(rid) == lease_id:
        s.taken_over.pop(rid, None)
    ready = False
    try:
        ready = s.host.release(rid, lease_id, who.owner)
    except LeaseError:
        if not quiet:
            raise
    finally:
        with contextlib.suppress(OSError):
            s.forget(rid, lease_id)
    return ready


def from_checkpoint(s: AgentState, name: str, count: int, holder: str, seconds: float, who: Principal) -> LeaseResponse:
    """``count`` new replicas at the checkpoint's state, each leased to the caller, on the checkpoint's task."""
    started = time.monotonic()
    found, children = s.host.start_checkpoint(name, who.name, count, holder, seconds)
    s.adopt_checkpoint_copies(found.task, [c.record for c in children])
    grants = []
    for child in children:
        assert child.lease is not None  # start_checkpoint leases every copy
        lease_ = child.lease
        grants.append(LeaseGrant(replica_id=child.record.id, lease_id=lease_.id, expires_at=lease_.expires_at))
    first = grants[0]
    task_id = found.task.get("id") if isinstance(found.task, dict) else None
    seconds = time.monotonic() - started
    return LeaseResponse(
        **first.model_dump(), leases=grants, seconds=seconds, task_id=task_id if isinstance(task_id, str) else None
    )
