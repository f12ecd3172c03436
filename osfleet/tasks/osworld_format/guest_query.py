"""Asking the running desktop from the host: osfleet's query script run in the guest through the guest agent.

Chrome's DevTools protocol (the office image starts Chromium as ``google-chrome`` with DevTools on port 1337),
VLC's HTTP interface, AT-SPI's accessibility tree and the browser's profile files are all inside the guest, and
a replica has no network device: so the script (``guest/query.py``, package data) is sent whole with
each call as ``python3 -c SCRIPT OP ARGS`` and run as the desktop user on its display. It prints one JSON
document; anything else (a crash, a timeout, output that is not that document) is reported as a
``GuestQueryError`` naming the operation, never parsed further. It runs isolated from what the desktop user
(the agent) can write: Debian's python3, ``-I -S``, from ``/``, in a fixed environment (``command``;
``osfleet.replicas.actions.VERIFIER_ENV``).
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from importlib import resources
from typing import Any, Protocol

from osfleet.errors import OsfleetError

GUEST_PYTHON = "/usr/bin/python3"  # Debian's, root's: never the first python3 of a PATH


class GuestShell(Protocol):
    """What running a command in the guest needs of a host: the query script here, the writes of
    ``guest_writes``."""

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]: ...


class GuestQueryError(OsfleetError):
    """The query script could not answer (Chrome not running, a file it cannot read, no python3 in the guest)."""


@cache
def script() -> str:
    return resources.files("osfleet.tasks.osworld_format").joinpath("guest/query.py").read_text()


@cache
def html_parse_js() -> str:
    return resources.files("osfleet.tasks.osworld_format").joinpath("guest/html_parse.js").read_text()


def script_deadline(timeout: float) -> float:
    """When the script stops its own waits: a tenth of ``timeout`` (3-10 s) before the guest command is killed,
    time for python3 to start and answer in a guest that emulation slows, so a wait that runs out is reported by
    the script ("Chrome's DevTools port did not answer") rather than as a killed command."""
    return max(timeout - min(max(3.0, timeout / 10), 10.0), 1.0)


def command(op: str, args: dict[str, Any], timeout: float) -> str:
    """The guest command line for ``op``; the script's own deadline leaves room for its answer.

    Debian's interpreter by its full path, isolated (``-I``: no working folder or script folder on ``sys.path``,
    no user site-packages, no ``PYTHON*`` variables; ``-S``: no ``site`` at all, so no ``.pth`` file anywhere
    runs), from ``/``: a ``~/json.py``, a user ``.pth`` or a ``python3`` earlier in the user's ``PATH`` never runs
    inside a getter. The script adds Debian's root-owned package folders itself (``_system_packages``). It comes
    from the host in the command line, so there is no script file in the guest for the agent to change."""
    body = {**args, "deadline": script_deadline(timeout)}
    return (
        f"cd / && exec {GUEST_PYTHON} -I -S -c {shlex.quote(script())} {shlex.quote(op)} "
        f"{shlex.quote(json.dumps(body))}"
    )


def ask(host: GuestShell, rid: str, op: str, args: dict[str, Any], timeout: float) -> Any:
    """The value ``op`` returns in the guest; ``GuestQueryError`` when it reports an error or says nothing
    readable. A guest that cannot be reached raises the guest agent's own error (infrastructure)."""
    out = host.shell(rid, command(op, args, timeout), timeout)
    lines = out["stdout"].strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not ({"value", "error"} & answer.keys()):
        detail = (out["stderr"] or out["stdout"]).strip().splitlines()
        last = detail[-1] if detail else ""
        raise GuestQueryError(f"guest query {op} gave no answer (exit {out['exit_code']}): {last}")
    if "error" in answer:
        raise GuestQueryError(f"guest query {op}: {answer['error']}")
    return answer["value"]
