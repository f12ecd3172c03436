"""The fleet gateway: the host agent's HTTP contract (native ``/v1`` and OSGym's endpoints) over many hosts.

Stateless: fleet ids name their host (ids.py), placement reads the hosts' own samples (placement.py) and
health comes from polling them (hosts.py), so a restarted gateway knows everything again after one poll.
Bodies are passed through as the host wrote them where no id needs rewriting (a step's observation is
hundreds of kilobytes: parsing it would cost the client latency for nothing). Calls to the hosts go through
hostclient.py, and a plain step skips FastAPI's routing and dependencies (fastpath.py): together they took
what the gateway adds to a step on a busy 2-core host from about 6 ms to about 2 (in front of a stand-in host;
``osfleet bench chaos`` measures it in front of real replicas: ``gateway_overhead``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from osfleet import __version__
from osfleet.api import auth, errors
from osfleet.api.contract import BoundaryRoute, add_metrics_route
from osfleet.api.contract import errors as documented
from osfleet.api.errors import Conflict
from osfleet.api.models import (
    FORMAT_DOC,
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
from osfleet.config import AgentConfig
from osfleet.errors import OsfleetError
from osfleet.fleet import ids, placement
from osfleet.fleet.fastpath import StepFastPath
from osfleet.fleet.hostclient import HostClient, HostResponse
from osfleet.fleet.hosts import HostEntry, HostPool, HostState
from osfleet.replicas.errors import CapacityError, NoReplicaAvailableError
from osfleet.screen import ImageFormat
from osfleet.tasks.model import Evaluation

# Deadlines of proxied calls: a cold reset boots a desktop (about a minute under TCG); a step may run a
# guest command for up to its own timeout; everything else is quick.
DEADLINES = {
    "lease": 30.0,
    "fork": 600.0,  # saving the parent, then N children (a few seconds each under TCG)
    "reset": 400.0,
    "step": 700.0,
    "evaluate": 300.0,
    "release": 400.0,
    "quick": 30.0,
}
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.proxied = Histogram(
            "osfleet_gateway_seconds",
            "Proxied call latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.hosts = Gauge("osfleet_gateway_hosts", "Hosts by state", ["state"], registry=self.registry)
        # Recovery layer 4: a host drained (its leases end, new work goes elsewhere).
        self.drains = Gauge("osfleet_gateway_drains", "Times each host was drained", ["host"], registry=self.registry)
        self.failovers = Counter(
            "osfleet_gateway_failovers_total", "Leases placed on another host after one failed", registry=self.registry
        )


class Gateway:
    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.metrics = GatewayMetrics()

    def rooms(self) -> list[placement.Room]:
        return [placement.room(h.name, h.sample) for h in self.pool.healthy() if h.sample is not None]

    def lease_hosts(self) -> list[HostState]:
        """Healthy hosts in the order leases should try them (ready replicas on the fullest host first)."""
        ordered = placement.lease_order(self.rooms())
        rest = [h.name for h in self.pool.healthy() if h.name not in ordered]  # no sample yet, or none ready
        return [self.pool.get(n) for n in ordered + rest]

    async def call(self, route: str, host: HostState, method: str, path: str, **kw: Any) -> HostResponse:
        start = time.perf_counter()
        try:
            return await self.pool.call(host, method, path, timeout=DEADLINES.get(route, DEADLINES["quick"]), **kw)
        finally:
            self.metrics.proxied.labels(route=route).observe(time.perf_counter() - start)

    async def forward(self, route: str, rid: str, lease_id: str, path: str, body: dict[str, Any]) -> HostResponse:
        """POST a replica's operation to its host, with the host's own ids."""
        host, local = ids.split(rid)
        body = {**body, "lease_id": _lease_on(host, lease_id)}
        return await self.call(route, self.pool.get(host), "POST", f"/v1/replicas/{local}/{path}", json=body)

    async def step(self, rid: str, req: StepRequest) -> Response:
        """A step, for the route and for its fast path (fastpath.py)."""
        return _passthrough(await self.forward("step", rid, req.lease_id, "step", req.model_dump(mode="json")))


def _passthrough(resp: HostResponse) -> Response:
    headers = {k: v for k, v in resp.headers.items() if k.lower() in ("retry-after", "www-authenticate")}
    return Response(resp.content, status_code=resp.status_code, media_type="application/json", headers=headers)


def _rewritten(resp: HostResponse, host: str, keys: tuple[str, ...] = ("replica_id", "lease_id")) -> Response:
    """The host's answer with its ids made fleet ids (errors pass through unchanged)."""
    if resp.status_code >= 300:
        return _passthrough(resp)
    body = resp.json()
    for key in keys:
        if isinstance(body.get(key), str):
            body[key] = ids.join(host, body[key])
    return JSONResponse(body, status_code=resp.status_code)


