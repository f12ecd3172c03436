"""Files in and out of a desktop, without a VM: the path policy, the host agent's PUT and GET (as they are, bytes
in and bytes out, every refusal a precise JSON answer), the published contract, the gateway's relay and the SDK.
The desktop is the fake host's (its files a dict, the path policy the real one); the guest's part is in
tests/test_guest_files.py and on a real replica in tests/test_files_vm.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx2 as httpx
import pytest
from fastapi import Query
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import Caller
from osfleet.api.contract import RawBody, Routes
from osfleet.api.models import FileQuery
from osfleet.api.operations import DOWNLOAD_FILE, OPERATIONS, UPLOAD_FILE
from osfleet.client import AsyncFleet, Fleet, ForbiddenError, InvalidRequestError, NotFoundError
from osfleet.config import DEFAULT_MAX_BODY_BYTES, AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.protocol.models import FILE_ROOTS
from osfleet.replicas import guest_files
from osfleet.replicas.actions import GUEST_USER
from osfleet.replicas.errors import GuestPathRefusedError
from tests.fakes import FakeHost
from tests.test_fleet import Agent, free_port
from tests.test_ui import ui_login

pytestmark = pytest.mark.unit
TOKEN = "files-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 256 * 1024  # the server's body limit in these tests
EVERY_BYTE = bytes(range(256)) * 64  # NUL, CR, LF, invalid UTF-8: bytes go as they are


@pytest.mark.parametrize(
    "path",
    ["/home/user/notes/todo.txt", "/home/user/.config/app.ini", "/tmp/x", "/tmp/a b/ü €.bin", "/home/user/..x"],
)
def test_a_normalised_path_under_the_home_or_tmp_is_allowed(path: str) -> None:
    assert guest_files.allowed_path(path) == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "is outside /home/user/ and /tmp/"),
        ("/home/user", "is outside"),  # the folder itself is no file of it
        ("/home/username/x", "is outside"),
        ("/tmpfoo", "is outside"),
        ("/home/user/../root/.ssh/id_rsa", "is not normalised"),
        ("/tmp/../etc/shadow", "is not normalised"),
        ("/home/user/./x", "is not normalised"),
        ("/home/user//x", "is not normalised"),
        ("//home/user/x", "is not normalised"),
        ("/home/user/x/", "is not normalised"),
        ("home/user/x", "is not an absolute path"),
        ("/home/user/a\x00b", "is not an absolute path"),
    ],
)
def test_any_other_path_is_refused_saying_why(path: str, why: str) -> None:
    with pytest.raises(GuestPathRefusedError, match=why.replace(".", r"\.")):
        guest_files.allowed_path(path)


def test_the_published_roots_are_the_desktop_users_home_and_tmp() -> None:
    assert (f"/home/{GUEST_USER}/", "/tmp/") == FILE_ROOTS


# --- the host agent ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=2)


@pytest.fixture
def client(fake: FakeHost) -> Iterator[TestClient]:
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0, max_body_bytes=LIMIT), lambda: fake)) as c:
        yield c


def lease(c: TestClient) -> tuple[str, str]:
    r = c.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def put(c: TestClient, rid: str, lid: str, path: str, data: bytes) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/octet-stream"}
    return c.put(f"/v1/replicas/{rid}/files", params={"lease_id": lid, "path": path}, content=data, headers=headers)


def get(c: TestClient, rid: str, lid: str, path: str) -> httpx.Response:
    return c.get(f"/v1/replicas/{rid}/files", params={"lease_id": lid, "path": path}, headers=AUTH)


def test_a_file_goes_in_and_comes_back_byte_for_byte(fake: FakeHost, client: TestClient) -> None:
    rid, lid = lease(client)
    r = put(client, rid, lid, "/home/user/in/every-byte.bin", EVERY_BYTE)
    assert r.status_code == 200 and r.json() == {"path": "/home/user/in/every-byte.bin", "bytes": len(EVERY_BYTE)}
    assert fake.desktop_files["/home/user/in/every-byte.bin"] == EVERY_BYTE
    r = get(client, rid, lid, "/home/user/in/every-byte.bin")
    assert r.status_code == 200 and r.content == EVERY_BYTE
    assert r.headers["content-type"] == "application/octet-stream"
    assert put(client, rid, lid, "/tmp/empty", b"").json()["bytes"] == 0  # an empty file is a file
    assert get(client, rid, lid, "/tmp/empty").content == b""


def test_every_refusal_is_a_precise_json_answer(fake: FakeHost, client: TestClient) -> None:
    rid, lid = lease(client)
    other, _ = lease(client)
    cases = [
        (put(client, rid, lid, "/etc/cron.d/x", b"x"), 403, "forbidden", "is outside /home/user/ and /tmp/"),
        (get(client, rid, lid, "/home/user/../../etc/shadow"), 403, "forbidden", "is not normalised"),
        (get(client, rid, lid, "/home/user/nothing-here"), 404, "not_found", "no file /home/user/nothing-here"),
        (get(client, rid, lid, "relative/path"), 422, "invalid_request", "path: String should match pattern"),
        (get(client, rid, lid, "/home/user/a\x00b"), 422, "invalid_request", "path: String should match pattern"),
        (get(client, rid, lid, ""), 422, "invalid_request", "path: String should have at least 2 characters"),
        (get(client, rid, "not-the-lease", "/tmp/x"), 409, "lease", "not-the-lease"),
        (put(client, other, lid, "/tmp/x", b"x"), 409, "lease", lid),
        (get(client, "r-nosuch", lid, "/tmp/x"), 404, "not_found", "no replica r-nosuch"),
        (put(client, rid, lid, "/tmp/x", b"x" * (LIMIT + 1)), 413, "too_large", f"limit of {LIMIT} bytes"),
    ]
    for r, status, kind, says in cases:
        assert r.status_code == status, (r.status_code, r.text)
        assert r.headers["content-type"] == "application/json" and r.json()["kind"] == kind, r.text
        assert says in r.json()["error"], r.text
    fake.folders.add("/home/user/Desktop")
    r = put(client, rid, lid, "/home/user/Desktop", b"x")
    assert r.status_code == 409 and r.json() == {"error": "/home/user/Desktop is a folder", "kind": "conflict"}
    fake.desktop_files["/tmp/big"] = b"\0" * (guest_files.MAX_DOWNLOAD_BYTES + 1)
    r = get(client, rid, lid, "/tmp/big")
    assert r.status_code == 413 and r.json()["kind"] == "too_large" and "over 8388608 bytes" in r.json()["error"]
    assert not any(p.startswith("/etc") for p in fake.desktop_files)  # nothing refused was written


def test_an_upload_is_refused_while_a_person_drives_the_replica(fake: FakeHost, client: TestClient) -> None:
    """A person who took the replica over from the dashboard holds it as against a step (409 busy); a download, like
    an observation, goes on."""
    rid, lid = lease(client)
    assert put(client, rid, lid, "/tmp/x", b"1").status_code == 200
    csrf = ui_login(client, TOKEN)
    change = {"X-CSRF-Token": csrf, "Origin": "http://testserver"}
    assert client.post(f"/ui/api/replicas/{rid}/take-over", headers=change).status_code == 200
    r = put(client, rid, lid, "/tmp/x", b"2")
    assert r.status_code == 409 and r.json()["kind"] == "busy" and "taken over" in r.json()["error"]
    assert get(client, rid, lid, "/tmp/x").content == b"1"
    assert client.post(f"/ui/api/replicas/{rid}/hand-back", headers=change).status_code == 200
    assert put(client, rid, lid, "/tmp/x", b"2").status_code == 200


def test_the_contract_publishes_files_as_bytes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    put_op, get_op = (spec["paths"]["/v1/replicas/{rid}/files"][m] for m in ("put", "get"))
    binary = {"type": "string", "format": "binary"}
    assert put_op["requestBody"]["content"] == {"application/octet-stream": {"schema": binary}}
    assert put_op["requestBody"]["required"] is True
    assert put_op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FileWritten"
    }
    assert get_op["responses"]["200"]["content"] == {"application/octet-stream": {"schema": binary}}
    assert "requestBody" not in get_op
    for op in (put_op, get_op):
        assert {p["name"] for p in op["parameters"]} == {"rid", "lease_id", "path"}
        assert {"403", "404", "409", "413", "422", "503"} <= set(op["responses"])


def test_a_raw_body_handler_takes_the_bytes_and_nothing_else() -> None:
    routes = Routes(OPERATIONS)

    def no_bytes(rid: str, query: Annotated[FileQuery, Query()], who: Caller) -> None: ...

    with pytest.raises(RuntimeError, match="upload_file handler .* lacks: body"):
        routes.mount(UPLOAD_FILE, no_bytes)

    def plain_bytes(rid: str, query: Annotated[FileQuery, Query()], data: bytes, who: Caller) -> None: ...

    with pytest.raises(RuntimeError, match="parameter data .* is not in the operation's table entry"):
        routes.mount(UPLOAD_FILE, plain_bytes)

    def bytes_on_a_get(rid: str, query: Annotated[FileQuery, Query()], data: RawBody, who: Caller) -> None: ...

    with pytest.raises(RuntimeError, match="parameter data .* is not in the operation's table entry"):
        routes.mount(DOWNLOAD_FILE, bytes_on_a_get)

    def fine(rid: str, query: Annotated[FileQuery, Query()], data: RawBody, who: Caller) -> None: ...

    routes.mount(UPLOAD_FILE, fine)


# --- through the gateway, and from the SDK ----------------------------------------------------------------------
@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("h1", FakeHost(tmp_path / "h1", ready=2), free_port())
    a.start()
    yield a
    a.stop()


def test_the_gateway_relays_bytes_both_ways_and_the_hosts_refusals(agent: Agent) -> None:
    gw_token = "gateway-token-0123456789"
    gw_auth = {"Authorization": f"Bearer {gw_token}"}
    with TestClient(create_gateway(gw_token, [agent.entry], max_body_bytes=LIMIT)) as gw:
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=gw_auth)
        assert r.status_code == 201, r.text
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        assert rid.startswith("h1.") and lid.startswith("h1.")
        q = {"lease_id": lid, "path": "/home/user/through-the-gateway.bin"}
        headers = {**gw_auth, "Content-Type": "application/octet-stream"}
        r = gw.put(f"/v1/replicas/{rid}/files", params=q, content=EVERY_BYTE, headers=headers)
        assert r.status_code == 200 and r.json()["bytes"] == len(EVERY_BYTE), r.text
        assert agent.host.desktop_files["/home/user/through-the-gateway.bin"] == EVERY_BYTE
        r = gw.get(f"/v1/replicas/{rid}/files", params=q, headers=gw_auth)
        assert r.status_code == 200 and r.content == EVERY_BYTE
        assert r.headers["content-type"] == "application/octet-stream"
        r = gw.get(f"/v1/replicas/{rid}/files", params={**q, "path": "/etc/passwd"}, headers=gw_auth)
        assert r.status_code == 403 and r.json()["kind"] == "forbidden" and "is outside" in r.json()["error"]
        r = gw.get(f"/v1/replicas/{rid}/files", params={**q, "path": "/tmp/none"}, headers=gw_auth)
        assert r.status_code == 404 and r.json()["kind"] == "not_found"
        r = gw.put(f"/v1/replicas/{rid}/files", params=q, content=b"x" * (LIMIT + 1), headers=headers)
        assert r.status_code == 413 and r.json()["kind"] == "too_large"  # the gateway's own limit, unread
        assert gw.get("/health", headers=gw_auth).json()["max_body_bytes"] == LIMIT  # what the SDK checks first
        assert "max_body_bytes" not in gw.get("/health").json()
        assert agent.host.desktop_files["/home/user/through-the-gateway.bin"] == EVERY_BYTE


def test_the_sdk_uploads_and_downloads_blocking_and_async(agent: Agent) -> None:
    url, token = f"http://127.0.0.1:{agent.port}", f"token-{agent.name}"
    data = os.urandom(100_000)
    with Fleet(url, token) as fleet, fleet.lease() as s:
        assert s.upload("/home/user/sdk/blob.bin", data) == len(data)
        assert s.download("/home/user/sdk/blob.bin") == data
        with pytest.raises(ForbiddenError, match="is outside /home/user/ and /tmp/") as refused:
            s.upload("/etc/passwd", b"root::0:0::/root:/bin/sh\n")
        assert refused.value.status == 403
        with pytest.raises(NotFoundError, match="no file /tmp/missing"):
            s.download("/tmp/missing")
        # Over the server's limit: refused before it is sent, with the figure the server publishes (sent, the
        # server's 413 before reading it can be lost in the connection's reset).
        assert fleet.health()["max_body_bytes"] == DEFAULT_MAX_BODY_BYTES
        with pytest.raises(
            InvalidRequestError, match=f"over the server's limit of {DEFAULT_MAX_BODY_BYTES} bytes"
        ) as e:
            s.upload("/tmp/huge", bytes(DEFAULT_MAX_BODY_BYTES + 1))
        assert e.value.status == 413 and "/tmp/huge" not in agent.host.desktop_files

    async def run() -> None:
        async with AsyncFleet(url, token) as fleet, fleet.lease() as s:
            assert await s.upload("/tmp/a.txt", b"hello\n") == 6
            assert await s.download("/tmp/a.txt") == b"hello\n"
            agent.host.desktop_files["/tmp/big"] = b"\0" * (guest_files.MAX_DOWNLOAD_BYTES + 1)
            with pytest.raises(InvalidRequestError, match="/tmp/big is over") as too_large:
                await s.download("/tmp/big")
            assert too_large.value.status == 413 and too_large.value.kind == "too_large"

    asyncio.run(run())
