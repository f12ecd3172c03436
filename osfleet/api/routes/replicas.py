"""The replicas of the host: a client lists and retires only its own (leased) ones; the warm pool, scale-up and
the host's sample are the operator's (403 for a client)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from osfleet.api.auth import Caller, Operator
from osfleet.api.contract import Routes
from osfleet.api.metrics import host_usage
from osfleet.api.models import ReplicaView, Retired, ScaleRequest, ScaleResponse
from osfleet.api.operations import HOST_SAMPLE, LIST_REPLICAS, RETIRE, SCALE_UP
from osfleet.api.state import AgentState
from osfleet.replicas.leases import Claim


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(LIST_REPLICAS)
    def replicas(who: Caller) -> list[ReplicaView]:
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

    @routes(SCALE_UP)
    def scale_up(req: ScaleRequest, who: Operator) -> ScaleResponse:
        s = state()
        s.host.up_async(req.count, req.mode)
        return ScaleResponse(requested=req.count, mode=req.mode or s.host.mode)

    @routes(RETIRE)
    def retire(rid: str, who: Caller) -> Retired:
        s = state()
        s.host.retire(rid, claim=None if who.operator else Claim(who.name))
        if s.recorder is not None:
            s.recorder.end_replica(rid, "replica_retired")
        s.taken_over.pop(rid, None)
        s.forget(rid)
        return Retired(replica_id=rid, retired=True)

    @routes(HOST_SAMPLE)
    async def host_sample(who: Operator) -> dict[str, Any]:
        # taken in a thread of its own, never one that steps can hold up
        return await sample(state())


async def sample(s: AgentState) -> dict[str, Any]:
    """/v1/host's sample, taken on the state's own sampler thread."""
    taken = await asyncio.get_running_loop().run_in_executor(s.sampler, s.metrics.sample, s.host)
    return {"time": time.time(), **taken, **host_usage()}
