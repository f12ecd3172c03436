"""The gateway's HTTP/1.1 client for its host agents: kept-alive connections, one write per request, a deadline
on every exchange, every answer parsed strictly and within caps.

Why not httpx or aiohttp: on this project's 2-core hosts, busy with TCG guests, httpx (over httpcore and anyio)
spent 1.5 to 3 ms of CPU on each call against a trivial server, this client about 0.3 ms; aiohttp, whose parser
is C, about 0.55 ms on the same step calls (``osfleet bench hostclient``: the same calls alternated, order
swapped every round, warm-up uncounted; README "The gateway's HTTP client"). ``tests/test_hostclient.py``
keeps both halves of that bargain: a test fails if this client stops being faster than aiohttp, and a fuzz test
feeds the parser what a broken or hostile host could send.

The hosts are osfleet's own agents (uvicorn), so the protocol needed is small: requests with a length-delimited
body; responses delimited by ``Content-Length``, chunked encoding or the end of the connection. What the parser
accepts, and what it refuses with a ``HostProtocolError`` (the connection is then closed, never reused):

- a status line ``HTTP/1.0`` or ``HTTP/1.1``, a three-digit status 100-599; 1xx interim answers are skipped;
- at most ``MAX_HEADER_BYTES`` of status line and headers and ``MAX_HEADERS`` header lines, each a token name,
  a colon and a value without control characters (no obsolete line folding, no bare CR or LF);
- ``Content-Length`` as digits (repeated only with the same value) or ``Transfer-Encoding: chunked``, never
  both, never another transfer coding; chunk sizes in hex with optional extensions, each chunk's data followed
  by CRLF, trailers bounded like headers;
- a body of at most ``max_body`` bytes (``MAX_BODY_BYTES`` by default) however it is delimited; bytes beyond a
  ``Content-Length`` that lied short are caught before the connection is reused.

``https`` URLs are verified: against the CA file registered for that host with ``verify_with`` (the hosts file's
``ca_file`` or ``fleet serve --hosts-ca-file``), else against the system's CAs. Never unverified. Proxy
variables are not read: the gateway talks to its hosts directly.

A connection that sat idle is reused only while younger than ``IDLE_SECONDS`` (uvicorn closes idle ones after
5 s). If a reused one still turns out closed before a single byte of the answer came back, the request is sent
once more on a new connection: a host closing an idle connection has not read it, a host that died refuses the
new connection (and is drained), and a step retried on a restarted host applies once (its action id).
"""

from __future__ import annotations

import asyncio
import collections
import json as jsonlib
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from osfleet.tls import client_context, describe_tls_error

IDLE_SECONDS = 4.0
CLOSE_SECONDS = 1.0  # how long a closing TLS connection may take to say goodbye before its socket is aborted
MAX_IDLE_PER_HOST = 64
MAX_CONNECTIONS_PER_HOST = 256
MAX_HEADER_BYTES = 64 * 2**10  # status line + headers (uvicorn's own request limit is 16 KiB); also chunk lines
MAX_HEADERS = 100
# A step of 100 ``read_file`` actions of 8 MiB each would answer ~1 GiB of base64; nothing the gateway should
# hold in memory for one call. 256 MiB covers every answer a host gives in practice (observations, fork lists).
MAX_BODY_BYTES = 256 * 2**20
MAX_INTERIM = 8  # 1xx answers skipped before the real one

_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_CHUNK = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?")


class HostCallError(Exception):
    """A call to a host agent failed in transport: refused, reset, closed early or malformed."""


class HostConnectError(HostCallError):
    """No connection was made (refused, unreachable, TLS handshake or certificate refused): the host never saw
    the request."""


class HostProtocolError(HostCallError):
    """The host's answer broke HTTP/1.1 or a cap (headers, body); the connection is closed."""


class HostCallTimeout(HostCallError):
    """A call to a host agent did not complete within its deadline."""


class _Stale(Exception):
    """A reused connection was closed by the host before it answered (it never read the request)."""


