"""The gateway's routes: the host agent's contract (native ``/v1`` and OSGym's), each call sent to the host its
fleet id names, for the caller (the hosts apply each client's rules). Joined with their auth in app.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from osfleet.api.auth import Caller, Operator, OsgymCaller
from osfleet.api.contract import BoundaryRoute
from osfleet.api.contract import errors as documented
from osfleet.api.models import (
    FORMAT_DOC,
    INCLUDE_DOC,
    INCLUDE_PATTERN,
    QUALITY_DOC,
    ForkRequest,
    ForkResponse,
    LeaseBody,
    LeaseRequest,
    LeaseResponse,
    Observation,
    OsgymReset,
    OsgymResetResponse,
    OsgymScreenshot,
    OsgymShutdown,
    OsgymShutdownResponse,
    OsgymStep,
    OsgymStepResponse,
    Released,
    ResetRequest,
    ResetResponse,
    Retired,
    ScaleRequest,
    StepRequest,
    StepResponse,
)
from osfleet.fleet import ids, placement
from osfleet.fleet.gateway import Gateway, lease_on, passthrough, rewritten
from osfleet.fleet.hostclient import HostResponse
from osfleet.fleet.hosts import HostNotReachedError, HostState
from osfleet.replicas.errors import CapacityError, NoReplicaAvailableError
from osfleet.screen import ImageFormat
from osfleet.tasks.model import Evaluation


# --- native API ---------------------------------------------------------------------------------------------
def native(gw: Callable[[], Gateway]) -> APIRouter:
    r = APIRouter(route_class=BoundaryRoute)

    @r.post("/leases", status_code=201, responses=documented(503), response_model=LeaseResponse)
    async def lease(req: LeaseRequest, who: Caller) -> Response:
        """Lease a ready replica on the host placement picks; another host only if that one was not reached
        (drained, or it refused the connection): a host that timed out may have leased one all the same."""
        g = gw()
        for i, host in enumerate(g.lease_hosts()):
            try:
                resp = await g.call("lease", host, "POST", "/v1/leases", who, json=req.model_dump(exclude_none=True))
            except HostNotReachedError:
                continue
            if resp.status_code == 201:
                if i:
                    g.metrics.failovers.inc()
                return rewritten(resp, host.name)
            if resp.status_code != 503:
                return passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica to lease; try again shortly")

    @r.get("/replicas")
    async def replicas(who: Caller) -> list[dict[str, Any]]:
        """Every host's replicas the caller may see (a client: the ones it holds a lease on)."""
        g = gw()
        hosts = g.pool.healthy()
        answers = await asyncio.gather(
            *(g.call("quick", h, "GET", "/v1/replicas", who) for h in hosts), return_exceptions=True
        )
        out: list[dict[str, Any]] = []
        for host, resp in zip(hosts, answers, strict=True):
            if isinstance(resp, HostResponse) and resp.status_code == 200:
                out += [{**x, "id": ids.join(host.name, x["id"]), "host": host.name} for x in resp.json()]
        return out

    @r.post("/replicas", status_code=202, responses=documented(403, 503))
    async def scale_up(req: ScaleRequest, who: Operator) -> dict[str, Any]:
        """More replicas, placed by each host's room on its binding resource (best fit). The operator's."""
        g = gw()
        plan = placement.scale_plan(g.rooms(), req.count)
        if not plan:
            raise CapacityError(f"the fleet has no room for {req.count} more replica(s)")
        for name, count in plan.items():
            body = {"count": count, **({"mode": req.mode} if req.mode else {})}
            resp = await g.call("quick", g.pool.get(name), "POST", "/v1/replicas", who, json=body)
            if resp.status_code != 202:
                return JSONResponse(resp.json(), status_code=resp.status_code)  # type: ignore[return-value]
        return {"requested": req.count, "mode": req.mode or "snapshot", "placement": plan}

    @r.delete("/replicas/{rid}", responses=documented(404, 409, 503), response_model=Retired)
    async def retire(rid: str, who: Caller) -> Response:
        host, local = ids.split(rid)
        return rewritten(await gw().call("quick", gw().pool.get(host), "DELETE", f"/v1/replicas/{local}", who), host)

    @r.get("/host", responses=documented(403))
    async def fleet_sample(who: Operator) -> dict[str, Any]:
        """Every host's own sample, health and room, for load tests and placement checks. The operator's."""
        g = gw()
        rooms = {r.host: r for r in g.rooms()}
        return {
            "time": time.time(),
            "hosts": {
                h.name: {
                    "url": h.entry.url,
                    "healthy": h.healthy,
                    "reason": h.reason,
                    "drains": h.drains,
                    "room": rooms[h.name].__dict__ if h.name in rooms else None,
                    "sample": h.sample,
                }
                for h in g.pool.hosts
            },
        }

    @r.post("/replicas/{rid}/reset", responses=documented(403, 404, 409, 503), response_model=ResetResponse)
    async def reset(rid: str, req: ResetRequest, who: Caller) -> Response:
        body = req.model_dump(mode="json", exclude_none=True, exclude={"task"})
        if req.task is not None:
            body["task"] = req.task.model_dump(mode="json", exclude_unset=True)
        resp = await gw().forward("reset", rid, req.lease_id, "reset", body, who)
        return rewritten(resp, ids.split(rid)[0], ("replica_id",))

    @r.get("/replicas/{rid}/observation", responses=documented(404, 409, 503), response_model=Observation)
    async def observation(
        rid: str,
        who: Caller,
        lease_id: str = Query(min_length=1, max_length=400),
        format: Annotated[ImageFormat, Query(description=FORMAT_DOC)] = "png",
        quality: Annotated[int | None, Query(ge=1, le=100, description=QUALITY_DOC)] = None,
        include: Annotated[
            str, Query(max_length=100, pattern=INCLUDE_PATTERN, description=INCLUDE_DOC + "; comma-separated")
        ] = "",
    ) -> Response:
        """The screen now; ``include=accessibility_tree,terminal,cursor`` adds OSWorld's observation parts."""
        host, local = ids.split(rid)
        params: dict[str, Any] = {"lease_id": lease_on(host, lease_id), "format": format}
        if quality is not None:
            params["quality"] = quality
        if include:
            params["include"] = include
        path = f"/v1/replicas/{local}/observation"
        return passthrough(await gw().call("quick", gw().pool.get(host), "GET", path, who, params=params))

    @r.post("/replicas/{rid}/step", responses=documented(403, 404, 409, 503), response_model=StepResponse)
    async def step(rid: str, req: StepRequest, who: Caller) -> Response:
        """Served by the fast path (fastpath.py) when nothing about it is unusual; here otherwise."""
        return await gw().step(rid, req, who)

    @r.post("/replicas/{rid}/fork", status_code=201, responses=documented(404, 409, 503), response_model=ForkResponse)
    async def fork(rid: str, req: ForkRequest, who: Caller) -> Response:
        """Children start on the parent's host, where its saved memory and disk are."""
        host = ids.split(rid)[0]
        resp = await gw().forward("fork", rid, req.lease_id, "fork", {"children": req.children}, who)
        if resp.status_code >= 300:
            return passthrough(resp)
        body = resp.json()
        body["parent_id"] = ids.join(host, body["parent_id"])
        for child in body["children"]:
            child["replica_id"] = ids.join(host, child["replica_id"])
            child["lease_id"] = ids.join(host, child["lease_id"])
        return JSONResponse(body, status_code=resp.status_code)

    @r.post("/replicas/{rid}/evaluate", responses=documented(404, 409, 503), response_model=Evaluation)
    async def evaluate(rid: str, req: LeaseBody, who: Caller) -> Response:
        return passthrough(await gw().forward("evaluate", rid, req.lease_id, "evaluate", {}, who))

    @r.post("/replicas/{rid}/release", responses=documented(404, 409), response_model=Released)
    async def release(rid: str, req: LeaseBody, who: Caller) -> Response:
        resp = await gw().forward("release", rid, req.lease_id, "release", {}, who)
        return rewritten(resp, ids.split(rid)[0], ("replica_id",))

    return r


