"""``POST /v1/leases`` and ``POST /v1/replicas/{rid}/release``: a lease is its client's until released or
expired; a released replica is reset before anyone else can lease it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from osfleet.api.auth import Caller, Principal
from osfleet.api.contract import Routes
from osfleet.api.models import LeaseBody, LeaseRequest, LeaseResponse, Released
from osfleet.api.operations import LEASE, RELEASE
from osfleet.api.state import AgentState, LiveEpisode
from osfleet.replicas.errors import LeaseError


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(LEASE)
    def lease(req: LeaseRequest, who: Caller) -> LeaseResponse:
        s = state()
        rec, lease_ = s.host.lease(req.holder, req.ttl_seconds or s.config.lease_seconds, owner=who.name)
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