@dataclass
class HostResponse:
    """A host agent's answer: status, headers (names in lower case) and the whole body."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    reused: bool = False

    def usable(self) -> bool:
        fresh = time.monotonic() - self.idle_since < IDLE_SECONDS
        return fresh and not self.reader.at_eof() and not self.writer.is_closing() and not _pending(self.reader)

    def close(self) -> None:
        self.writer.close()

    async def aclose(self) -> None:
        """Closed and waited for: a TLS connection's socket is only released once its close_notify went out,
        which needs the loop; a peer that does not answer in a second gets the socket aborted instead."""
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), CLOSE_SECONDS)
        except (OSError, TimeoutError):
            self.writer.transport.abort()


@dataclass
class _Origin:
    host: str
    port: int
    netloc: str
    tls: ssl.SSLContext | None
    server_name: str | None  # the name its certificate is verified for, when not ``host``
    idle: collections.deque[_Conn] = field(default_factory=collections.deque)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_CONNECTIONS_PER_HOST))


class HostClient:
    """Calls to host agents at ``http(s)://host:port`` URLs, each connection kept alive for the next call."""

    def __init__(self, max_body: int = MAX_BODY_BYTES) -> None:
        self.max_body = max_body
        self._origins: dict[str, _Origin] = {}
        self._ca_files: dict[str, Path] = {}
        self._server_names: dict[str, str] = {}
        self._contexts: dict[Path | None, ssl.SSLContext] = {}
        self._closed = False

    async def __aenter__(self) -> HostClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def verify_with(self, base_url: str, ca_file: Path | str | None, server_name: str | None = None) -> None:
        """Verify the host at ``base_url`` (``https://host:port``) against ``ca_file`` alone (a private CA),
        instead of the system's CAs, and for ``server_name`` instead of the URL's host when given (agents found in
        Kubernetes: a pod's address changes, its certificate names the agents' Service). Checked now: an
        unreadable or non-PEM file is a ``ConfigError``."""
        scheme, _, base = base_url.rstrip("/").partition("://")
        key = f"{scheme}://{base}"
        if server_name is None:
            self._server_names.pop(key, None)
        else:
            self._server_names[key] = server_name
        if ca_file is None:
            self._ca_files.pop(key, None)
        else:
            path = Path(ca_file)
            self._context(path)
            self._ca_files[key] = path
        stale = self._origins.pop(key, None)  # connections made under the old trust are not reused
        while stale is not None and stale.idle:
            stale.idle.popleft().close()

    async def aclose(self) -> None:
        self._closed = True
        idle = [origin.idle.popleft() for origin in self._origins.values() for _ in range(len(origin.idle))]
        await asyncio.gather(*(conn.aclose() for conn in idle))

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        json: Any = None,
        content: bytes | None = None,
        content_type: str = "application/json",
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> HostResponse:
        """One exchange with the whole of it (waiting for a connection included) bounded by ``timeout``. The body
        is ``json`` encoded, or ``content`` as it is (of ``content_type``)."""
        scheme, _, rest = url.partition("://")
        base, slash, path = rest.partition("/")
        origin = self._origin(scheme, base)
        body = content if json is None else jsonlib.dumps(json, separators=(",", ":")).encode()
        kind = content_type if json is None else "application/json"
        target = quote(slash + path, safe="/:@-._~!$&'()*+,;=") + ("?" + urlencode(params) if params else "")
        head = _head(method, target, origin.netloc, headers or {}, body, kind)
        try:
            async with asyncio.timeout(timeout):
                async with origin.slots:
                    try:
                        return await self._exchange(origin, head, body, method)
                    except _Stale:
                        return await self._exchange(origin, head, body, method, reuse=False)
        except TimeoutError:
            raise HostCallTimeout(f"no answer within {timeout:g} s") from None
        except asyncio.LimitOverrunError:
            raise HostProtocolError(f"a header or chunk line longer than {MAX_HEADER_BYTES} bytes") from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise HostCallError(_reason(exc)) from None

    async def get(self, url: str, *, timeout: float, headers: dict[str, str] | None = None) -> HostResponse:
        return await self.request("GET", url, timeout=timeout, headers=headers)

    # --- internals --------------------------------------------------------------------------------------------
    def _context(self, ca_file: Path | None) -> ssl.SSLContext:
        ctx = self._contexts.get(ca_file)
        if ctx is None:
            ctx = self._contexts[ca_file] = client_context(ca_file)
        return ctx

    def _origin(self, scheme: str, base: str) -> _Origin:
        key = f"{scheme}://{base}"
        origin = self._origins.get(key)
        if origin is None:
            parts = urlsplit(key)
            if scheme not in ("http", "https") or not parts.hostname:
                raise HostCallError(f"not a host agent URL: {key}")
            tls = self._context(self._ca_files.get(key)) if scheme == "https" else None
            try:
                port = parts.port or (443 if tls else 80)
            except ValueError:
                raise HostCallError(f"not a host agent URL: {key}") from None
            origin = self._origins[key] = _Origin(parts.hostname, port, base, tls, self._server_names.get(key))
        return origin

    async def _connect(self, origin: _Origin, reuse: bool) -> _Conn:
        while origin.idle and not origin.idle[0].usable():  # the oldest first: closed by the host, or soon
            origin.idle.popleft().close()
        while reuse and origin.idle:
            conn = origin.idle.pop()  # the most recently used
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        try:
            reader, writer = await asyncio.open_connection(origin.host, origin.port, limit=MAX_HEADER_BYTES)
        except OSError as exc:  # raised here so that __context__ keeps the socket's error (refused or not)
            raise HostConnectError(_reason(exc)) from None
        if origin.tls is not None:
            # TLS upgraded on a connection of ours, so a refused handshake closes its socket here and now
            # (asyncio's own ssl= path can leave the socket to the garbage collector when the handshake fails).
            try:
                await writer.start_tls(origin.tls, server_hostname=origin.server_name or origin.host)
            except OSError as exc:
                writer.close()
                raise HostConnectError(_reason(exc)) from None
        return _Conn(reader, writer)

    async def _exchange(
        self, origin: _Origin, head: bytes, body: bytes | None, method: str, reuse: bool = True
    ) -> HostResponse:
        conn = await self._connect(origin, reuse)
        keep = False
        try:
            try:
                conn.writer.write(head + body if body else head)  # one segment: the host wakes once
                await conn.writer.drain()
                answer = await conn.reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
                partial = getattr(exc, "partial", b"")  # a TLS connection may end in an SSL error instead
                if conn.reused and not partial:
                    raise _Stale("the host closed a kept-alive connection before answering") from None
                raise
            resp, keep = await read_response(conn.reader, answer, method, self.max_body)
            return resp
        finally:
            if keep and not self._closed and len(origin.idle) < MAX_IDLE_PER_HOST and not _pending(conn.reader):
                conn.idle_since, conn.reused = time.monotonic(), False
                origin.idle.append(conn)
            else:
                conn.close()


