"""``osfleet openenv serve``: osfleet desktops as an OpenEnv environment (one session = one lease)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import click

from osfleet.cli_support import file_option, friendly, load_or_create_token
from osfleet.errors import OsfleetError
from osfleet.tls import Listener, listener_options


@click.group("openenv")
def openenv() -> None:
    """OpenEnv (openenv-core) environments over a host agent or gateway."""


@openenv.command("serve")
@click.option("--url", required=True, help="the host agent or gateway, e.g. http://127.0.0.1:8080")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="bearer token for --url (default: $OSFLEET_API_TOKEN)",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--task", default=None, help="default task of every session: a built-in id or a task file")
@click.option("--max-steps", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("--format", "fmt", type=click.Choice(["png", "jpeg", "webp"]), default="png", show_default=True)
@click.option("--max-sessions", default=64, show_default=True, type=click.IntRange(1, 4096))
@click.option("--lease-seconds", default=None, type=click.FloatRange(1, 86400), help="lease length (server default)")
@click.option("--allow-remote", is_flag=True, help="listen beyond loopback (clients there need the client token)")
@click.option(
    "--client-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the token OpenEnv clients present, its own (never --token-file's): Bearer, Basic, or in the URL as "
    "http://osfleet:TOKEN@host:port; made (mode 0600) when missing [default: $OSFLEET_HOME/openenv-token]; "
    "processes of this server's own user on loopback need none",
)
@file_option(
    "--grader-token-file",
    "serve the grader's surface at /grader for this token (made, mode 0600, when missing): its reset takes a task "
    "body and its ended episodes say every criterion; the agents' surface at / takes task ids only",
)
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    help="an Origin a browser-based client may call from (repeatable; default: loopback origins only)",
)
@friendly
@listener_options
def serve(
    url: str,
    token_file: Path | None,
    bind: str,
    port: int,
    task: str | None,
    max_steps: int,
    fmt: str,
    max_sessions: int,
    lease_seconds: float | None,
    allow_remote: bool,
    client_token_file: Path | None,
    grader_token_file: Path | None,
    origins: tuple[str, ...],
    listener: Listener,
) -> None:
    """Serve OpenEnv's protocol (/reset, /step, /state, /health, /schema, /ws) over osfleet desktops."""
    from osfleet.cli_support import serve  # this command's own name is serve
    from osfleet.client import Fleet, FleetError
    from osfleet.config import Settings
    from osfleet.openenv.server import GRADER_PATH, check_bind, create_openenv_app, served

    check_bind(bind, allow_remote)
    client_token_file = client_token_file or Settings.from_env().home / "openenv-token"
    try:
        client_token = load_or_create_token(client_token_file)
        grader_token = load_or_create_token(grader_token_file) if grader_token_file is not None else None
    except OSError as exc:
        raise OsfleetError(f"--client-token-file or --grader-token-file: {exc.strerror or exc}") from None
    if grader_token is not None and grader_token == client_token:
        raise OsfleetError("--grader-token-file holds the client token: the grader needs a token of its own")
    chosen: str | Path | None = task
    if task is not None and Path(task).is_file():
        chosen = Path(task)
    try:
        fleet = Fleet(url, token_file=token_file)
        health = fleet.health()
    except FleetError as exc:
        raise OsfleetError(f"{url}: {exc}") from None
    try:
        surface = functools.partial(
            create_openenv_app,
            fleet,
            task=chosen,
            max_steps=max_steps,
            observation_format=fmt,  # type: ignore[arg-type]  # a click.Choice of the three
            max_sessions=max_sessions,
            lease_seconds=lease_seconds,
        )
        grader = surface(role="grader") if grader_token is not None else None
        app = served(surface(role="agent"), client_token, grader, grader_token, list(origins) or None)
        graded = f"; graders at {GRADER_PATH} with the token in {grader_token_file}" if grader is not None else ""
        click.echo(
            f"osfleet OpenEnv server on {listener.url(bind, port)} over {url} ({health.get('image', 'fleet')}); "
            f"default task {task or 'none'}; clients: this user's processes on loopback, or the token in "
            f"{client_token_file}{graded}",
            err=True,
        )
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        serve(app, bind, port, level, **listener.uvicorn_options())  # its sessions' leases released on SIGHUP too
    finally:
        fleet.close()
