"""``osfleet mcp serve``: a desktop of the fleet as MCP tools, for an MCP-speaking agent (stdio or HTTP)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from osfleet.cli_support import friendly
from osfleet.errors import ConfigError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.group("mcp")
def mcp() -> None:
    """Model Context Protocol: a desktop of the fleet as tools for an MCP client (Claude, agent SDKs)."""


@mcp.command("serve")
@click.option("--url", required=True, help="the host agent or gateway, e.g. http://127.0.0.1:8080")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="bearer token for --url (default: $OSFLEET_API_TOKEN); over HTTP, MCP clients present it too",
)
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio: one session on standard input/output; http: streamable HTTP at /mcp, a session per client",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="http: the address to listen on")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="http: the port")
@click.option(
    "--http-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="http: the bearer token MCP clients must present (default: the --token-file token)",
)
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    help="http: an Origin a browser-based client may call from, e.g. https://app.example.org (repeatable; "
    "default: loopback origins only; requests without Origin are not browsers and pass)",
)
@click.option(
    "--allow-host",
    "hosts",
    multiple=True,
    help="http: a Host header the server answers to, e.g. mcp.example.org:8765 (repeatable; default: loopback)",
)
@click.option("--lease-ttl", type=click.FloatRange(1, 86400), default=None, help="seconds a desktop's lease lasts")
@click.option(
    "--lease-wait", type=click.FloatRange(0, 3600), default=300.0, show_default=True, help="seconds to wait for one"
)
@click.option("--ca-file", type=click.Path(path_type=Path, dir_okay=False), default=None, help="CA of an https --url")
@friendly
def serve(
    url: str,
    token_file: Path | None,
    transport: str,
    bind: str,
    port: int,
    http_token_file: Path | None,
    origins: tuple[str, ...],
    hosts: tuple[str, ...],
    lease_ttl: float | None,
    lease_wait: float,
    ca_file: Path | None,
) -> None:
    """Serve the tools (screenshot, click, type_text, run_command, read_file, reset, evaluate, ...) of one leased
    desktop per MCP session; the desktop is released when the session ends."""
    from osfleet.client import FleetError
    from osfleet.client.fleet import read_token
    from osfleet.mcp.desk import DeskOptions
    from osfleet.mcp.server import build

    try:
        token = read_token(None, token_file)
        client_token = read_token(None, http_token_file) if http_token_file else token
    except FleetError as exc:
        raise ConfigError(str(exc)) from None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: expected http://host:port or https://host:port")
    if transport == "http" and bind not in LOOPBACK and not hosts:
        raise ConfigError(f"--bind {bind}: name the Host headers clients will send with --allow-host")
    server = build(
        url,
        token,
        options=DeskOptions(ttl=lease_ttl, wait=lease_wait),
        host=bind,
        port=port,
        allowed_hosts=list(hosts) or None,
        allowed_origins=list(origins) or None,
        verify=str(ca_file) if ca_file else True,
    )
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            _serve_http(server, bind, port, client_token, list(origins) or None)
    except KeyboardInterrupt:  # each session's desktop was given back on the way out
        sys.exit(130)


def _serve_http(server: object, bind: str, port: int, token: str, origins: list[str] | None) -> None:
    import uvicorn

    from osfleet.serving_gate import ServingGate

    app = ServingGate(server.streamable_http_app(), token, origins=origins)  # type: ignore[attr-defined]
    click.echo(f"osfleet mcp: serving streamable HTTP at http://{bind}:{port}/mcp", err=True)
    uvicorn.Server(uvicorn.Config(app, host=bind, port=port, log_level="warning", lifespan="on")).run()
