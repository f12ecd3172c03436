"""Liveness and readiness, apart, for Kubernetes (and anything that restarts or routes by probes).

``/livez``: the process is alive (its event loop answers); a kubelet restarts a container that fails it. ``/readyz``:
it can serve now (the host agent's failure monitor and warm pool run; a gateway has a healthy host); a failing
pod is taken out of its Service's endpoints, and the gateway's pod discovery holds a host whose agent pod is not
Ready (``osfleet.fleet.discovery``). Both once answered on ``/health``, so a host agent that could not recover
was restarted in a loop instead of being taken out of service while its replicas, on the node, stayed as they
were. ``/health`` stays as it was (200 or 503, with details for a token) for the gateway's polls and for people.

Both are open (a probe has no token), answered from memory on the event loop, and say nothing but ``status``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
PATHS = frozenset({LIVENESS_PATH, READINESS_PATH})


class ProbeStatus(BaseModel):
    status: Literal["ok", "failing"]


def install(app: FastAPI, ready: Callable[[], bool]) -> None:
    """Add ``/livez`` and ``/readyz`` to ``app``; ``ready()`` says whether it can serve (never blocks)."""

    @app.get(LIVENESS_PATH, tags=["meta"], response_model=ProbeStatus)
    async def livez() -> ProbeStatus:
        """200 while the process answers: a failing liveness probe restarts the container, so nothing a restart
        cannot fix makes it fail (a host that cannot recover fails ``/readyz`` instead)."""
        return ProbeStatus(status="ok")

    @app.get(
        READINESS_PATH,
        tags=["meta"],
        response_model=ProbeStatus,
        responses={503: {"model": ProbeStatus, "description": "it cannot serve now"}},
    )
    async def readyz() -> Response:
        """200 while it can serve, 503 while it cannot: a failing readiness probe takes the pod out of its
        Service (and the gateway's discovery holds the host) until it can again, without restarting it."""
        ok = ready()
        return JSONResponse({"status": "ok" if ok else "failing"}, status_code=200 if ok else 503)
