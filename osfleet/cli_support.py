"""What every ``osfleet`` command shares: errors a user can cause end in one line and a non-zero exit."""

from __future__ import annotations

import json
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
