"""The fleet gateway: the host agent's HTTP contract (native ``/v1`` and OSGym's endpoints) over many hosts.

Stateless: fleet ids name their host (ids.py), placement reads the hosts' own samples (placement.py) and
health comes from polling them (hosts.py), so a restarted gateway knows everything again after one poll.
Bodies are passed through as the host wrote them where no id needs rewriting (a step's observation is
hundreds of kilobytes: parsing it would cost the client latency for nothing). Calls to the hosts go through
hostclient.py, and a plain step skips FastAPI's routing and dependencies (fastpath.py): together they took
what the gateway adds to a step on a busy 2-core host from about 6 ms to about 2 (in front of a stand-in host;
``osfleet bench chaos`` measures it in front of real replicas: ``gateway_overhead``).

The gateway is the edge: it authenticates its callers itself (the operator's ``--token-file`` token, the
clients of ``--clients-file``, OSGym callers by address), never trusts an incoming ``X-Osfleet-Client``, and
reaches its hosts with their operator token, naming the client it acts for (gateway.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest

from osfleet import __version__
from osfleet.api import auth, errors, probes
from osfleet.api.contract import add_metrics_route
from osfleet.api.limits import BodyLimit
from osfleet.config import DEFAULT_MAX_BODY_BYTES, AgentConfig, ClientToken
from osfleet.fleet import routes
from osfleet.fleet.discovery import Discovery, KubeDiscovery
from osfleet.fleet.fastpath import StepFastPath
from osfleet.fleet.gateway import DEADLINES, Gateway
from osfleet.fleet.hostclient import HostClient
from osfleet.fleet.hosts import HostEntry, HostPool


def _render_metrics(gateway: Gateway) -> bytes:
    m = gateway.metrics
    m.hosts.labels(state="healthy").set(len(gateway.pool.healthy()))
    m.hosts.labels(state="drained").set(len(gateway.pool.hosts) - len(gateway.pool.healthy()))
    for h in gateway.pool.hosts:
        m.drains.labels(host=h.name).set(h.drains)
    return bytes(generate_latest(m.registry))


def create_gateway(
    token: str,
    entries: list[HostEntry],
    osgym_allowed_ips: tuple[str, ...] = (),
    clients: tuple[ClientToken, ...] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    discovery: Discovery | None = None,
) -> FastAPI:
    """``token``: the gateway's operator token; ``clients``: its tenants (see ``osfleet.api.auth``);
    ``discovery``: hosts found in Kubernetes besides ``entries`` (``osfleet.fleet.discovery``)."""
    running: dict[str, Gateway] = {}  # the one the lifespan made

    def get_gateway() -> Gateway:
        return running["gateway"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # callers' calls and health polls on connections of their own (hosts.py says why)
        async with HostClient() as client, HostClient() as poll_client:
            pool = HostPool(entries, client, auth.gateway_id(token), poll_client)
            running["gateway"] = Gateway(pool)
            await pool.poll_once()  # a restarted gateway knows its hosts before the first request
            tasks = [asyncio.create_task(pool.poll_forever())]
            if discovery is not None:
                tasks.append(asyncio.create_task(KubeDiscovery(discovery, pool).run()))
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    app = FastAPI(title="osfleet fleet gateway", version=__version__, lifespan=lifespan)
    app.state.config = AgentConfig(
        token=token,
        osgym_allowed_ips=osgym_allowed_ips,
        clients=clients,
        max_body_bytes=max_body_bytes,
        on_behalf_of=False,  # the edge: X-Osfleet-Client is the gateway's to set, never a caller's
    )
    errors.install(app)
    app.add_middleware(StepFastPath, get_gateway=get_gateway)
    app.add_middleware(auth.AuthBeforeBody)  # no body is read, by the fast path or a route, for a stranger
    app.add_middleware(BodyLimit, limit=lambda: max_body_bytes)  # outermost: in front of the fast path too
    app.include_router(routes.routes(get_gateway).complete())

    @app.get("/health", tags=["meta"], responses={503: {"description": "no host is healthy"}})
    async def health(request: Request) -> Response:
        """200 while at least one host is healthy, else 503; ``status`` only without a token, the largest request
        body the gateway takes with one (an upload's bound), and with the operator's every host's state and why
        (host names and addresses are the operator's to know)."""
        pool = get_gateway().pool
        body: dict[str, object] = {"status": "ok" if pool.healthy() else "failing"}
        who = auth.principal_if_any(request)
        if who is not None:
            body["max_body_bytes"] = max_body_bytes
        if who is not None and who.operator:
            body["hosts"] = {h.name: {"healthy": h.healthy, "reason": h.reason} for h in pool.hosts}
        return JSONResponse(body, status_code=200 if pool.healthy() else 503)

    probes.install(app, ready=lambda: bool(get_gateway().pool.healthy()))  # /livez and /readyz, for Kubernetes

    async def render_metrics() -> bytes:
        return _render_metrics(get_gateway())

    add_metrics_route(app, render_metrics)

    # --- the dashboard at /ui over every host's (osfleet.ui; not in the OpenAPI) ----------------------------
    from osfleet.ui import FleetBackend
    from osfleet.ui import install as install_ui

    dashboard = FleetBackend(get_gateway)
    install_ui(app, lambda: dashboard, "osfleet fleet gateway")

    return app


__all__ = ["DEADLINES", "Gateway", "create_gateway"]
