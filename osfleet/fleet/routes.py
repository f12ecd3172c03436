"""The gateway's handlers for the operations of the table (``osfleet.api.operations``): each call sent to the host
its fleet id names, for the caller (the hosts apply each client's rules). Mounted with the table's own paths,
models, statuses and callers (``osfleet.api.contract.Routes``), so the gateway publishes exactly the host
agent's operations.

Most operations on one replica need nothing but relaying: ``RELAYED`` names them with the ids of their answer
that must become fleet ids, and ``relay`` makes their handlers from the table. The others (placement, fan-out
to every host, OSGym's vm ids, a fork's children) have handlers of their own below.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from osfleet.api.auth import Caller, Operator, OsgymCaller, Principal
from osfleet.api.contract import CALLERS, OCTET_STREAM, Endpoint, RawBody, Routes
from osfleet.api.errors import Conflict, NotFound
from osfleet.api.models import (
    CheckpointRequest,
    CheckpointView,
    ForkRequest,
    LeaseRequest,
    OsgymReset,
    OsgymShutdown,
    OsgymStep,
    ReplicaView,
    ScaleRequest,
    ScaleResponse,
    StepRequest,
)
from osfleet.api.operations import (
    CHECKPOINT,
    DELETE_CHECKPOINT,
    FORK,
    HOST_SAMPLE,
    LEASE,
    LIST_CHECKPOINTS,
    LIST_REPLICAS,
    OPERATIONS,
    OSGYM_RESET,
    OSGYM_SCREENSHOT,
    OSGYM_SHUTDOWN,
    OSGYM_STEP,
    SCALE_UP,
    STEP,
    Operation,
    OsgymScreenshotQuery,
)
from osfleet.errors import ConfigError
from osfleet.fleet import ids, placement
from osfleet.fleet.gateway import Gateway, lease_on, passthrough, rewritten
from osfleet.fleet.hostclient import HostResponse
from osfleet.fleet.hosts import HostNotReachedError, HostState
from osfleet.replicas.checkpoints import CheckpointNotFoundError
from osfleet.replicas.errors import CapacityError, NoReplicaAvailableError

# Operations on one replica that are relayed as they are, with the ids in their answer that become fleet ids.
RELAYED: dict[str, tuple[str, ...]] = {
    "reset": ("replica_id",),
    "observation": (),
    "evaluate": (),
    "release": ("replica_id",),
    "retire": ("replica_id",),
    "upload_file": (),
    "download_file": (),
    "open_tunnel": (),
    "tunnel_send": (),
    "tunnel_receive": (),
    "close_tunnel": (),
}


def routes(get_gateway: Callable[[], Gateway]) -> Routes:
    """Every operation of the table, mounted for the gateway (it does not start if one is missing)."""
    r = Routes(OPERATIONS)
    for op in OPERATIONS:
        if op.name in RELAYED:
            r.mount(op, relay(op, RELAYED[op.name], get_gateway))
    native(r, get_gateway)
    checkpoints(r, get_gateway)
    osgym(r, get_gateway)
    return r


def relay(op: Operation, fleet_ids: tuple[str, ...], get_gateway: Callable[[], Gateway]) -> Endpoint:
    """A handler that sends the operation to the replica's host with the host's own ids (the lease's too), and
    answers with the host's answer, its ``fleet_ids`` made fleet ids. A raw body (a file's bytes, bounded by the
    gateway's own ``BodyLimit`` as by the host's) is sent on as it came, and a raw answer comes back as it was."""
    if op.path_params != ("rid",):
        raise RuntimeError(f"{op.name}: only operations on one replica ({{rid}}) are relayed")

    async def call(rid: str, who: Principal, req: BaseModel | None, content: bytes | None = None) -> Response:
        gateway = get_gateway()
        host, local = ids.split(rid)
        sent: dict[str, Any] = {}
        if req is not None:
            # what the caller gave (defaults are the host's to fill in), with the host's lease id
            values = req.model_dump(mode="json", exclude_unset=op.body is not None, exclude_none=True, by_alias=True)
            if "lease_id" in values:
                values["lease_id"] = lease_on(host, values["lease_id"])
            sent = {"json": values} if op.body is not None else {"params": values}
        if content is not None:
            sent["content"] = content
        path = op.path.replace("{rid}", local)
        resp = await gateway.call(op.name, gateway.pool.get(host), op.method, path, who, **sent)
        if op.raw_response and resp.status_code < 300:
            return passthrough(resp, OCTET_STREAM)
        return rewritten(resp, host, fleet_ids) if fleet_ids else passthrough(resp)

    if op.body is None and op.query is None:

        async def bare(rid: str, who: Caller) -> Response:
            return await call(rid, who, None)

        bare.__annotations__["who"] = CALLERS[op.auth]
        return bare

    if op.raw_body:
        if op.query is None:
            raise RuntimeError(f"{op.name}: a raw body is relayed with its query (the lease id is in it)")

        async def with_bytes(rid: str, req: Any, data: RawBody, who: Caller) -> Response:
            return await call(rid, who, req, data)

        with_bytes.__annotations__["req"] = Annotated[op.query, Query()]
        with_bytes.__annotations__["who"] = CALLERS[op.auth]
        return with_bytes

    async def with_input(rid: str, req: Any, who: Caller) -> Response:
        return await call(rid, who, req)

    with_input.__annotations__["req"] = op.body if op.body is not None else Annotated[op.query, Query()]
    with_input.__annotations__["who"] = CALLERS[op.auth]
    return with_input


# --- native API ---------------------------------------------------------------------------------------------
def native(r: Routes, get_gateway: Callable[[], Gateway]) -> None:
    @r(LEASE)
    async def lease(req: LeaseRequest, who: Caller) -> Response:
        # On the host placement picks; another host only if that one was not reached (drained, or it refused the
        # connection): a host that timed out may have leased one all the same.
        gateway = get_gateway()
        if req.checkpoint is not None:  # on the host that keeps it, where its memory and disk are
            host = await checkpoint_host(gateway, req.checkpoint, who)
            resp = await gateway.call("fork", host, "POST", "/v1/leases", who, json=req.model_dump(exclude_unset=True))
            return copies(resp, host.name)
        for i, host in enumerate(gateway.lease_hosts()):
            try:
                resp = await gateway.call(
                    "lease", host, "POST", "/v1/leases", who, json=req.model_dump(exclude_unset=True)
                )
            except HostNotReachedError:
                continue
            gateway.took_lease(host, resp.status_code)
            if resp.status_code == 201:
                if i:
                    gateway.metrics.failovers.inc()
                return rewritten(resp, host.name)
            if resp.status_code != 503:
                return passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica to lease; try again shortly")

    @r(LIST_REPLICAS)
    async def replicas(who: Caller) -> list[ReplicaView]:
        gateway = get_gateway()
        hosts = gateway.pool.healthy()
        answers = await asyncio.gather(
            *(gateway.call("quick", h, "GET", "/v1/replicas", who) for h in hosts), return_exceptions=True
        )
        out: list[ReplicaView] = []
        for host, resp in zip(hosts, answers, strict=True):
            if isinstance(resp, HostResponse) and resp.status_code == 200:
                for x in resp.json():
                    view = ReplicaView.model_validate(x)
                    out.append(view.model_copy(update={"id": ids.join(host.name, view.id), "host": host.name}))
        return out

    @r(SCALE_UP)
    async def scale_up(req: ScaleRequest, who: Operator) -> Response:
        # placed by each host's room on its binding resource (best fit)
        gateway = get_gateway()
        plan = placement.scale_plan(gateway.rooms(), req.count)
        if not plan:
            raise CapacityError(f"the fleet has no room for {req.count} more replica(s)")
        for name, count in plan.items():
            body = {"count": count, **({"mode": req.mode} if req.mode else {})}
            resp = await gateway.call("quick", gateway.pool.get(name), "POST", "/v1/replicas", who, json=body)
            if resp.status_code != 202:
                return passthrough(resp)
        answer = ScaleResponse(requested=req.count, mode=req.mode or "snapshot", placement=plan)
        return JSONResponse(answer.model_dump(mode="json"), status_code=202)

    @r(HOST_SAMPLE)
    async def fleet_sample(who: Operator) -> dict[str, Any]:
        # every host's own sample, health and room
        gateway = get_gateway()
        rooms = {r.host: r for r in gateway.rooms()}
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
                for h in gateway.pool.hosts
            },
        }

    @r(STEP)
    async def step(rid: str, req: StepRequest, who: Caller) -> Response:
        # served by the fast path (fastpath.py) when nothing about it is unusual; here otherwise
        return await get_gateway().step(rid, req, who)

    @r(FORK)
    async def fork(rid: str, req: ForkRequest, who: Caller) -> Response:
        # children start on the parent's host, where its saved memory and disk are
        host = ids.split(rid)[0]
        resp = await get_gateway().forward("fork", rid, req.lease_id, "fork", {"children": req.children}, who)
        if resp.status_code >= 300:
            return passthrough(resp)
        body = resp.json()
        body["parent_id"] = ids.join(host, body["parent_id"])
        for child in body["children"]:
            child["replica_id"] = ids.join(host, child["replica_id"])
            child["lease_id"] = ids.join(host, child["lease_id"])
        return JSONResponse(body, status_code=resp.status_code)


# --- checkpoints -------------------------------------------------------------------------------------------
def checkpoints(r: Routes, get_gateway: Callable[[], Gateway]) -> None:
    """A checkpoint stays on the host of the replica it was saved from; the gateway finds it by asking every
    healthy host for the caller's checkpoints (a name is the caller's across the fleet)."""

    @r(CHECKPOINT)
    async def checkpoint(rid: str, req: CheckpointRequest, who: Caller) -> Response:
        gateway = get_gateway()
        host = ids.split(rid)[0]
        if any(c.name == req.name for c in await fleet_checkpoints(gateway, who)):
            raise Conflict(f"checkpoint {req.name!r} exists: delete it first or choose another name")
        resp = await gateway.forward("fork", rid, req.lease_id, "checkpoints", {"name": req.name}, who)
        if resp.status_code >= 300:
            return passthrough(resp)
        return JSONResponse({**resp.json(), "host": host}, status_code=resp.status_code)

    @r(LIST_CHECKPOINTS)
    async def list_checkpoints(who: Caller) -> list[CheckpointView]:
        return sorted(await fleet_checkpoints(get_gateway(), who), key=lambda c: c.created_at)

    @r(DELETE_CHECKPOINT)
    async def delete_checkpoint(name: str, who: Caller) -> Response:
        gateway = get_gateway()
        host = await checkpoint_host(gateway, name, who)
        return passthrough(await gateway.call("quick", host, "DELETE", f"/v1/checkpoints/{name}", who))


async def fleet_checkpoints(gateway: Gateway, who: Principal) -> list[CheckpointView]:
    """The caller's checkpoints on every healthy host, each naming its host."""
    hosts = gateway.pool.healthy()
    answers = await asyncio.gather(
        *(gateway.call("quick", h, "GET", "/v1/checkpoints", who) for h in hosts), return_exceptions=True
    )
    out = []
    for host, resp in zip(hosts, answers, strict=True):
        if isinstance(resp, HostResponse) and resp.status_code == 200:
            out += [CheckpointView.model_validate({**x, "host": host.name}) for x in resp.json()]
    return out


