"""``osfleet host serve`` and ``osfleet host tune``: the host agent and its host settings."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import api_token, serve
from osfleet.cli_support import friendly as _friendly
from osfleet.config import MODES, Mode, Settings

F = TypeVar("F", bound=Callable[..., Any])


# --- host agent ---------------------------------------------------------------------------------------------
@click.group()
def host() -> None:
    """The host agent: an authenticated HTTP API over this host's replicas."""


@host.command("serve")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--mode", type=click.Choice(MODES), default="snapshot", show_default=True)
@click.option("--warm", default=1, show_default=True, type=click.IntRange(0, 4096), help="replicas kept ready")
@click.option("--lease-seconds", default=900.0, show_default=True, help="default lease length")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="bearer token file (default: $OSFLEET_API_TOKEN, else $OSFLEET_HOME/api-token, made if missing)",
)
@click.option("--osgym-allow", multiple=True, help="client IP allowed on the OSGym endpoints without a token")
@click.option(
    "--max-replicas",
    default=None,
    type=click.IntRange(1, 100000),
    help="most replicas this host holds (default: from its memory, ~160 MiB each with template memory)",
)
@click.option(
    "--park/--no-park",
    default=False,
    envvar="OSFLEET_PARK",
    show_envvar=True,
    help="keep ready replicas paused until leased: no CPU while idle, ~0.1 s more per lease (default off)",
)
@click.option(
    "--record/--no-record",
    default=False,
    envvar="OSFLEET_RECORD",
    show_envvar=True,
    help="record every episode into $OSFLEET_HOME/trajectories (default off; on in benches)",
)
@click.option("--record-format", type=click.Choice(["jpeg", "webp"]), default="jpeg", show_default=True)
@click.option("--record-quality", default=75, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--record-max-mib", default=2048, show_default=True, type=click.IntRange(1), help="size cap of the recordings"
)
@click.option("--record-max-episodes", default=None, type=click.IntRange(1), help="keep at most this many episodes")
@_friendly
def host_serve(
    bind: str,
    port: int,
    image_ref: str | None,
    mode: Mode,
    warm: int,
    lease_seconds: float,
    token_file: Path | None,
    osgym_allow: tuple[str, ...],
    max_replicas: int | None,
    park: bool,
    record: bool,
    record_format: str,
    record_quality: int,
    record_max_mib: int,
    record_max_episodes: int | None,
) -> None:
    """Serve lease/reset/observe/step/evaluate/release and OSGym's endpoints until interrupted."""
    from osfleet.api.app import create_app
    from osfleet.config import AgentConfig
    from osfleet.images import find_image
    from osfleet.replicas.manager import ReplicaHost

    settings = Settings.from_env()
    image = find_image(image_ref, settings)
    token = api_token(token_file, settings.token_file, say=lambda m: click.echo(m, err=True))
    from osfleet.config import RecordingConfig

    recording = (
        RecordingConfig(
            image_format=record_format,  # type: ignore[arg-type]  # a click.Choice of the two
            quality=record_quality,
            max_bytes=record_max_mib * 2**20,
            max_episodes=record_max_episodes,
        )
        if record
        else None
    )
    config = AgentConfig(
        token=token,
        image=image.name,
        mode=mode,
        warm=warm,
        lease_seconds=lease_seconds,
        osgym_allowed_ips=osgym_allow,
        recording=recording,
    )
    app = create_app(
        config,
        lambda: ReplicaHost(
            image,
            settings,
            mode=mode,
            warm=warm,
            say=lambda m: click.echo(m, err=True),
            max_replicas=max_replicas,
            park=park,
        ),
    )
    click.echo(f"osfleet host agent on http://{bind}:{port} ({image.name}, {mode} resets, {warm} warm)", err=True)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()  # from --log-level
    serve(app, bind, port, level)  # graceful shutdown on SIGHUP too


@host.command("tune")
@click.option("--ksm/--no-ksm", default=None, help="KSM on or off (default: on unless OSFLEET_TENANCY=multi)")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def host_tune(ksm: bool | None, as_json: bool) -> None:
    """Host settings for density: KSM with sane scan rates (kept off when replicas serve different users)."""
    from osfleet.host_tune import tune

    result = tune(Settings.from_env(), ksm)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"KSM {result['ksm_reason']}; now saving {result['ksm'].get('saved_bytes', 0) >> 20} MiB")
