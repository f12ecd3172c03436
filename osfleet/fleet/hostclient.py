"""The gateway's HTTP/1.1 client for its host agents: kept-alive connections, one write per request, a deadline
on every exchange.

Why not httpx: on this project's 2-core hosts, busy with TCG guests, httpx (over httpcore and anyio) spent 1.5 to
3 ms of CPU on each call against a trivial server, this client about 0.4 ms; that CPU was a good part of what
the gateway added to a step. The hosts are osfleet's own agents (uvicorn), so the protocol needed is small:
requests with a length-delimited body, responses delimited by ``Content-Length``, chunked encoding or the end
of the connection; ``https`` URLs are verified against the system's CAs. Proxy variables are not read: the
gateway talks to its hosts directly.

A connection that sat idle is reused only while younger than ``IDLE_SECONDS`` (uvicorn closes idle ones after
5 s). If a reused one still turns out closed before a single byte of the answer came back, the request is sent
once more on a new connection: a host closing an idle connection has not read it, a host that died refuses the
new connection (and is drained), and a step retried on a restarted host applies once (its action id).
"""

from __future__ import annotations

import asyncio
import collections
import json as jsonlib
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

IDLE_SECONDS = 4.0
MAX_IDLE_PER_HOST = 64
MAX_CONNECTIONS_PER_HOST = 256
STREAM_LIMIT = 2**20  # the longest header block; the reader buffers up to twice this before pausing


class HostCallError(Exception):
    """A call to a host agent failed in transport: refused, reset, closed early or malformed."""


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
        return fresh and not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


@dataclass
class _Origin:
    host: str
    port: int
    netloc: str
    tls: ssl.SSLContext | None
    idle: collections.deque[_Conn] = field(default_factory=collections.deque)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_CONNECTIONS_PER_HOST))


class HostClient:
    """Calls to host agents at ``http://host:port`` URLs, each connection kept alive for the next call."""

    def __init__(self) -> None:
        self._origins: dict[str, _Origin] = {}
        self._closed = False
        self._tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> HostClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.popleft().close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> HostResponse:
        """One exchange with the whole of it (waiting for a connection included) bounded by ``timeout``."""
        scheme, _, rest = url.partition("://")
        base, slash, path = rest.partition("/")
        origin = self._origin(scheme, base)
        body = content if json is None else jsonlib.dumps(json, separators=(",", ":")).encode()
        target = quote(slash + path, safe="/:@-._~!$&'()*+,;=") + ("?" + urlencode(params) if params else "")
        head = self._head(method, target, origin.netloc, headers or {}, body)
        try:
            async with asyncio.timeout(timeout):
                async with origin.slots:
                    try:
                        return await self._exchange(origin, head, body, method)
                    except _Stale:
                        return await self._exchange(origin, head, body, method, reuse=False)
        except TimeoutError:
            raise HostCallTimeout(f"no answer within {timeout:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise HostCallError(_reason(exc)) from None

    async def get(self, url: str, *, timeout: float, headers: dict[str, str] | None = None) -> HostResponse:
        return await self.request("GET", url, timeout=timeout, headers=headers)

    # --- internals --------------------------------------------------------------------------------------------
    def _origin(self, scheme: str, base: str) -> _Origin:
        origin = self._origins.get(f"{scheme}://{base}")
        if origin is None:
            parts = urlsplit(f"{scheme}://{base}")
            if scheme not in ("http", "https") or not parts.hostname:
                raise HostCallError(f"not a host agent URL: {scheme}://{base}")
            tls = None
            if scheme == "https":
                self._tls = self._tls or ssl.create_default_context()
                tls = self._tls
            port = parts.port or (443 if tls else 80)
            origin = _Origin(parts.hostname, port, base, tls)
            self._origins[f"{scheme}://{base}"] = origin
        return origin

    @staticmethod
    def _head(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"host: {host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines += ["content-type: application/json", f"content-length: {len(body)}"]
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("content-length: 0")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connect(self, origin: _Origin, reuse: bool) -> _Conn:
        while origin.idle and not origin.idle[0].usable():  # the oldest first: closed by the host, or soon
            origin.idle.popleft().close()
        while reuse and origin.idle:
            conn = origin.idle.pop()  # the most recently used
            if conn.usable():
                conn.reused = True
                return conn
            conn.close()
        reader, writer = await asyncio.open_connection(
            origin.host,
            origin.port,
            limit=STREAM_LIMIT,
            ssl=origin.tls,
            server_hostname=origin.host if origin.tls else None,
        )
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
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                partial = getattr(exc, "partial", b"")
                if conn.reused and not partial:
                    raise _Stale("the host closed a kept-alive connection before answering") from None
                raise
            resp, keep = await _read_response(conn.reader, answer, method)
            return resp
        finally:
            if keep and not self._closed and len(origin.idle) < MAX_IDLE_PER_HOST:
                conn.idle_since, conn.reused = time.monotonic(), False
                origin.idle.append(conn)
            else:
                conn.close()


async def _read_response(reader: asyncio.StreamReader, head: bytes, method: str) -> tuple[HostResponse, bool]:
    """The response whose status line and headers are ``head``, and whether the connection may carry another
    request."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {status_line[:60]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"malformed header line {line[:60]!r}")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        content = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        content = await _read_chunked(reader)
    elif "content-length" in headers:
        content = await reader.readexactly(int(headers["content-length"]))
    else:
        content, keep = await reader.read(), False  # delimited by the end of the connection
    return HostResponse(status, headers, content), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, if any
                pass
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the host closed the connection before its answer was complete"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]
