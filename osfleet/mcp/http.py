"""Streamable HTTP for ``osfleet mcp serve``: the agent's surface at ``/mcp`` and, with a grader token, the grader's at
``/grader``, each behind its own token (``osfleet.serving_gate``), one process, one ``Board`` between them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from mcp.server.fastmcp import FastMCP
from starlette.applications import Starlette
from starlette.types import ASGIApp

from osfleet.mcp.desk import Desk
from osfleet.serving_gate import ServingGate, Surfaces

AGENT_PATH = "/mcp"
GRADER_PATH = "/grader"


def app(
    agent: FastMCP[Desk],
    agent_token: str,
    grader: FastMCP[Desk] | None = None,
    grader_token: str | None = None,
    origins: list[str] | None = None,
) -> ASGIApp:
    """The ASGI app of both surfaces: the agent's token opens ``/mcp`` only, the grader's ``/grader`` only."""
    servers = [agent] if grader is None else [agent, grader]
    routes = [route for server in servers for route in server.streamable_http_app().routes]

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for server in servers:
                await stack.enter_async_context(server.session_manager.run())
            yield

    inner = Starlette(routes=routes, lifespan=lifespan)
    agents = ServingGate(inner, agent_token, origins=origins)
    if grader is None or grader_token is None:
        return agents
    return Surfaces(agents, {GRADER_PATH: ServingGate(inner, grader_token, origins=origins)})