def _lease_on(host: str, fleet_lease: str) -> str:
    lease_host, local = ids.split(fleet_lease, "lease")
    if lease_host != host:
        raise Conflict(f"lease {fleet_lease} does not hold a replica on host {host}")
    return local


# Authentication as coroutines: FastAPI runs a plain function dependency in its thread pool, a hand-over to a
# worker thread and back on every proxied call (a large share of what the gateway added on a busy host).
async def _require_token(request: Request) -> None:
    auth.require_token(request)


async def _require_token_or_osgym_ip(request: Request) -> None:
    auth.require_token_or_osgym_ip(request)


# --- native API ---------------------------------------------------------------------------------------------
def _native(gw: Callable[[], Gateway]) -> APIRouter:
    r = APIRouter(
        prefix="/v1",
        dependencies=[Depends(_require_token)],
        tags=["replicas"],
        route_class=BoundaryRoute,
        responses=documented(401, 422),
    )

    @r.post("/leases", status_code=201, responses=documented(503), response_model=LeaseResponse)
    async def lease(req: LeaseRequest) -> Response:
        """Lease a ready replica on the host placement picks; another host if that one cannot."""
        g = gw()
        for i, host in enumerate(g.lease_hosts()):
            try:
                resp = await g.call("lease", host, "POST", "/v1/leases", json=req.model_dump(exclude_none=True))
            except OsfleetError:  # drained or too slow: the next host may have one
                continue
            if resp.status_code == 201:
                if i:
                    g.metrics.failovers.inc()
                return _rewritten(resp, host.name)
            if resp.status_code != 503:
                return _passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica to lease; try again shortly")

    @r.get("/replicas")
    async def replicas() -> list[dict[str, Any]]:
        g = gw()
        hosts = g.pool.healthy()
        answers = await asyncio.gather(
            *(g.call("quick", h, "GET", "/v1/replicas") for h in hosts), return_exceptions=True
        )
        out: list[dict[str, Any]] = []
        for host, resp in zip(hosts, answers, strict=True):
            if isinstance(resp, HostResponse) and resp.status_code == 200:
                out += [{**x, "id": ids.join(host.name, x["id"]), "host": host.name} for x in resp.json()]
        return out

    @r.post("/replicas", status_code=202, responses=documented(503))
    async def scale_up(req: ScaleRequest) -> dict[str, Any]:
        """More replicas, placed by each host's room on its binding resource (best fit)."""
        g = gw()
        plan = placement.scale_plan(g.rooms(), req.count)
        if not plan:
            raise CapacityError(f"the fleet has no room for {req.count} more replica(s)")
        for name, count in plan.items():
            body = {"count": count, **({"mode": req.mode} if req.mode else {})}
            resp = await g.call("quick", g.pool.get(name), "POST", "/v1/replicas", json=body)
            if resp.status_code != 202:
                return JSONResponse(resp.json(), status_code=resp.status_code)  # type: ignore[return-value]
        return {"requested": req.count, "mode": req.mode or "snapshot", "placement": plan}

    @r.delete("/replicas/{rid}", responses=documented(404, 409, 503), response_model=Retired)
    async def retire(rid: str) -> Response:
        host, local = ids.split(rid)
        return _rewritten(await gw().call("quick", gw().pool.get(host), "DELETE", f"/v1/replicas/{local}"), host)

    @r.get("/host")
    async def fleet_sample() -> dict[str, Any]:
        """Every host's own sample, health and room, for load tests and placement checks."""
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

    async def forward(route: str, rid: str, lease_id: str, path: str, body: dict[str, Any]) -> HostResponse:
        return await gw().forward(route, rid, lease_id, path, body)

    @r.post("/replicas/{rid}/reset", responses=documented(404, 409, 503), response_model=ResetResponse)
    async def reset(rid: str, req: ResetRequest) -> Response:
        body = req.model_dump(mode="json", exclude_none=True, exclude={"task"})
        if req.task is not None:
            body["task"] = req.task.model_dump(mode="json", exclude_unset=True)
        return _rewritten(await forward("reset", rid, req.lease_id, "reset", body), ids.split(rid)[0], ("replica_id",))

    @r.get("/replicas/{rid}/observation", responses=documented(404, 409, 503), response_model=Observation)
    async def observation(
        rid: str,
        lease_id: str = Query(min_length=1, max_length=400),
        format: Annotated[ImageFormat, Query(description=FORMAT_DOC)] = "png",
        quality: Annotated[int | None, Query(ge=1, le=100, description=QUALITY_DOC)] = None,
    ) -> Response:
        host, local = ids.split(rid)
        params: dict[str, Any] = {"lease_id": _lease_on(host, lease_id), "format": format}
        if quality is not None:
            params["quality"] = quality
        return _passthrough(
            await gw().call("quick", gw().pool.get(host), "GET", f"/v1/replicas/{local}/observation", params=params)
        )

    @r.post("/replicas/{rid}/step", responses=documented(404, 409, 503), response_model=StepResponse)
    async def step(rid: str, req: StepRequest) -> Response:
        """Served by the fast path (fastpath.py) when nothing about it is unusual; here otherwise."""
        return await gw().step(rid, req)

    @r.post("/replicas/{rid}/fork", status_code=201, responses=documented(404, 409, 503), response_model=ForkResponse)
    async def fork(rid: str, req: ForkRequest) -> Response:
        """Children start on the parent's host, where its saved memory and disk are."""
        host = ids.split(rid)[0]
        resp = await forward("fork", rid, req.lease_id, "fork", {"children": req.children})
        if resp.status_code >= 300:
            return _passthrough(resp)
        body = resp.json()
        body["parent_id"] = ids.join(host, body["parent_id"])
        for child in body["children"]:
            child["replica_id"] = ids.join(host, child["replica_id"])
            child["lease_id"] = ids.join(host, child["lease_id"])
        return JSONResponse(body, status_code=resp.status_code)

    @r.post("/replicas/{rid}/evaluate", responses=documented(404, 409, 503), response_model=Evaluation)
    async def evaluate(rid: str, req: LeaseBody) -> Response:
        return _passthrough(await forward("evaluate", rid, req.lease_id, "evaluate", {}))

    @r.post("/replicas/{rid}/release", responses=documented(404, 409), response_model=Released)
    async def release(rid: str, req: LeaseBody) -> Response:
        return _rewritten(
            await forward("release", rid, req.lease_id, "release", {}), ids.split(rid)[0], ("replica_id",)
        )

    return r


