"""Checkpoints: a leased replica's running state kept under a name of the caller's (``osfleet.replicas.checkpoints``),
listed and deleted by that caller alone; starting replicas from one is a lease (``routes.leases``)."""

from __future__ import annotations

from collections.abc import Callable

from osfleet.api.auth import Caller
from osfleet.api.contract import Routes
from osfleet.api.models import CheckpointDeleted, CheckpointRequest, CheckpointView
from osfleet.api.operations import CHECKPOINT, DELETE_CHECKPOINT, LIST_CHECKPOINTS
from osfleet.api.state import AgentState
from osfleet.replicas.checkpoints import Checkpoint


def view(c: Checkpoint) -> CheckpointView:
    task_id = c.task.get("id") if isinstance(c.task, dict) else None
    return CheckpointView(
        name=c.name,
        image=c.image,
        created_at=c.created_at,
        bytes=c.bytes,
        save_seconds=c.save_seconds,
        task_id=task_id if isinstance(task_id, str) else None,
    )


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(CHECKPOINT)
    def checkpoint(rid: str, req: CheckpointRequest, who: Caller) -> CheckpointView:
        s = state()
        live = s.episode(rid, req.lease_id, who)
        expected = s.host.shape.memory_mib * 2**20  # at most its RAM, plus a disk layer of what it wrote
        # within the client's share of the host's fork budget, and the host's disk and memory keep room
        with s.ledger.keeping(s.host, who, expected), live.lock:  # no step is half-applied in the saved state
            s.check_not_taken_over(rid, req.lease_id)
            claim = live.on(s.host, who).claim
            made = s.host.checkpoint(rid, req.name, who.name, req.lease_id, claim=claim, task=live.data.task)
        return view(made)

    @routes(LIST_CHECKPOINTS)
    def list_checkpoints(who: Caller) -> list[CheckpointView]:
        return [view(c) for c in sorted(state().host.checkpoints.list(who.name), key=lambda c: c.created_at)]

    @routes(DELETE_CHECKPOINT)
    def delete_checkpoint(name: str, who: Caller) -> CheckpointDeleted:
        gone = state().host.delete_checkpoint(name, who.name)
        return CheckpointDeleted(name=gone.name, deleted=True)
