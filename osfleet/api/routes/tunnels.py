"""Tunnels: TCP connections from the client to ports on a leased replica's own loopback (``osfleet.replicas.tunnels``).

As every operation on one replica, a request finds its episode first (404 for another client's replica, 409 for a
lease that does not hold it); the host checks the lease again under the replica's lock and only then looks the
tunnel up (404 for one that is not this lease's). Reads and writes happen outside the replica's lock and the
episode's, so a receive waiting for bytes, or a send waiting for room in its stream's bounded queue, never holds a
step up, and its wait holds no worker thread either (409 when the replica takes nothing for ``SEND_SECONDS``); an
opening tunnel waits for the guest's answer the same way, its lock let go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from osfleet.api.auth import Caller
from osfleet.api.contract import OctetStream, RawBody, Routes
from osfleet.api.models import TunnelClosed, TunnelOpened, TunnelQuery, TunnelReceiveQuery, TunnelRequest, TunnelSent
from osfleet.api.operations import CLOSE_TUNNEL, OPEN_TUNNEL, TUNNEL_RECEIVE, TUNNEL_SEND
from osfleet.api.state import AgentState
from osfleet.replicas.tunnels import Stream


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(OPEN_TUNNEL)
    async def open_tunnel(rid: str, req: TunnelRequest, who: Caller) -> TunnelOpened:
        # asked under the replica's lock in a worker thread; the guest's answer is awaited after both are let go
        s = state()

        def ask() -> Stream:
            live = s.episode(rid, req.lease_id, who)
            return live.on(s.host, who).open_tunnel(rid, req.port)

        stream = await s.host.tunnels.opened(await run_in_threadpool(ask))
        return TunnelOpened(tunnel_id=stream.id, port=stream.port)

    @routes(TUNNEL_SEND)
    async def tunnel_send(rid: str, query: Annotated[TunnelQuery, Query()], data: RawBody, who: Caller) -> TunnelSent:
        # the lease checked in a worker thread (it may wait for the replica's lock); waiting for room in the
        # stream's queue holds none (a replica that stops reading cannot hold the host's threads)
        s = state()

        def find() -> Stream:
            live = s.episode(rid, query.lease_id, who)
            return live.on(s.host, who).tunnel(rid, query.tunnel_id)

        stream = await run_in_threadpool(find)
        await s.host.tunnels.send(stream, data)
        return TunnelSent(bytes=len(data))

    @routes(TUNNEL_RECEIVE)
    async def tunnel_receive(rid: str, query: Annotated[TunnelReceiveQuery, Query()], who: Caller) -> Response:
        # the lease checked in a worker thread (it may wait for the replica's lock); the wait itself holds none
        s = state()

        def find() -> Stream:
            live = s.episode(rid, query.lease_id, who)
            return live.on(s.host, who).tunnel(rid, query.tunnel_id)

        stream = await run_in_threadpool(find)
        return OctetStream(await s.host.tunnels.receive(stream, query.max_bytes, query.wait))

    @routes(CLOSE_TUNNEL)
    def close_tunnel(rid: str, query: Annotated[TunnelQuery, Query()], who: Caller) -> TunnelClosed:
        s = state()
        live = s.episode(rid, query.lease_id, who)
        stream = live.on(s.host, who).tunnel(rid, query.tunnel_id)
        s.host.tunnels.close(stream)
        return TunnelClosed(tunnel_id=stream.id)