async def checkpoint_host(gateway: Gateway, name: str, who: Principal) -> HostState:
    for c in await fleet_checkpoints(gateway, who):
        if c.name == name and c.host is not None:
            return gateway.pool.get(c.host)
    raise CheckpointNotFoundError(f"no checkpoint named {name!r} on a host that answered")


def copies(resp: HostResponse, host: str) -> Response:
    """A lease from a checkpoint: every replica's and lease's id made a fleet id."""
    if resp.status_code >= 300:
        return passthrough(resp)
    body = resp.json()
    for grant in [body, *(body.get("leases") or [])]:
        grant["replica_id"] = ids.join(host, grant["replica_id"])
        grant["lease_id"] = ids.join(host, grant["lease_id"])
    return JSONResponse(body, status_code=resp.status_code)


# --- OSGym wire compatibility -------------------------------------------------------------------------------
def osgym(r: Routes, get_gateway: Callable[[], Gateway]) -> None:
    @r(OSGYM_RESET)
    async def reset(req: OsgymReset, who: OsgymCaller) -> Response:
        gateway = get_gateway()
        body = {"task_config": req.task_config.model_dump(mode="json", exclude_unset=True), "timeout": req.timeout}
        for host in gateway.lease_hosts():
            if len(gateway.pool.by_vm_key(ids.host_key(host.name))) > 1:
                continue  # its vm ids would name two hosts (``on_vm_host``)
            try:
                resp = await gateway.call("reset", host, "POST", "/reset", who, json=body)
            except HostNotReachedError:  # only then: a host that timed out may have leased a vm all the same
                continue
            gateway.took_lease(host, resp.status_code)
            if resp.status_code == 200:
                out = resp.json()
                out["vm_id"] = ids.vm_to_fleet(host.name, int(out["vm_id"]))
                return JSONResponse(out)
            if resp.status_code != 503 or resp.json().get("kind") != "capacity":
                return passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica; try again shortly")

    async def on_vm_host(
        fleet_vm: int, route: str, method: str, path: str, who: Principal, vm_field: str, **kw: Any
    ) -> HostResponse:
        """Send a call about ``fleet_vm`` to the host its id names, with the host's own vm id in ``vm_field``
        (of the JSON body, or of the query for a GET)."""
        gateway = get_gateway()
        key, local = ids.vm_from_fleet(fleet_vm)
        hosts = gateway.pool.by_vm_key(key)
        if not hosts:
            raise NotFound(f"vm {fleet_vm} is not allocated to this client")
        if len(hosts) > 1:  # each counts its vm ids from 0: which one's is this cannot be known
            names = ", ".join(sorted(h.name for h in hosts))
            raise ConfigError(f"hosts {names} give OSGym vm ids the same number: the operator must rename one")
        where = "params" if method == "GET" else "json"
        kw[where] = {**kw.get(where, {}), vm_field: local}
        return await gateway.call(route, hosts[0], method, path, who, **kw)

    @r(OSGYM_STEP)
    async def step(req: OsgymStep, who: OsgymCaller) -> Response:
        resp = await on_vm_host(req.vm_id, "step", "POST", "/step", who, "vm_id", json={"action": req.action})
        return passthrough(resp)

    @r(OSGYM_SHUTDOWN)
    async def shutdown(req: OsgymShutdown, who: OsgymCaller) -> Response:
        gateway = get_gateway()
        if req.vm_id == "all":
            hosts = gateway.pool.healthy()
            await asyncio.gather(
                *(gateway.call("release", h, "POST", "/shutdown", who, json={"vm_id": "all"}) for h in hosts),
                return_exceptions=True,
            )
            return JSONResponse({"vm_id": "all"})
        resp = await on_vm_host(int(req.vm_id), "release", "POST", "/shutdown", who, "vm_id")
        return JSONResponse({"vm_id": req.vm_id}) if resp.status_code == 200 else passthrough(resp)

    @r(OSGYM_SCREENSHOT)
    async def screenshot(query: Annotated[OsgymScreenshotQuery, Query()], who: OsgymCaller) -> Response:
        resp = await on_vm_host(query.vm_id, "quick", "GET", "/screenshot", who, "vmId")
        if resp.status_code != 200:
            return passthrough(resp)
        return JSONResponse({**resp.json(), "vm_id": query.vm_id})
