"""One HTTP connection pool to a host agent or gateway, with the retry rules of the osfleet contract.

Why retries live here and not in callers: whether a request may be sent again depends on what it is. A step
carries its ``action_id``, so the server applies it once however often it arrives — it is retried on any
connection failure or 503 (with the server's ``Retry-After``). A lease is not idempotent: it is retried only
when the connection was refused (nothing reached the server) or the fleet answered 503 capacity. A 429 (this
client's own share of the host in use, say its other evaluations: nothing of the request was done) is sent again,
whatever the request, after the server's ``Retry-After``, for up to ``THROTTLED_WAIT``. What is left
after the retries becomes an ``InfrastructureError``: never a bare HTTP error, never a hang (every call has a
deadline).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2 as httpx

from osfleet.client.errors import (
    CapacityError,
    FleetError,
    InfrastructureError,
    LeaseError,
    ThrottledError,
    from_response,
)

log = logging.getLogger(__name__)

Retry = Literal["never", "refused", "idempotent"]
"""``never``: one attempt; ``refused``: again only when nothing reached the server (connection refused) or the
answer was 503 capacity; ``idempotent``: again on any connection failure or 503."""

DEFAULT_TIMEOUT = 180.0  # seconds for one call; a step's actions alone may take the server 90 s
CONNECT_TIMEOUT = 10.0
MAX_RETRY_AFTER = 30.0
THROTTLED_WAIT = 300.0  # how long 429s (this client's own share in use, e.g. its evaluations) are waited out
CA_FILE_ENV = "OSFLEET_CA_FILE"
OCTET_STREAM = "application/octet-stream"

Verify = bool | str | Path | ssl.SSLContext
"""``True``: the system's CAs, or the CA file in ``$OSFLEET_CA_FILE``; a path: that CA file (PEM) alone, e.g. the
CA an osfleet infra stack made (``pulumi stack output caCert``); a context: as given; ``False``: no verification."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often a call is sent again, and how long the client waits in between (``Fleet(url, retry=...)``).
    Which calls may be sent again at all is the contract's rule, not the policy's: a step (its ``action_id``) or a
    reset on any connection failure or 503, a lease only when nothing reached the server; a 429 waits for the
    server's ``Retry-After``."""

    attempts: int = 6
    """Attempts per call, the first included; what still fails after them raises ``InfrastructureError``."""
    backoff: float = 0.5
    """Seconds before the second attempt when the server said no ``Retry-After``; doubled at each attempt."""


class Transport:
    """An ``httpx`` async client with the token, limits and the contract's retry rules."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_connections: int = 256,
        retry: RetryPolicy | None = None,
        verify: Verify = True,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"fleet URL {url!r}: expected http://host:port or https://host:port")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "osfleet-client"},
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            verify=verify_context(verify),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, Any] | None = None,
        retry: Retry = "never",
        timeout: float | None = None,
        wait_capacity: float | None = None,
        what: str | None = None,
        content: bytes | None = None,
        raw: bool = False,
    ) -> Any:
        """The JSON answer of one call (after the retries ``retry`` allows), or the matching ``FleetError``.

        ``timeout`` bounds each attempt; ``wait_capacity`` is how long 503 capacity answers are waited out in all
        (default: as many attempts as the policy allows). ``content``: a body of bytes as they are (a file's,
        ``application/octet-stream``) instead of the JSON ``body``; ``raw``: the answer's bytes as they are (a file)
        instead of its JSON (errors are JSON all the same)."""
        what = what or f"{method} {path}"
        per_try = timeout or self.timeout
        started = time.monotonic()
        delay = self.retry.backoff
        last: FleetError | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self._client.request(
                    method,
                    path,
                    json=body,
                    content=content,
                    headers={"Content-Type": OCTET_STREAM} if content is not None else None,
                    params=params,
                    timeout=httpx.Timeout(per_try, connect=min(CONNECT_TIMEOUT, per_try)),
                )
            except httpx.ConnectError as exc:  # nothing reached the server
                untrusted = _tls_refusal(exc)
                if untrusted:  # a setting to fix, not a passing failure: never retried
                    raise FleetError(f"{what}: {self.url}: {untrusted}", kind="tls") from None
                last = InfrastructureError(f"{what}: cannot connect to {self.url} ({exc})", kind="connection")
                again = retry != "never"
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                last = InfrastructureError(
                    f"{what}: no answer from {self.url} ({type(exc).__name__}: {exc or 'timed out'})",
                    kind="connection",
                )
                again = retry == "idempotent"
            else:
                if raw and resp.status_code < 400:
                    return resp.content
                data = _json(resp)
                if resp.status_code < 400:
                    return data
                err = from_response(resp.status_code, data, what)
                if isinstance(err, LeaseError) and isinstance(last, InfrastructureError):
                    # The replica failed under an earlier attempt and its lease went with it: the cause is the
                    # infrastructure, not the caller's lease.
                    raise last from err
                if isinstance(err, ThrottledError):  # refused before anything was done: safe to send again
                    wait = _retry_after(resp, delay)
                    if time.monotonic() - started + wait > THROTTLED_WAIT:
                        raise err
                    log.debug("%s: throttled (attempt %d); again in %.1f s", what, attempt, wait)
                    await asyncio.sleep(wait)
                    continue
                if resp.status_code != 503:
                    raise err
                last = err
                capacity = isinstance(err, CapacityError)
                again = retry == "idempotent" or (retry == "refused" and capacity)
                if capacity and wait_capacity is not None:
                    left = wait_capacity - (time.monotonic() - started)
                    if left <= 0:
                        raise err
                    delay = min(_retry_after(resp, delay), left)
                    await asyncio.sleep(delay)
                    continue
                delay = _retry_after(resp, delay)
            if not again or attempt >= self.retry.attempts:
                raise last
            log.debug("%s: attempt %d failed (%s); again in %.1f s", what, attempt, last, delay)
            await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
            delay = min(delay * 2, MAX_RETRY_AFTER)


def verify_context(verify: Verify) -> ssl.SSLContext | bool:
    """What httpx gets for ``verify`` (a CA file becomes a context that trusts that CA alone)."""
    from osfleet.errors import OsfleetError
    from osfleet.tls import client_context

    if verify is True and os.environ.get(CA_FILE_ENV):
        verify = os.environ[CA_FILE_ENV]
    if isinstance(verify, str | Path):
        try:
            return client_context(verify)
        except OsfleetError as exc:
            raise ValueError(str(exc)) from None
    return verify


def _tls_refusal(exc: BaseException) -> str | None:
    """Why TLS refused the server, when it did (a certificate not trusted or not for this address)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"TLS: the server's certificate is not trusted ({seen.verify_message})"
        seen = seen.__cause__ or seen.__context__
    return None


def _retry_after(resp: httpx.Response, default: float) -> float:
    try:
        return min(max(float(resp.headers.get("Retry-After", "")), 0.0), MAX_RETRY_AFTER)
    except ValueError:
        return default


def _json(resp: httpx.Response) -> Any:
    if not resp.content:
        return None
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"error": resp.text[:200] or f"HTTP {resp.status_code}", "kind": "unexpected"}
