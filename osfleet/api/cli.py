"""``osfleet host serve`` and ``osfleet host tune``: the host agent and its host settings."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import api_token, file_option, serve, tenant_options
from osfleet.cli_support import friendly as _friendly
from osfleet.config import DEFAULT_CLIENT_SHARE, Settings
from osfleet.protocol.models import MODES, Mode
from osfleet.tls import Listener, listener_options

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
@tenant_options
@file_option(
    "--metrics-token-file",
    "a token that reads /metrics and nothing else (a Prometheus server's); /metrics takes the operator's token "
    "too, from loopback as from anywhere",
)
@click.option(
    "--client-share",
    default=DEFAULT_CLIENT_SHARE,
    show_default=True,
    type=click.FloatRange(0.01, 1.0),
    help="the most of each host-wide budget one client may hold: evaluation slots, saved forks and checkpoints, "
    "recordings (past it: 429, 409 or 413 for that client alone, with the reason)",
)
@click.option(
    "--allow-agent-root/--no-allow-agent-root",
    default=False,
    show_default=True,
    help="let clients' shell actions run as root in the guest (root can forge what verifiers read)",
)
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
@click.option(
    "--replica-network",
    default=None,
    metavar="off|nat|proxy=URL",
    help="outbound network for replicas (default off: no network device); nat, or only the HTTP(S) proxy "
    "http://IP:PORT; never to each other or this host (OSFLEET_REPLICA_NETWORK)",
)
@_friendly
@listener_options
def host_serve(
    bind: str,
    port: int,
    image_ref: str | None,
    mode: Mode,
    warm: int,
    lease_seconds: float,
    token_file: Path | None,
    clients_file: Path | None,
    metrics_token_file: Path | None,
    client_share: float,
    allow_agent_root: bool,
    max_body_mib: int,
    osgym_allow: tuple[str, ...],
    max_replicas: int | None,
    park: bool,
    record: bool,
    record_format: str,
    record_quality: int,
    record_max_mib: int,
    record_max_episodes: int | None,
    replica_network: str | None,
    listener: Listener,
) -> None:
    """Serve lease/reset/observe/step/evaluate/release and OSGym's endpoints until interrupted."""
    from osfleet.api.app import create_app
    from osfleet.api.auth import load_clients
    from osfleet.api.uninstall import DaemonSetOwner, check_at_start, uninstalled
    from osfleet.config import AgentConfig
    from osfleet.replicas.manager import ReplicaHost
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    if replica_network is not None:
        import dataclasses

        settings = dataclasses.replace(settings, replica_network=replica_network)  # checked as it is made
    token = api_token(token_file, settings.token_file, say=lambda m: click.echo(m, err=True))
    clients = load_clients(clients_file, token) if clients_file is not None else ()
    metrics_token = api_token(metrics_token_file, settings.token_file) if metrics_token_file is not None else None
    if metrics_token is not None and metrics_token == token:
        raise click.UsageError("--metrics-token-file holds the operator's token: give Prometheus a token of its own")
    image = find_image(image_ref, settings)
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
        clients=clients,
        allow_agent_root=allow_agent_root,
        max_body_bytes=max_body_mib * 2**20,
        metrics_token=metrics_token,
        client_share=client_share,
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
    tenants = f", {len(clients)} client(s)" if clients else ""
    where = listener.url(bind, port)
    click.echo(f"osfleet host agent on {where} ({image.name}, {mode} resets, {warm} warm{tenants})", err=True)
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    owner = DaemonSetOwner.from_env()  # in a pod of the k8s stack's DaemonSet: an uninstall takes the replicas
    readable = check_at_start(owner, say)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()  # from --log-level
    try:
        serve(app, bind, port, level, **listener.uvicorn_options())  # graceful shutdown on SIGHUP too
    finally:  # uvicorn raises the signal that stopped it again once it has shut down: SIGTERM ends here too
        if uninstalled(owner, readable, say):
            from osfleet.replicas.adoption import teardown_all

            domains, records = teardown_all(settings)
            say(f"destroyed {domains} domain(s), removed {records} replica record(s)")


@host.command("tune")
@click.option("--ksm/--no-ksm", default=None, help="KSM on or off (default: on unless OSFLEET_TENANCY=multi)")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def host_tune(ksm: bool | None, as_json: bool) -> None:
    """Host settings for density: KSM with sane scan rates (kept off when replicas serve different users)."""
    from osfleet.vm.host_tune import tune

    result = tune(Settings.from_env(), ksm)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"KSM {result['ksm_reason']}; now saving {result['ksm'].get('saved_bytes', 0) >> 20} MiB")
