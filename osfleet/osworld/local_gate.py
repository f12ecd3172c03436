"""Who may use the loopback servers a ``DesktopEnv`` gets for its lease (the protocol server, VLC's relay).

Whoever reaches OSWorld's in-VM server acts as the desktop user of that VM; here the "VM" is a leased replica and
the server listens on this machine's loopback, which every user of the machine and every page of a browser running
on it can reach too. OSWorld's controllers send no credentials (plain ``requests`` calls to
``http://127.0.0.1:<port>``), and they run in the process that leased the replica. So each request must:

- carry no ``Origin`` (browsers send one; OSWorld's controllers never do): else 403;
- name this server in ``Host`` as ``127.0.0.1:<port>`` or ``localhost:<port>`` (a page that rebinds its own host
  name to 127.0.0.1 sends its name): else 403;
- come from this very process (the client end of the connection is one of its sockets, ``osfleet.peers``), or
  carry the server's per-lease secret (``Authorization: Bearer <secret>``, or Basic with it as the password) for
  a tool of the same person in another process: else 401.

The checks read headers and the kernel's socket table only; a refused request's body is never read.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import cast

from osfleet.peers import from_this_process

LOCAL_NAMES = ("127.0.0.1", "localhost")


class LocalGate:
    """The checks of one loopback server (the module's docstring), with its per-lease ``secret``."""

    def __init__(self) -> None:
        self.secret = secrets.token_urlsafe(24)

    def refusal(self, headers: Message, port: int, from_us: Callable[[], bool]) -> tuple[int, str] | None:
        """None when the request may be served, else its status and reason. ``from_us()``: whether the connection
        comes from this process (asked only when the secret was not given; the caller keeps its answer for the
        connection, whose other end does not change)."""
        if headers.get("Origin") is not None:
            return 403, "a browser page may not use this server (it sent an Origin)"
        if headers.get("Host", "").lower() not in {f"{name}:{port}" for name in LOCAL_NAMES}:
            return 403, f"this server answers to 127.0.0.1:{port} only"
        if self.secret_given(headers.get("Authorization")) or from_us():
            return None
        return 401, "only the process that leased this replica, or one with its secret, may use this server"

    def secret_given(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, given = authorization.partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer":
            return hmac.compare_digest(given.encode(), self.secret.encode())
        if scheme.lower() == "basic":
            try:
                _, _, password = base64.b64decode(given, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(password, self.secret.encode())
        return False


class GatedHandler(BaseHTTPRequestHandler):
    """A request handler of a loopback server whose ``server.gate`` is a ``LocalGate``: ``refusal()`` checks the
    request (asking the kernel once per connection whether it comes from this process)."""

    _from_us: bool | None = None

    def refusal(self) -> tuple[int, str] | None:
        gate: LocalGate = self.server.gate  # type: ignore[attr-defined]  # both servers set it
        port = cast(tuple[str, int], self.server.server_address)[1]
        return gate.refusal(self.headers, int(port), self._connection_is_ours)

    def _connection_is_ours(self) -> bool:
        if self._from_us is None:
            server = cast(tuple[str, int], self.server.server_address)
            self._from_us = from_this_process(self.client_address, server)
        return self._from_us
