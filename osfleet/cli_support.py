"""What every ``osfleet`` command shares: errors a user can cause end in one line and a non-zero exit."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.errors import OsfleetError

F = TypeVar("F", bound=Callable[..., Any])


def friendly(fn: F) -> F:
    """Turn osfleet errors and Ctrl-C into one readable line and a non-zero exit, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OsfleetError as exc:
            click.echo(f"osfleet: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            # Commands that undo their work on Ctrl-C say what they removed themselves, before this line.
            click.echo("osfleet: interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def emit(result: dict[str, Any], as_json: bool, out: Path | None, summary: Callable[[dict[str, Any]], str]) -> None:
    """A bench's result, every bench the same way: written to ``out`` when asked, then printed as one JSON
    document (``--json``) or as its human summary."""
    text = json.dumps(result, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    click.echo(text if as_json else summary(result))


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so a command stopped by
    a supervisor, ``timeout`` or a closed terminal runs the same clean-up (domains, overlays, lab hosts) as one
    stopped from the keyboard. A server (uvicorn) installs its own handlers while it runs and restores ours.

    Only the first one interrupts: a supervisor that sends SIGTERM again (or a hang-up that follows it) while
    the clean-up runs would otherwise cut the clean-up short and leak what it was removing. A second Ctrl-C
    still interrupts (a person at the keyboard asking to stop now); SIGKILL always does."""
    import signal

    stopping: list[str] = []

    def interrupt(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stopping:
            sys.stderr.write(f"osfleet: {name} while cleaning up after {stopping[0]}: the clean-up goes on\n")
            return
        stopping.append(name)
        raise KeyboardInterrupt(name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


GRACEFUL_SECONDS = 10.0  # what a server's open streams get to end after SIGTERM/SIGINT/SIGHUP (``serve``)


def serve(app: Any, host: str, port: int, log_level: str, **options: Any) -> None:
    """Run an ASGI app with uvicorn until a signal stops it, with its graceful shutdown (the app's lifespan:
    replicas' state, recordings, the evaluation sandbox) on SIGHUP as on SIGINT and SIGTERM: uvicorn handles
    only those two, and a bare SIGHUP would end the event loop without any shutdown. ``options``: more of
    uvicorn's ``Config`` (a listener's TLS files).

    Open streams (a long-poll, a followed command, a live view) get ``GRACEFUL_SECONDS`` to end after the signal,
    then are cut: uvicorn would otherwise wait for them for ever, and a client that keeps one open would keep the
    server (and what its shutdown releases) up after SIGTERM."""
    import signal

    import uvicorn

    options.setdefault("timeout_graceful_shutdown", GRACEFUL_SECONDS)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, **options))
    before = signal.signal(signal.SIGHUP, lambda _sig, frame: server.handle_exit(signal.SIGTERM, frame))
    try:
        server.run()
    finally:
        signal.signal(signal.SIGHUP, before)


def load_or_create_token(path: Path) -> str:
    """The token in ``path``, else a new random one written there (mode 0600): what a server started from the
    command line accepts (``api_token``) or a command presents (``openenv serve``'s client token)."""
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token


def api_token(token_file: Path | None, default_file: Path, say: Callable[[str], None] | None = None) -> str:
    """The bearer token a server (``host serve``, ``fleet serve``) accepts from its operator, in one place:
    ``--token-file``, else ``$OSFLEET_API_TOKEN``, else ``default_file`` (made, mode 0600, when missing)."""
    if token_file is not None:
        if not token_file.exists():
            raise OsfleetError(f"token file not found: {token_file}")
        token = token_file.read_text().strip()
        if not token:
            raise OsfleetError(f"token file {token_file} is empty")
        return token
    env = os.environ.get("OSFLEET_API_TOKEN")
    if env:
        return env
    token = load_or_create_token(default_file)
    if say is not None:
        say(f"bearer token in {default_file}")
    return token


def file_option(flag: str, help: str) -> Callable[[F], F]:
    """An option naming a file (a token's, a results file), none by default: one definition for every command."""
    return click.option(flag, type=click.Path(path_type=Path, dir_okay=False), default=None, help=help)


def tenant_options(fn: F) -> F:
    """The options a server (``host serve``, ``fleet serve``) takes about who may call it and how much:
    ``--clients-file``, ``--max-body-mib``, ``--osgym-allow``, one definition for both."""
    from osfleet.config import DEFAULT_MAX_BODY_BYTES

    options = [
        click.option(
            "--clients-file",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="the tenants: one 'NAME TOKEN' per line (TOKEN may be sha256:<hex>); each sees only its own replicas",
        ),
        click.option(
            "--max-body-mib",
            default=DEFAULT_MAX_BODY_BYTES // 2**20,
            show_default=True,
            type=click.IntRange(1, 1024),
            help="request bodies over this are refused (413) before they are read",
        ),
        click.option("--osgym-allow", multiple=True, help="client IP allowed on the OSGym endpoints without a token"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn
