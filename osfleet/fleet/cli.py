"""``osfleet fleet serve``: the fleet gateway in front of many host agents."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import api_token, serve
from osfleet.cli_support import friendly as _friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError

F = TypeVar("F", bound=Callable[..., Any])


# --- fleet gateway ------------------------------------------------------------------------------------------
@click.group()
def fleet() -> None:
    """The fleet gateway: one endpoint with the host agent's API in front of many host agents."""


@fleet.command("serve")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8090, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--hosts-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="YAML/JSON list of {name, url, token | token_file}",
)
@click.option("--host", "host_specs", multiple=True, help="NAME=URL of a host agent (with --hosts-token-file)")
@click.option(
    "--hosts-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the token of the --host agents",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the gateway's own client token (default: $OSFLEET_API_TOKEN, else $OSFLEET_HOME/gateway-token, made)",
)
@click.option("--osgym-allow", multiple=True, help="client IP allowed on the OSGym endpoints without a token")
@_friendly
def fleet_serve(
    bind: str,
    port: int,
    hosts_file: Path | None,
    host_specs: tuple[str, ...],
    hosts_token_file: Path | None,
    token_file: Path | None,
    osgym_allow: tuple[str, ...],
) -> None:
    """Serve the host agent's contract for a fleet of host agents until interrupted."""

    from osfleet.fleet.app import create_gateway
    from osfleet.fleet.hosts import HostEntry, check_unique, load_hosts

    entries = load_hosts(hosts_file) if hosts_file else []
    if host_specs:
        if hosts_token_file is None or not hosts_token_file.exists():
            raise OsfleetError("--host needs --hosts-token-file with the host agents' token")
        host_token = hosts_token_file.read_text().strip()
        for spec in host_specs:
            name, sep, url = spec.partition("=")
            if not sep:
                raise OsfleetError(f"--host {spec!r}: expected NAME=URL, e.g. kvm1=http://10.0.0.5:8080")
            try:
                entries.append(HostEntry(name=name, url=url.rstrip("/"), token=host_token))
            except ValueError as exc:
                raise OsfleetError(f"--host {spec!r}: {str(exc).splitlines()[-1].strip()}") from None
    if not entries:
        raise OsfleetError("name the host agents: --hosts-file F, or --host NAME=URL with --hosts-token-file")
    check_unique(entries)
    settings = Settings.from_env()
    token = api_token(token_file, settings.home / "gateway-token")
    app = create_gateway(token, entries, osgym_allowed_ips=osgym_allow)
    names = ", ".join(e.name for e in entries)
    click.echo(f"osfleet fleet gateway on http://{bind}:{port} over {len(entries)} host(s): {names}", err=True)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    serve(app, bind, port, level)  # graceful shutdown on SIGHUP too
