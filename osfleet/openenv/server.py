"""``osfleet openenv serve``: OpenEnv's own server (openenv-core) in front of a host agent or gateway.

openenv-core's app serves its protocol (``/reset``, ``/step``, ``/state``, ``/health``, ``/schema``,
``/metadata`` and the ``/ws`` sessions its ``EnvClient`` uses); this module only supplies the environment
(``DesktopEnvironment``) and the fleet client every session shares. Two surfaces (``served``): the agent's at
``/`` and, given a grader token, the grader's at ``/grader`` (its reset takes a task body, its ended episodes say
every criterion). OpenEnv's protocol has no authentication of its own; ``osfleet.serving_gate`` is in front of
each (the agent's: a client token of this server's own, or a same-user peer on loopback; the grader's: its own
token only; Origin for both), and the server listens on loopback unless told otherwise.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from osfleet.client import Fleet
from osfleet.client.types import TaskLike
from osfleet.errors import OsfleetError
from osfleet.protocol.models import ImageFormat
from osfleet.serving_gate import ServingGate, Surfaces

if TYPE_CHECKING:  # openenv-core is imported when an app is made, not with this module
    from osfleet.openenv.environment import Role


GRADER_PATH = "/grader"


def create_openenv_app(
    fleet: Fleet,
    *,
    task: TaskLike | None = None,
    max_steps: int = 50,
    observation_format: ImageFormat = "png",
    max_sessions: int = 64,
    lease_seconds: float | None = None,
    role: Role = "agent",
) -> Any:
    """The ASGI app of one surface: openenv-core's server over ``DesktopEnvironment`` sessions of ``role``."""
    os.environ.setdefault("ENABLE_WEB_INTERFACE", "false")  # openenv-core's Gradio UI is not served
    from openenv.core.env_server.http_server import create_fastapi_app

    from osfleet.openenv.environment import (
        DesktopAction,
        DesktopEnvironment,
        DesktopObservation,
        Frontend,
    )

    front = Frontend(fleet, task, max_steps, observation_format, lease_seconds)
    return create_fastapi_app(
        lambda: DesktopEnvironment(front, role), DesktopAction, DesktopObservation, max_concurrent_envs=max_sessions
    )


def served(
    agents: Any,
    client_token: str,
    grader: Any = None,
    grader_token: str | None = None,
    origins: list[str] | None = None,
) -> ASGIApp:
    """Both surfaces behind their gates: the agents' app at ``/`` (the client token, or a same-user peer on
    loopback), the grader's at ``/grader`` (its own token only)."""
    apps = [agents] if grader is None else [grader, agents]

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:  # each app's own start-up (openenv-core's idle-session reaper)
            for app in apps:
                await stack.enter_async_context(app.router.lifespan_context(app))
            yield

    routes = [Mount("/", app=agents)] if grader is None else [Mount(GRADER_PATH, app=grader), Mount("/", app=agents)]
    inner = Starlette(routes=routes, lifespan=lifespan)
    gate = ServingGate(inner, client_token, same_user_peers=True, origins=origins)
    if grader is None or grader_token is None:
        return gate
    return Surfaces(gate, {GRADER_PATH: ServingGate(inner, grader_token, origins=origins)})


def check_bind(bind: str, allow_remote: bool) -> None:
    """Clients beyond loopback send the client token, in clear over plain HTTP: only when the operator says so."""
    try:
        loopback = ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = bind == "localhost"
    if not loopback and not allow_remote:
        raise OsfleetError(
            f"--bind {bind}: clients beyond loopback must send the client token (in clear unless --tls-cert is "
            "given); pass --allow-remote to listen beyond loopback"
        )