def _head(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None, content_type: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"host: {host}"]
    for k, v in headers.items():
        if "\r" in k or "\n" in k or ":" in k or "\r" in v or "\n" in v:
            raise HostCallError(f"header {k[:40]!r} has a line break or colon where none may be")
        lines.append(f"{k}: {v}")
    if body is not None:
        lines += [f"content-type: {content_type}", f"content-length: {len(body)}"]
    elif method in ("POST", "PUT", "PATCH"):
        lines.append("content-length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_response(
    reader: asyncio.StreamReader, head: bytes, method: str, max_body: int = MAX_BODY_BYTES
) -> tuple[HostResponse, bool]:
    """The response whose status line and headers are ``head`` (read up to its blank line), and whether the
    connection may carry another request. Interim (1xx) answers are read past."""
    for _ in range(MAX_INTERIM + 1):
        version, status, headers = _parse_head(head)
        if not 100 <= status < 200 or status == 101:
            break
        head = await reader.readuntil(b"\r\n\r\n")
    else:
        raise HostProtocolError(f"more than {MAX_INTERIM} interim (1xx) answers")
    if status == 101:
        raise HostProtocolError("the host switched protocols (101), which no osfleet call asks for")
    keep = version == 1 and "close" not in headers.get("connection", "").lower()
    te = headers.get("transfer-encoding")
    cl = headers.get("content-length")
    if te is not None and cl is not None:
        raise HostProtocolError("an answer with both Content-Length and Transfer-Encoding")
    if method == "HEAD" or status in (204, 304):
        content = b""
    elif te is not None:
        if te.strip().lower() != "chunked":
            raise HostProtocolError(f"unsupported Transfer-Encoding {te[:40]!r}")
        content = await _read_chunked(reader, max_body)
    elif cl is not None:
        content = await reader.readexactly(_content_length(cl, max_body))
    else:
        content, keep = await _read_to_eof(reader, max_body), False  # delimited by the end of the connection
    return HostResponse(status, headers, content), keep


