"""The gateway's HTTP/1.1 client against small servers that answer the ways a host agent (or a dying one) can:
kept-alive connections reused, chunked and close-delimited bodies, deadlines, refused and stale connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import pytest

from osfleet.fleet import hostclient
from osfleet.fleet.hostclient import HostCallError, HostCallTimeout, HostClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return head[0], headers, body


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_requests_share_one_kept_alive_connection_and_arrive_whole() -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while not reader.at_eof():
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                break
            writer.write(answer(b'{"ok": true}', extra="content-type: application/json\r\nX-Thing: a\r\n"))
        writer.close()

    async def test() -> None:
        server, url = await serve(handler)
        async with server, HostClient() as client:
            r = await client.request(
                "POST", f"{url}/v1/step", json={"a": 1}, headers={"Authorization": "Bearer t"}, timeout=5
            )
            assert r.status_code == 200 and r.json() == {"ok": True} and r.headers["x-thing"] == "a"
            r = await client.get(f"{url}/screenshot", timeout=5)
            r = await client.request("GET", f"{url}/obs", params={"lease_id": "a b&c", "format": "png"}, timeout=5)
            assert r.text == '{"ok": true}'
        assert connections == 1
        line, headers, body = seen[0]
        assert line == "POST /v1/step HTTP/1.1" and headers["authorization"] == "Bearer t"
        assert headers["content-type"] == "application/json" and json.loads(body) == {"a": 1}
        assert seen[1][0] == "GET /screenshot HTTP/1.1" and "content-length" not in seen[1][1]
        assert seen[2][0] == "GET /obs?lease_id=a+b%26c&format=png HTTP/1.1"

    run(test)


def test_a_path_cannot_smuggle_a_second_request() -> None:
    lines: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        lines.append(line)
        writer.write(answer(b"{}"))
        await writer.drain()
        writer.close()

    async def test() -> None:
        server, url = await serve(handler)
        async with server, HostClient() as client:
            await client.request("GET", f"{url}/v1/replicas/r 1\r\nX-Evil: 1?x#y/observation", timeout=5)
        assert lines == ["GET /v1/replicas/r%201%0D%0AX-Evil:%201%3Fx%23y/observation HTTP/1.1"]

    run(test)


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\nT: 1\r\n\r\n",
            b"abcdefg",
        ),
        (b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\nthe end", b"the end"),
        (b"HTTP/1.0 200 OK\r\n\r\nold", b"old"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
)
def test_bodies_delimited_every_way_a_server_may(raw: bytes, body: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        if b"chunked" not in raw and b"204" not in raw:
            writer.close()

    async def test() -> None:
        server, url = await serve(handler)
        async with server, HostClient() as client:
            r = await client.get(f"{url}/x", timeout=5)
            assert r.content == body and r.status_code == int(raw[9:12])

    run(test)


def test_a_deadline_bounds_the_whole_exchange_and_the_connection_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _, _ = await read_request(reader)
        if "slow" in line:
            await asyncio.sleep(5)
        writer.write(answer(b"{}"))
        await writer.drain()

    async def test() -> None:
        server, url = await serve(handler)
        async with server, HostClient() as client:
            with pytest.raises(HostCallTimeout, match="within 0.2 s"):
                await client.get(f"{url}/slow", timeout=0.2)
            assert (await client.get(f"{url}/fast", timeout=5)).status_code == 200

    run(test)


def test_a_refused_or_cut_connection_is_a_host_call_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    async def test() -> None:
        server, url = await serve(cut)
        async with server, HostClient() as client:
            with pytest.raises(HostCallError, match="before its answer was complete"):
                await client.get(f"{url}/x", timeout=5)
        async with HostClient() as client:
            with pytest.raises(HostCallError):
                await client.get(url, timeout=5)  # the server is gone: refused

    run(test)


def test_a_kept_alive_connection_the_host_closed_is_replaced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = 0

    async def once_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await read_request(reader)
        requests += 1
        writer.write(answer(b"{}"))  # keep-alive promised, then closed as an idle host would
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async def test() -> None:
        server, url = await serve(once_per_connection)
        async with server, HostClient() as client:
            assert (await client.get(f"{url}/1", timeout=5)).status_code == 200
            await asyncio.sleep(0.2)  # the close has arrived: the idle connection is seen closed
            assert (await client.get(f"{url}/2", timeout=5)).status_code == 200
            monkeypatch.setattr(hostclient, "IDLE_SECONDS", 0.0)  # too old to reuse: a new connection
            assert (await client.get(f"{url}/3", timeout=5)).status_code == 200
        assert requests == 3

    run(test)


def test_a_stale_connection_that_looked_alive_is_retried_on_a_new_one() -> None:
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await read_request(reader)
        requests += 1
        writer.write(answer(b"{}"))
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")  # the next request is read, never answered: closed instead
        writer.close()

    async def test() -> None:
        server, url = await serve(handler)
        async with server, HostClient() as client:
            assert (await client.get(f"{url}/1", timeout=5)).status_code == 200
            assert (await client.get(f"{url}/2", timeout=5)).status_code == 200
        assert requests == 2

    run(test)
