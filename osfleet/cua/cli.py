"""``osfleet cua serve``: a leased osfleet desktop as Cua's computer-server (``cua-computer``, ``cua-agent``)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from osfleet.cli_support import file_option, friendly
from osfleet.errors import ConfigError

DEFAULT_PORT = 8000  # where cua-computer finds a computer-server on localhost (use_host_computer_server=True)


@click.group("cua")
def cua() -> None:
    """Cua's computer-server over a desktop of the fleet."""


@cua.command("serve")
@click.option("--url", required=True, help="the host agent or gateway, e.g. http://127.0.0.1:8080")
@file_option("--token-file", "bearer token for --url (default: $OSFLEET_API_TOKEN)")
@click.option("--bind", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option(
    "--port",
    default=DEFAULT_PORT,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="the port (cua-computer 0.4 looks for localhost:8000)",
)
@click.option("--task", default=None, help="reset the desktop to this task first: a built-in id or a task file")
@click.option(
    "--lease-ttl", type=click.FloatRange(1, 86400), default=3600.0, show_default=True, help="seconds the lease lasts"
)
@click.option(
    "--lease-wait",
    type=click.FloatRange(0, 3600),
    default=300.0,
    show_default=True,
    help="seconds to wait for a free desktop",
)
@file_option(
    "--client-token-file",
    "the token other clients present (Authorization: Bearer), never the fleet's; made (mode 0600) when missing "
    "[default: $OSFLEET_HOME/cua-token]; this user's processes on loopback need none (cua-computer sends none)",
)
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    help="an Origin a browser-based client may call from (repeatable; default: this server's own)",
)
@click.option("--ca-file", type=click.Path(path_type=Path, dir_okay=False), default=None, help="CA of an https --url")
@friendly
def serve(
    url: str,
    token_file: Path | None,
    bind: str,
    port: int,
    task: str | None,
    lease_ttl: float,
    lease_wait: float,
    client_token_file: Path | None,
    origins: tuple[str, ...],
    ca_file: Path | None,
) -> None:
    """Lease one desktop and answer cua-computer's commands (POST /cmd, /ws) for it: screenshots, clicks, keys,
    Unicode typing, drags, scrolls, files and shell commands as the desktop user (never root). The desktop is
    given back when the server stops (docs: "Drive an osfleet desktop with Cua")."""
    from osfleet.cli_support import load_or_create_token
    from osfleet.cli_support import serve as serve_app
    from osfleet.client import FleetError
    from osfleet.client.fleet import read_token
    from osfleet.config import Settings
    from osfleet.cua.app import LeaseOptions, create_app

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: expected http://host:port or https://host:port")
    if not _loopback(bind):
        raise ConfigError(f"--bind {bind}: Cua's clients send no credentials; serve on a loopback address")
    try:
        fleet_token = read_token(None, token_file)
    except FleetError as exc:
        raise ConfigError(str(exc)) from None
    token_path = client_token_file or Settings.from_env().home / "cua-token"
    try:
        own = load_or_create_token(token_path)
    except OSError as exc:
        raise ConfigError(f"--client-token-file {token_path}: {exc.strerror or exc}") from None
    if own == fleet_token:
        raise ConfigError("--client-token-file holds the fleet's token: this server needs a token of its own")
    chosen: str | Path | None = Path(task) if task is not None and Path(task).is_file() else task
    options = LeaseOptions(url, fleet_token, chosen, lease_ttl, lease_wait, str(ca_file) if ca_file else True)
    click.echo(
        f"osfleet cua: Cua's computer-server on http://{bind}:{port} over {url}; clients: this user's processes on "
        f"loopback, or the token in {token_path}",
        err=True,
    )
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    serve_app(create_app(options, own, list(origins) or None), bind, port, level)


def _loopback(bind: str) -> bool:
    """A loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    import ipaddress

    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False
