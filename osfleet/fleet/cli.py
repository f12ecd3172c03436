"""``osfleet fleet serve``: the fleet gateway in front of many host agents."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from osfleet.cli_support import api_token, serve, tenant_options
from osfleet.cli_support import friendly as _friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.tls import Listener, client_context, listener_options

if TYPE_CHECKING:
    from osfleet.fleet.hosts import HostEntry

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
    help="the gateway's operator token, never a host's (default: $OSFLEET_API_TOKEN, else "
    "$OSFLEET_HOME/gateway-token, made)",
)
@tenant_options
@click.option(
    "--hosts-ca-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="verify https hosts against this CA (PEM) unless their hosts-file entry names its own ca_file "
    "(default: the system's CAs)",
)
@click.option(
    "--discover-pods",
    "discover_selector",
    default=None,
    help="find the host agents in Kubernetes: the pods with these labels (key=value[,key=value]) and their nodes "
    "(inside a cluster its service account; outside, --kubeconfig); with --hosts-token-file",
)
@click.option("--discover-namespace", default=None, help="namespace of those pods (default: the gateway pod's own)")
@click.option("--discover-port", default=8080, show_default=True, type=click.IntRange(1, 65535),
              help="the port the discovered agents serve on")  # fmt: skip
@click.option(
    "--hosts-tls-name",
    default=None,
    help="verify the discovered agents' certificate for this name (it names their Service, not pods)",
)
@click.option("--kubeconfig", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="the cluster of --discover-pods when not running in it")  # fmt: skip
@_friendly
@listener_options
def fleet_serve(
    bind: str,
    port: int,
    hosts_file: Path | None,
    host_specs: tuple[str, ...],
    hosts_token_file: Path | None,
    token_file: Path | None,
    clients_file: Path | None,
    max_body_mib: int,
    osgym_allow: tuple[str, ...],
    hosts_ca_file: Path | None,
    discover_selector: str | None,
    discover_namespace: str | None,
    discover_port: int,
    hosts_tls_name: str | None,
    kubeconfig: Path | None,
    listener: Listener,
) -> None:
    """Serve the host agent's contract for a fleet of host agents until interrupted."""

    from osfleet.api.auth import load_clients
    from osfleet.fleet.app import create_gateway
    from osfleet.fleet.hosts import HostEntry, check_unique, load_hosts

    entries = load_hosts(hosts_file) if hosts_file else []
    if (host_specs or discover_selector) and (hosts_token_file is None or not hosts_token_file.exists()):
        raise OsfleetError("--host and --discover-pods need --hosts-token-file with the host agents' token")
    host_token = hosts_token_file.read_text().strip() if hosts_token_file is not None else ""
    if host_specs:
        for spec in host_specs:
            name, sep, url = spec.partition("=")
            if not sep:
                raise OsfleetError(f"--host {spec!r}: expected NAME=URL, e.g. kvm1=http://10.0.0.5:8080")
            try:
                entries.append(HostEntry(name=name, url=url.rstrip("/"), token=host_token))
            except ValueError as exc:
                raise OsfleetError(f"--host {spec!r}: {str(exc).splitlines()[-1].strip()}") from None
    if not entries and not discover_selector:
        raise OsfleetError(
            "name the host agents: --hosts-file F, --host NAME=URL or --discover-pods LABELS (with --hosts-token-file)"
        )
    check_unique(entries)
    discovery = None
    if discover_selector:
        from osfleet.fleet.discovery import Discovery

        if hosts_ca_file is not None:
            client_context(hosts_ca_file)
        discovery = Discovery(
            selector=discover_selector, namespace=discover_namespace, port=discover_port, token=host_token,
            scheme="https" if hosts_ca_file or hosts_tls_name else "http", ca_file=hosts_ca_file,
            tls_name=hosts_tls_name, kubeconfig=kubeconfig,
        )  # fmt: skip
        discovery.labels()  # a malformed selector is one line now, not a watch failing later
    entries = with_host_cas(entries, hosts_ca_file) if entries else entries
    settings = Settings.from_env()
    token = api_token(token_file, settings.home / "gateway-token")
    clients = load_clients(clients_file, token) if clients_file is not None else ()
    if any(hmac.compare_digest(t.encode(), token.encode()) for t in [e.token for e in entries] + [host_token] if t):
        raise OsfleetError("the gateway's --token-file token is a host's token: give the gateway a token of its own")
    app = create_gateway(
        token, entries, osgym_allowed_ips=osgym_allow, clients=clients, max_body_bytes=max_body_mib * 2**20,
        discovery=discovery,
    )  # fmt: skip
    names = ", ".join(e.name for e in entries) + (f" + pods {discover_selector}" if discover_selector else "")
    where = listener.url(bind, port)
    click.echo(f"osfleet fleet gateway on {where} over {len(entries)} host(s): {names}", err=True)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    serve(app, bind, port, level, **listener.uvicorn_options())  # graceful shutdown on SIGHUP too


def with_host_cas(entries: list[HostEntry], hosts_ca_file: Path | None) -> list[HostEntry]:
    """``--hosts-ca-file`` given to every https host without a ``ca_file`` of its own; every CA file checked
    now (readable, PEM), so a wrong one is a line at start-up rather than hosts drained later."""
    if hosts_ca_file is not None and not any(e.url.startswith("https://") for e in entries):
        raise OsfleetError("--hosts-ca-file is for https hosts; every host here is plain HTTP")
    out = []
    for e in entries:
        if e.url.startswith("https://") and e.ca_file is None and hosts_ca_file is not None:
            e = e.model_copy(update={"ca_file": hosts_ca_file})
        if e.ca_file is not None:
            try:
                client_context(e.ca_file)
            except OsfleetError as exc:
                raise OsfleetError(f"host {e.name}: {exc}") from None
        out.append(e)
    return out
