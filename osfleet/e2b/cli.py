"""``osfleet e2b serve``: E2B's SDKs (``e2b``, ``e2b-desktop``) on the fleet's desktops, unchanged."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from osfleet.cli_support import friendly
from osfleet.errors import ConfigError
from osfleet.tls import Listener, listener_options

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORT = 3000  # where E2B's SDK looks for its API when it runs locally (its debug mode's default)


@click.group("e2b")
def e2b() -> None:
    """E2B's sandbox API over the fleet: point E2B_API_URL and E2B_SANDBOX_URL at `osfleet e2b serve`."""


@e2b.command("serve")
@click.option("--url", required=True, help="the host agent or gateway, e.g. http://127.0.0.1:8080")
@click.option("--bind", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535), help="the port")
@click.option(
    "--max-lifetime",
    type=click.FloatRange(60, 86400),
    default=3600.0,
    show_default=True,
    help="seconds a sandbox may live from its start (its lease's length): no timeout reaches past it",
)
@click.option(
    "--lease-wait",
    type=click.FloatRange(0, 3600),
    default=50.0,
    show_default=True,
    help="seconds a creation waits for a free desktop before 503 (E2B's SDK gives up on a request after 60)",
)
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    help="an Origin a browser-based client may call from, e.g. https://app.example.org (repeatable; default: this "
    "server's own; the SDKs send none)",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="listen beyond loopback (every request still needs a client's key; use TLS there: --tls-cert/--tls-key)",
)
@click.option("--ca-file", type=click.Path(path_type=Path, dir_okay=False), default=None, help="CA of an https --url")
@friendly
@listener_options
def serve(
    url: str,
    bind: str,
    port: int,
    max_lifetime: float,
    lease_wait: float,
    origins: tuple[str, ...],
    allow_remote: bool,
    ca_file: Path | None,
    listener: Listener,
) -> None:
    """Serve E2B's control plane (create, connect, list, set_timeout, pause/resume, fork, kill) and every sandbox's
    daemon (commands with streamed output and signals, files) over the fleet at --url. E2B_API_KEY is a client token
    of the fleet: each sandbox is a lease of that client, seen by no other. e2b-desktop's screenshots, clicks, keys
    and typing, and its start-up of Xvfb and XFCE, are answered by the fleet's own capture and input; every other
    command runs in the desktop as its user, never root (docs: "Run E2B's desktop SDK on osfleet")."""
    from osfleet.cli_support import serve as serve_app
    from osfleet.e2b.app import create_app
    from osfleet.e2b.sandboxes import SandboxBook

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: expected http://host:port or https://host:port")
    if bind not in LOOPBACK and not allow_remote:
        raise ConfigError(f"--bind {bind}: beyond loopback only with --allow-remote (and TLS: --tls-cert/--tls-key)")
    book = SandboxBook(url, max_lifetime=max_lifetime, lease_wait=lease_wait, verify=str(ca_file) if ca_file else True)
    where = listener.url(bind, port)
    click.echo(
        f"osfleet e2b: E2B_API_URL={where} E2B_SANDBOX_URL={where} over {url}; E2B_API_KEY is a client token of "
        "the fleet",
        err=True,
    )
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    serve_app(create_app(book, list(origins) or None), bind, port, level, **listener.uvicorn_options())
