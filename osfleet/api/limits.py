"""Limits that hold before any work is done for a request: its body size, and the threads it may wait for.

``BodyLimit`` is the outermost middleware of the host agent and of the gateway (in front of the gateway's step
fast path too): a ``Content-Length`` over the limit is answered 413 before a byte of the body is read and
before the caller is authenticated; a body without one (chunked) is cut off where it passes the limit.

Route handlers that block (libvirt, the guest agent) run in anyio's shared thread pool; its default of 40
threads let 40 long steps starve everything else, ``/health`` included. ``size_thread_pool`` sizes it to what
the host holds, and what must always answer (``/health``, ``/v1/host``) does not use it at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

THREADS_PER_REPLICA = 2  # a step and an observation (or the dashboard's screen) of the same replica at once
THREADS_SPARE = 16  # leases, listings, releases, the dashboard
LOGIN_MAX_BYTES = 4096


class BodyTooLarge(HTTPException):
    """Raised while a body is being read, where it passes the limit (the error handlers answer 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over this server's limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware: request bodies over ``limit()`` bytes are refused with 413, unread."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = content_length(scope)
        if declared is not None and declared > limit:
            await refuse_too_large(send, BodyTooLarge(limit).detail)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _counting(receive, limit), sending)
        except BodyTooLarge:  # read outside a route (the gateway's fast path): answered here
            if not started:
                await refuse_too_large(send, BodyTooLarge(limit).detail)


def content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``; None for a chunked body (its size is known only once it is read)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses a malformed length itself
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return counted


async def refuse_too_large(send: Send, reason: str) -> None:
    """413 ``too_large`` with the reason, answered before the body was read (the connection ends with it)."""
    body = json.dumps({"error": reason, "kind": "too_large"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the unread body is not drained: the connection ends with the answer
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_limited(request: Request, limit: int) -> bytes:
    """A body read only up to ``limit`` bytes (``BodyTooLarge`` past it): for a route with a smaller limit than
    the server's, such as the dashboard's login form."""
    declared = content_length(request.scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    chunks, seen = [], 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def size_thread_pool(replicas: int) -> int:
    """Give blocking route handlers enough threads for every replica this host holds (never fewer than anyio's
    default); call from inside the running event loop (the app's lifespan). Returns the size."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    size = max(int(limiter.total_tokens), replicas * THREADS_PER_REPLICA + THREADS_SPARE)
    limiter.total_tokens = size
    return size