# --- OSGym wire compatibility -------------------------------------------------------------------------------
def _osgym(gw: Callable[[], Gateway]) -> APIRouter:
    r = APIRouter(
        dependencies=[Depends(_require_token_or_osgym_ip)],
        tags=["osgym"],
        route_class=BoundaryRoute,
        responses=documented(401, 422),
    )

    @r.post("/reset", responses=documented(503), response_model=OsgymResetResponse)
    async def reset(req: OsgymReset, request: Request) -> Response:
        g, who = gw(), auth.caller(request)
        body = {"task_config": req.task_config.model_dump(mode="json", exclude_unset=True), "timeout": req.timeout}
        for host in g.lease_hosts():
            try:
                resp = await g.call("reset", host, "POST", "/reset", json=body, client_id=who)
            except OsfleetError:  # drained or too slow: the next host may have one
                continue
            if resp.status_code == 200:
                out = resp.json()
                out["vm_id"] = ids.vm_to_fleet(host.index, int(out["vm_id"]))
                return JSONResponse(out)
            if resp.status_code != 503 or resp.json().get("kind") != "capacity":
                return _passthrough(resp)
        raise NoReplicaAvailableError("no host has a ready replica; try again shortly")

    def vm_host(fleet_vm: int) -> tuple[HostState, int]:
        index, local = ids.vm_from_fleet(fleet_vm)
        return gw().pool.by_index(index), local

    @r.post("/step", responses=documented(404, 409, 503), response_model=OsgymStepResponse)
    async def step(req: OsgymStep, request: Request) -> Response:
        host, local = vm_host(req.vm_id)
        body = {"action": req.action, "vm_id": local}
        return _passthrough(await gw().call("step", host, "POST", "/step", json=body, client_id=auth.caller(request)))

    @r.post("/shutdown", responses=documented(404), response_model=OsgymShutdownResponse)
    async def shutdown(req: OsgymShutdown, request: Request) -> Response:
        g, who = gw(), auth.caller(request)
        if req.vm_id == "all":
            hosts = g.pool.healthy()
            await asyncio.gather(
                *(g.call("release", h, "POST", "/shutdown", json={"vm_id": "all"}, client_id=who) for h in hosts),
                return_exceptions=True,
            )
            return JSONResponse({"vm_id": "all"})
        host, local = vm_host(req.vm_id)
        resp = await g.call("release", host, "POST", "/shutdown", json={"vm_id": local}, client_id=who)
        return JSONResponse({"vm_id": req.vm_id}) if resp.status_code == 200 else _passthrough(resp)

    @r.get("/screenshot", responses=documented(404, 409, 503), response_model=OsgymScreenshot)
    async def screenshot(request: Request, vm_id: int = Query(alias="vmId")) -> Response:
        host, local = vm_host(vm_id)
        resp = await gw().call(
            "quick", host, "GET", "/screenshot", params={"vmId": local}, client_id=auth.caller(request)
        )
        if resp.status_code != 200:
            return _passthrough(resp)
        return JSONResponse({**resp.json(), "vm_id": vm_id})

    return r


