"""``osfleet openenv serve``: OpenEnv's own server (openenv-core) in front of a host agent or gateway.

openenv-core's app serves its protocol (``/reset``, ``/step``, ``/state``, ``/health``, ``/schema``,
``/metadata`` and the ``/ws`` sessions its ``EnvClient`` uses); this module only supplies the environment
(``DesktopEnvironment``) and the fleet client every session shares. OpenEnv's protocol has no authentication of
its own; the CLI puts ``osfleet.serving_gate`` in front (a client token of this server's own, same-user peers on
loopback, Origin), and the server listens on loopback unless told otherwise.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from osfleet.client import Fleet
from osfleet.client.types import TaskLike
from osfleet.errors import OsfleetError
from osfleet.protocol.models import ImageFormat


def create_openenv_app(
    fleet: Fleet,
    *,
    task: TaskLike | None = None,
    max_steps: int = 50,
    observation_format: ImageFormat = "png",
    max_sessions: int = 64,
    lease_seconds: float | None = None,
) -> Any:
    """The ASGI app: openenv-core's server over ``DesktopEnvironment`` sessions."""
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
        lambda: DesktopEnvironment(front), DesktopAction, DesktopObservation, max_concurrent_envs=max_sessions
    )


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