# --- OSGym wire compatibility -------------------------------------------------------------------------------
def osgym(gw: Callable[[], Gateway]) -> APIRouter:
    r = APIRouter(route_class=BoundaryRoute)

    @r.post("/reset", responses=documented(503), response_model=OsgymResetResponse)
    async def reset(req: OsgymReset, who: OsgymCaller) -> Response:
        g = gw()
        body = {"task_config": req.task_config.model_dump(mode="json", exclude_unset=True), "timeout": req.timeout}
        for host in g.lease_hosts():
            try:
                resp = await g.call("reset", host, "POST", "/reset", who, json=body)
            except HostNotReachedError:  # only then: a host that timed out may have leased a vm all the same
                continue
            if resp.status_code == 200:
                out = resp.json()
                out["vm_id"] = ids.vm_to_fleet(host.index, int(out["vm_id"]))
                return JSONResponse(out)
            if resp.status_code != 503 or resp.json().get("kind") != "capacity":
                return passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica; try again shortly")

    def vm_host(fleet_vm: int) -> tuple[HostState, int]:
        index, local = ids.vm_from_fleet(fleet_vm)
        return gw().pool.by_index(index), local

    @r.post("/step", responses=documented(404, 409, 503), response_model=OsgymStepResponse)
    async def step(req: OsgymStep, who: OsgymCaller) -> Response:
        host, local = vm_host(req.vm_id)
        body = {"action": req.action, "vm_id": local}
        return passthrough(await gw().call("step", host, "POST", "/step", who, json=body))

    @r.post("/shutdown", responses=documented(404), response_model=OsgymShutdownResponse)
    async def shutdown(req: OsgymShutdown, who: OsgymCaller) -> Response:
        g = gw()
        if req.vm_id == "all":
            hosts = g.pool.healthy()
            await asyncio.gather(
                *(g.call("release", h, "POST", "/shutdown", who, json={"vm_id": "all"}) for h in hosts),
                return_exceptions=True,
            )
            return JSONResponse({"vm_id": "all"})
        host, local = vm_host(req.vm_id)
        resp = await g.call("release", host, "POST", "/shutdown", who, json={"vm_id": local})
        return JSONResponse({"vm_id": req.vm_id}) if resp.status_code == 200 else passthrough(resp)

    @r.get("/screenshot", responses=documented(404, 409, 503), response_model=OsgymScreenshot)
    async def screenshot(who: OsgymCaller, vm_id: int = Query(alias="vmId")) -> Response:
        host, local = vm_host(vm_id)
        resp = await gw().call("quick", host, "GET", "/screenshot", who, params={"vmId": local})
        if resp.status_code != 200:
            return passthrough(resp)
        return JSONResponse({**resp.json(), "vm_id": vm_id})

    return r
