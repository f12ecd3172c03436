"""The replicas of the host: a client lists and retires only its own (leased) ones; the warm pool, scale-up and
the host's sample are the operator's (403 for a client)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

from osfleet.api.auth import Caller, Operator
from osfleet.api.contract import BoundaryRoute
from osfleet.api.contract import errors as documented
from osfleet.api.metrics import host_usage
from osfleet.api.models import ReplicaView, Retired, ScaleRequest, ScaleResponse
from osfleet.api.state import AgentState
from osfleet.replicas.leases import Claim


def router(state: Callable[[], AgentState]) -> APIRouter:
    r = APIRouter(route_class=BoundaryRoute)

    @r.get("/replicas")
    def replicas(who: Caller) -> list[ReplicaView]:
        """Every replica for the operator; for a client, the replicas it holds a lease on (no others)."""
        return [
            ReplicaView(
                id=x.id,
                state=x.state.value,
                generation=x.generation,
                mode=x.mode,
                image=x.image,
                leased=x.lease is not None,
                created_at=x.created_at,
                ready_at=x.ready_at,
            )
            for x in state().visible(who)
        ]

    @r.post("/replicas", status_code=202, responses=documented(403, 503))
    def scale_up(req: ScaleRequest, who: Operator) -> ScaleResponse:
        """Bring up more replicas in the background; watch them with GET /v1/replicas. 503 capacity when the
        host cannot hold that many more. The operator's."""
        s = state()
        s.host.up_async(req.count, req.mode)
        return ScaleResponse(requested=req.count, mode=req.mode or s.host.mode)

    @r.delete("/replicas/{rid}", responses=documented(404, 409, 503))
    def retire(rid: str, who: Caller) -> Retired:
        """Take a replica down for good: any for the operator; for a client, one it holds a lease on."""
        s = state()
        s.host.retire(rid, claim=None if who.operator else Claim(who.name))
        if s.recorder is not None:
            s.recorder.end_replica(rid, "replica_retired")
        s.taken_over.pop(rid, None)
        s.forget(rid)
        return Retired(replica_id=rid, retired=True)

    @r.get("/host", responses=documented(403))
    async def host_sample(who: Operator) -> dict[str, object]:
        """A sample of this host for load tests and the gateway's placement: replicas by state, disk bytes, CPU
        and memory. The operator's (it covers every tenant). Taken in a thread of its own, never one that
        steps can hold up."""
        return await sample(state())

    return r


async def sample(s: AgentState) -> dict[str, Any]:
    """/v1/host's sample, taken on the state's own sampler thread."""
    taken = await asyncio.get_running_loop().run_in_executor(s.sampler, s.metrics.sample, s.host)
    return {"time": time.time(), **taken, **host_usage()}
