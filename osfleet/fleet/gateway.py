"""The gateway's core: its hosts, its metrics, and calls to a host on behalf of a principal.

Every call to a host carries the gateway's own credential (the host's operator token) and, for a client, the
client's name in ``X-Osfleet-Client``: the host applies the client's rules (its own replicas only, no root
shell). A call is failed over to another host only when it never reached the first (drained, or the
connection refused); a host that timed out may still have done it (a lease made there would be orphaned).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from osfleet.api.auth import Principal
from osfleet.api.errors import Conflict
from osfleet.api.models import StepRequest
from osfleet.fleet import ids, placement
from osfleet.fleet.hostclient import HostResponse
from osfleet.fleet.hosts import HostPool, HostState

# Deadlines of proxied calls: a cold reset boots a desktop (about a minute under TCG); a step may run a
# guest command for up to its own timeout; everything else is quick.
DEADLINES = {
    "lease": 30.0,
    "fork": 600.0,  # saving the parent, then N children (a few seconds each under TCG)
    "reset": 400.0,
    "step": 700.0,
    "evaluate": 300.0,
    "upload_file": 300.0,  # a file into the guest (the host gives it guest_files.FILE_SECONDS, after any step)
    "download_file": 300.0,
    "open_tunnel": 120.0,  # the guest's relay starts on a replica's first tunnel (python3 in a TCG guest)
    "tunnel_receive": 60.0,  # waits up to MAX_TUNNEL_WAIT (25 s) for bytes
    "video": 900.0,  # a recorded episode encoded as MP4 by its host (the dashboard's download)
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
        self._fullest: list[HostState] = []  # every sampled host, fullest first, as of pool version ...
        self._fullest_of = -1  # ... this one

    def rooms(self) -> list[placement.Room]:
        return [placement.room(h.name, h.sample) for h in self.pool.healthy() if h.sample is not None]

    def lease_hosts(self) -> Iterator[HostState]:
        """Healthy hosts in the order leases should try them: those with a ready replica, the fullest first, then
        the others (no sample yet, or none ready when last seen: a host refills its warm pool between polls).

        The order is computed once per change of the hosts' samples, not per lease, and a host's ready count is
        this gateway's own between two polls (``took_lease``): at 100 hosts, leases that asked every full host
        first until the next poll made 3 calls in vain for each one granted (``osfleet bench gateway``)."""
        if self._fullest_of != self.pool.version:
            rooms = [placement.room(h.name, h.sample) for h in self.pool.hosts if h.sample is not None]
            self._fullest = [self.pool.get(n) for n in placement.fullest_first(rooms)]
            self._fullest_of = self.pool.version
        asked = set()
        for host in self._fullest:
            if host.healthy and host.ready:
                asked.add(host.name)
                yield host
        for host in self.pool.hosts:
            if host.healthy and host.name not in asked:
                yield host

    def took_lease(self, host: HostState, status: int) -> None:
        """What a lease's answer says of the host's ready replicas until its next poll: one fewer after a lease
        (201, or 200 from OSGym's reset), none left after a refusal for capacity (503)."""
        if status in (200, 201) and host.ready:
            host.ready -= 1
        elif status == 503:
            host.ready = 0

    async def call(
        self, route: str, host: HostState, method: str, path: str, who: Principal, **kw: Any
    ) -> HostResponse:
        """A call to ``host`` for ``who`` (named to the host unless it is the operator), within the route's
        deadline."""
        start = time.perf_counter()
        client_id = None if who.operator else who.name
        try:
            return await self.pool.call(
                host, method, path, timeout=DEADLINES.get(route, DEADLINES["quick"]), client_id=client_id, **kw
            )
        finally:
            self.metrics.proxied.labels(route=route).observe(time.perf_counter() - start)

    async def forward(
        self, route: str, rid: str, lease_id: str, path: str, body: dict[str, Any], who: Principal
    ) -> HostResponse:
        """POST a replica's operation to its host, with the host's own ids."""
        host, local = ids.split(rid)
        body = {**body, "lease_id": lease_on(host, lease_id)}
        return await self.call(route, self.pool.get(host), "POST", f"/v1/replicas/{local}/{path}", who, json=body)

    async def step(self, rid: str, req: StepRequest, who: Principal) -> Response:
        """A step: the route's and its fast path's (fastpath.py), one function for both."""
        return passthrough(await self.forward("step", rid, req.lease_id, "step", req.model_dump(mode="json"), who))


# Headers of a host's answer that its caller gets too: ``Server-Timing`` says where the host spent the request's
# time (``osfleet.measure.timing``), which a client through the gateway wants as much as one at the host.
RELAYED_HEADERS = ("retry-after", "www-authenticate", "server-timing")


def passthrough(resp: HostResponse, media_type: str = "application/json") -> Response:
    """The host's answer as it was (a JSON body unless ``media_type`` says otherwise: a file's bytes)."""
    return Response(resp.content, status_code=resp.status_code, media_type=media_type, headers=_relayed(resp))


def rewritten(resp: HostResponse, host: str, keys: tuple[str, ...] = ("replica_id", "lease_id")) -> Response:
    """The host's answer with its ids made fleet ids (errors pass through unchanged)."""
    if resp.status_code >= 300:
        return passthrough(resp)
    body = resp.json()
    for key in keys:
        if isinstance(body.get(key), str):
            body[key] = ids.join(host, body[key])
    return JSONResponse(body, status_code=resp.status_code, headers=_relayed(resp))


def _relayed(resp: HostResponse) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k in RELAYED_HEADERS}  # HostResponse's names are lower case


def lease_on(host: str, fleet_lease: str) -> str:
    lease_host, local = ids.split(fleet_lease, "lease")
    if lease_host != host:
        raise Conflict(f"lease {fleet_lease} does not hold a replica on host {host}")
    return local
