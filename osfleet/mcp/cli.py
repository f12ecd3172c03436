"""``osfleet mcp serve``: a desktop of the fleet as MCP tools, for an MCP-speaking agent (stdio or HTTP)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import click

from osfleet.cli_support import file_option, friendly
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
    "--role",
    type=click.Choice(["agent", "grader"]),
    default="agent",
    show_default=True,
    help="stdio: the session's tools: agent (reset restarts its task, evaluate submits without telling the score) "
    "or grader (reset to any task, evaluate answers the score); over http each token has its own surface",
)
@click.option(
    "--task",
    default=None,
    help="the task of every agent session (a built-in id or a task file) unless a grader assigns another",
)
@file_option(
    "--results-file",
    "append each agent submission (evaluate) here as a JSON line: session, replica, task, reward, criteria",
)
@file_option(
    "--http-token-file",
    "http: the token agents present at /mcp, never the fleet's; made (mode 0600) when missing "
    "[default: $OSFLEET_HOME/mcp-token]",
)
@file_option(
    "--grader-token-file",
    "http: serve the grader's surface at /grader for this token (made, mode 0600, when missing); it must differ "
    "from the agents' token",
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
    role: str,
    task: str | None,
    results_file: Path | None,
    http_token_file: Path | None,
    grader_token_file: Path | None,
    origins: tuple[str, ...],
    hosts: tuple[str, ...],
    lease_ttl: float | None,
    lease_wait: float,
    ca_file: Path | None,
) -> None:
    """Serve the tools (screenshot, click, type_text, run_command, read_file, reset, evaluate, ...) of one leased
    desktop per MCP session; the desktop is released when the session ends. An agent's reset and evaluate neither
    swap its task nor tell it its score; a grader's do (docs: "Give an agent a desktop over MCP")."""
    from osfleet.client import FleetError
    from osfleet.client.fleet import read_token
    from osfleet.config import Settings
    from osfleet.mcp.desk import DeskOptions
    from osfleet.mcp.http import AGENT_PATH, GRADER_PATH, app
    from osfleet.mcp.roles import Board
    from osfleet.mcp.server import build

    try:
        token = read_token(None, token_file)
    except FleetError as exc:
        raise ConfigError(str(exc)) from None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: expected http://host:port or https://host:port")
    if transport == "http" and bind not in LOOPBACK and not hosts:
        raise ConfigError(f"--bind {bind}: name the Host headers clients will send with --allow-host")
    chosen: str | Path | None = Path(task) if task is not None and Path(task).is_file() else task
    board = Board(default_task=chosen, results_file=results_file)
    surface = functools.partial(
        build,
        url,
        token,
        board=board,
        options=DeskOptions(ttl=lease_ttl, wait=lease_wait),
        host=bind,
        port=port,
        allowed_hosts=list(hosts) or None,
        allowed_origins=list(origins) or None,
        verify=str(ca_file) if ca_file else True,
    )
    try:
        if transport == "stdio":
            surface(role="grader" if role == "grader" else "agent").run("stdio")
            return
        home = Settings.from_env().home
        agent_token = _own_token(http_token_file or home / "mcp-token", "--http-token-file")
        grader_token = _own_token(grader_token_file, "--grader-token-file") if grader_token_file else None
        if token in (agent_token, grader_token) or agent_token == grader_token:
            raise ConfigError("the agents' token, the grader's and the fleet's must be three different tokens")
        agent = surface(role="agent")
        grader = surface(role="grader", sessions=True, path=GRADER_PATH) if grader_token else None
        served = app(agent, agent_token, grader, grader_token, list(origins) or None)
        where = f"http://{bind}:{port}"
        also = f", the grader's at {where}{GRADER_PATH}" if grader is not None else ""
        click.echo(f"osfleet mcp: streamable HTTP: the agents' surface at {where}{AGENT_PATH}{also}", err=True)
        _serve_http(served, bind, port)
    except KeyboardInterrupt:  # each session's desktop was given back on the way out
        sys.exit(130)


def _own_token(path: Path, option: str) -> str:
    from osfleet.cli_support import load_or_create_token

    try:
        return load_or_create_token(path)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None


def _serve_http(served: Any, bind: str, port: int) -> None:
    import uvicorn

    uvicorn.Server(uvicorn.Config(served, host=bind, port=port, log_level="warning", lifespan="on")).run()