# --- the app ------------------------------------------------------------------------------------------------
def _render_metrics(g: Gateway) -> bytes:
    m = g.metrics
    m.hosts.labels(state="healthy").set(len(g.pool.healthy()))
    m.hosts.labels(state="drained").set(len(g.pool.hosts) - len(g.pool.healthy()))
    for h in g.pool.hosts:
        m.drains.labels(host=h.name).set(h.drains)
    return bytes(generate_latest(m.registry))


def create_gateway(token: str, entries: list[HostEntry], osgym_allowed_ips: tuple[str, ...] = ()) -> FastAPI:
    holder: dict[str, Gateway] = {}

    def gw() -> Gateway:
        return holder["gw"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with HostClient() as client:
            pool = HostPool(entries, client)
            holder["gw"] = Gateway(pool)
            await pool.poll_once()  # a restarted gateway knows its hosts before the first request
            poller = asyncio.create_task(pool.poll_forever())
            try:
                yield
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller

    app = FastAPI(title="osfleet fleet gateway", version=__version__, lifespan=lifespan)
    app.state.config = AgentConfig(token=token, osgym_allowed_ips=osgym_allowed_ips)
    errors.install(app)
    app.add_middleware(StepFastPath, gw=gw)
    app.include_router(_native(gw))
    app.include_router(_osgym(gw))

    @app.get("/health", tags=["meta"], responses={503: {"description": "no host is healthy"}})
    def health() -> Response:
        """200 while at least one host is healthy; every host's state either way."""
        pool = gw().pool
        body = {
            "status": "ok" if pool.healthy() else "failing",
            "hosts": {h.name: {"healthy": h.healthy, "reason": h.reason} for h in pool.hosts},
        }
        return JSONResponse(body, status_code=200 if pool.healthy() else 503)

    add_metrics_route(app, lambda: _render_metrics(gw()))

    # --- the dashboard at /ui over every host's (osfleet.ui; not in the OpenAPI) ----------------------------
    from osfleet.ui import FleetBackend
    from osfleet.ui import install as install_ui

    dashboard = FleetBackend(gw)
    install_ui(app, lambda: dashboard, "osfleet fleet gateway")

    return app


__all__ = ["create_gateway"]