def _parse_head(head: bytes) -> tuple[int, int, dict[str, str]]:
    """(minor version, status, headers) of a status line and header block ending in CRLF CRLF."""
    status_line, *lines = head[:-4].split(b"\r\n")
    m = _STATUS.fullmatch(status_line)
    if m is None:
        raise HostProtocolError(f"not an HTTP/1.x status line: {status_line[:60]!r}")
    if len(lines) > MAX_HEADERS:
        raise HostProtocolError(f"more than {MAX_HEADERS} header lines")
    return int(m.group(1)), int(m.group(2)), _parse_fields(lines)


def _parse_fields(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        h = _HEADER.fullmatch(line)
        if h is None:
            raise HostProtocolError(f"malformed header line {line[:60]!r}")
        name, value = h.group(1).decode("ascii").lower(), h.group(2).decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _content_length(value: str, max_body: int) -> int:
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        raise HostProtocolError(f"conflicting Content-Length values {value[:60]!r}")
    (v,) = values
    if not v.isdigit() or not v.isascii() or len(v) > 19:
        raise HostProtocolError(f"Content-Length {v[:40]!r} is not a length")
    n = int(v)
    if n > max_body:
        raise HostProtocolError(f"an answer of {n} bytes, over the {max_body}-byte cap")
    return n


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        line = (await reader.readuntil(b"\r\n"))[:-2]
        m = _CHUNK.fullmatch(line)
        if m is None:
            raise HostProtocolError(f"not a chunk size line: {line[:60]!r}")
        size = int(m.group(1), 16)
        if size == 0:
            break
        total += size
        if total > max_body:
            raise HostProtocolError(f"a chunked answer over the {max_body}-byte cap")
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise HostProtocolError("a chunk longer than its size line said")
        parts.append(data[:-2])
    trailers = 0
    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers: counted, each bounded by the stream limit
        trailers += 1
        if trailers > MAX_HEADERS:
            raise HostProtocolError(f"more than {MAX_HEADERS} trailer lines")
    return b"".join(parts)


async def _read_to_eof(reader: asyncio.StreamReader, max_body: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while chunk := await reader.read(2**16):
        total += len(chunk)
        if total > max_body:
            raise HostProtocolError(f"an answer over the {max_body}-byte cap")
        parts.append(chunk)
    return b"".join(parts)


def _pending(reader: asyncio.StreamReader) -> int:
    """Bytes the host sent after its complete answer (a ``Content-Length`` that lied short, or an unasked-for
    answer): such a connection is not reused, or they would be read as the next call's answer. Reads the
    reader's buffer (a CPython detail, stable since asyncio began; 0 where it is missing)."""
    return len(getattr(reader, "_buffer", b""))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the host closed the connection before its answer was complete"
    tls = describe_tls_error(exc)
    if tls:
        return tls
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]
