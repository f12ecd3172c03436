"""The host agent: a FastAPI service over the replicas of one host.

State (the replica host and the episodes) is created in the app's lifespan; nothing happens at import.
Routes live one module per resource in ``osfleet.api.routes`` (leases, replicas, episodes, files, OSGym's) and are
joined here with their shared auth and error docs. Handlers that block on libvirt are plain (threaded)
functions, in a thread pool sized to the host's replicas; what must always answer (``/health``, ``/v1/host``,
``/metrics``) never waits for that pool. Request bodies over the limit are refused before anything else, and a
body is read only once its caller is known (``auth.AuthBeforeBody``) and within its client's fair share
(``admission.Admission``: 429 past it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from osfleet import __version__
from osfleet.api import auth, errors, probes
from osfleet.api.admission import Admission, Ledger
from osfleet.api.contract import Routes, add_metrics_route
from osfleet.api.host import AgentHost
from osfleet.api.limits import BodyLimit, size_thread_pool
from osfleet.api.models import Health
from osfleet.api.operations import OPERATIONS
from osfleet.api.routes import checkpoints, episodes, files, leases, osgym, replicas, tunnels
from osfleet.api.state import AgentState
from osfleet.config import AgentConfig


def create_app(config: AgentConfig, host_factory: Callable[[], AgentHost]) -> FastAPI:
    """``host_factory`` runs in the lifespan: the replica host (adopting what is on disk) lives as long as
    the app, and its background monitor and warm pool run meanwhile."""
    running: dict[str, AgentState] = {}  # the one the lifespan made

    def state() -> AgentState:
        return running["state"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        host = host_factory()
        try:
            size_thread_pool(host.max_replicas)
            host.adopt()
            running["state"] = AgentState(host, config)
            host.start_background()
            yield
        finally:
            if "state" in running:
                running["state"].close()
            host.close()

    app = FastAPI(title="osfleet host agent", version=__version__, lifespan=lifespan)
    app.state.config = config
    errors.install(app, on_error=lambda kind: state().metrics.failure(kind) if "state" in running else None)

    def ledger() -> Ledger | None:
        return running["state"].ledger if "state" in running else None

    def vm_replica(vm_id: int, who: auth.Principal) -> str | None:
        """The replica of an OSGym vm ``who`` holds (OSGym's step waits for its turn: ``api.osgym_turn``)."""
        if "state" not in running:
            return None
        try:
            return running["state"].vm(vm_id, who)[0]
        except errors.NotFound:
            return None

    app.add_middleware(  # fair shares
        Admission, ledger=ledger, max_body_bytes=lambda: config.max_body_bytes, vm_replica=vm_replica
    )
    app.add_middleware(auth.AuthBeforeBody)
    app.add_middleware(BodyLimit, limit=lambda: config.max_body_bytes)  # outermost: 413 before anything

    routes = Routes(OPERATIONS)
    for resource in (leases, replicas, episodes, files, tunnels, checkpoints, osgym):
        resource.mount(routes, state)
    app.include_router(routes.complete())

    @app.get(
        "/health",
        tags=["meta"],
        response_model=Health,
        response_model_exclude_none=True,
        responses={503: {"model": Health, "description": "a background thread died"}},
    )
    async def health(request: Request) -> Response:
        """Up or down, to anyone: 200 while the agent works, 503 when its monitor or warm pool has died, and
        nothing else without a token (an open port must not tell how busy the host is). A token adds the image
        and the accelerator; the operator's adds the replicas by state and the problem. Answered on the event
        loop from memory: never waits for a thread, however many steps are under way."""
        s = state()
        ok = s.host.background_alive()
        body = Health(status="ok" if ok else "failing")
        who = auth.principal_if_any(request)
        if who is not None:
            body.image, body.accelerator = s.host.image.name, s.host.accel
            body.max_body_bytes = config.max_body_bytes
        if who is not None and who.operator:
            counts: dict[str, int] = {}
            for rec in s.host.replicas():
                counts[rec.state.value] = counts.get(rec.state.value, 0) + 1
            body.replicas = counts
            body.problem = None if ok else "the failure monitor or the warm pool has stopped"
        return JSONResponse(body.model_dump(exclude_none=True), status_code=200 if ok else 503)

    probes.install(app, ready=lambda: "state" in running and running["state"].host.background_alive())

    async def render_metrics() -> bytes:
        s = state()
        return await asyncio.get_running_loop().run_in_executor(s.sampler, s.metrics.render, s.host, s.ledger)

    add_metrics_route(app, render_metrics)

    # --- the dashboard at /ui (osfleet.ui; not in the OpenAPI) ---------------------------------------------
    from osfleet.ui import LocalBackend
    from osfleet.ui import install as install_ui

    async def sample() -> dict[str, object]:
        return await replicas.sample(state())

    dashboard = LocalBackend(state, sample)
    install_ui(app, lambda: dashboard, "osfleet host agent")

    return app


__all__ = ["AgentState", "create_app"]
