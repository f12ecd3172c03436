"""The client and a 429: nothing of the request was done (the client's own share of the host was in use), so it is
sent again after ``Retry-After``, whatever the request, until ``THROTTLED_WAIT``; then ``ThrottledError``. Against
a real HTTP server on loopback whose answers the test decides."""

from __future__ import annotations

import asyncio
import time

import pytest

from osfleet.client import ThrottledError
from osfleet.client import transport as transport_module
from osfleet.client.transport import Transport
from tests.json_server import Request, json_server

pytestmark = pytest.mark.integration  # seconds of Retry-After waits in sum

THROTTLED = {"error": "this client has 1 evaluation(s) under way on this host", "kind": "throttled"}


def test_a_429_is_sent_again_until_it_is_served() -> None:
    def answer(request: Request) -> tuple[int, object]:
        return (429, THROTTLED) if len(seen) <= 2 else (200, {"reward": 1.0})

    with json_server(answer) as (url, seen):

        async def call() -> object:
            t = Transport(url, "token")
            try:  # an evaluation is no idempotent step: a 429 is retried all the same (nothing of it was done)
                return await t.call("POST", "/v1/replicas/r-1/evaluate", {"lease_id": "l-1"}, retry="never")
            finally:
                await t.aclose()

        assert asyncio.run(call()) == {"reward": 1.0}
        assert [r.path for r in seen] == ["/v1/replicas/r-1/evaluate"] * 3


def test_a_429_that_lasts_is_a_throttled_error_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "THROTTLED_WAIT", 1.5)
    with json_server(lambda request: (429, THROTTLED)) as (url, seen):

        async def call() -> object:
            t = Transport(url, "token")
            try:
                return await t.call("POST", "/v1/leases", {"holder": "h"})
            finally:
                await t.aclose()

        started = time.monotonic()
        with pytest.raises(ThrottledError, match="evaluation"):
            asyncio.run(call())
        assert 1.0 <= time.monotonic() - started < 10 and len(seen) >= 2
