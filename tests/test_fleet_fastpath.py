"""The step's fast path in the gateway (osfleet/fleet/fastpath.py): a plain step reaches the host as the route
would send it, and every request that is not plain gets exactly the route's answer (no VM, a stub host)."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from osfleet.config import ClientToken
from osfleet.fleet import fastpath
from osfleet.fleet.app import create_gateway
from osfleet.fleet.fastpath import StepFastPath
from osfleet.fleet.hosts import HostEntry

pytestmark = pytest.mark.unit

TOKEN = "gateway-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STEP = {"lease_id": "h1.l-1", "action_id": "a1", "actions": [{"type": "wait", "seconds": 0}], "observe": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StubHost:
    """A host agent's step as seen from outside: what it was sent, and an answer (a 409 for lease ``l-bad``)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.acting_for: list[str | None] = []  # the X-Osfleet-Client the gateway named, per step
        self.port = free_port()
        app = FastAPI()

        @app.get("/health")
        def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/host")
        def sample() -> dict[str, Any]:
            return {"replicas": {"ready": 1}}

        @app.post("/v1/replicas/{rid}/step")
        async def step(rid: str, request: Request) -> JSONResponse:
            body = await request.json()
            self.received.append((rid, body))
            self.acting_for.append(request.headers.get("x-osfleet-client"))
            if body["lease_id"] == "l-bad":
                return JSONResponse({"error": "lease l-bad expired", "kind": "lease"}, status_code=409)
            answer = {
                "action_id": body["action_id"],
                "replayed": False,
                "done": False,
                "results": [],
                "observation": None,
            }
            return JSONResponse(answer, headers={"Retry-After": "1", "X-Other": "dropped"})

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StubHost:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def host() -> Iterator[StubHost]:
    with StubHost() as h:
        yield h


CLIENT = "alice-token-0123456789"


def gateway(host: StubHost, fast: bool = True) -> TestClient:
    entry = HostEntry(name="h1", url=f"http://127.0.0.1:{host.port}", token="host-token")
    alice = ClientToken("alice", hashlib.sha256(CLIENT.encode()).digest())
    app = create_gateway(TOKEN, [entry], clients=(alice,))
    if not fast:  # the route alone, as before the fast path
        app.user_middleware = [m for m in app.user_middleware if m.cls is not StepFastPath]
    return TestClient(app)


def test_a_plain_step_reaches_the_host_as_the_route_would_send_it(
    host: StubHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain: list[bool] = []
    original = fastpath._valid_step_request

    def spy(*args: Any) -> Any:
        out = original(*args)
        plain.append(out is not None)
        return out

    monkeypatch.setattr(fastpath, "_valid_step_request", spy)
    answers, sent = [], []
    for fast in (True, False):
        host.received.clear()
        with gateway(host, fast) as gw:
            r = gw.post("/v1/replicas/h1.r-1/step", json={**STEP, "metadata": {"model": "m"}}, headers=AUTH)
            answers.append((r.status_code, r.json(), r.headers.get("retry-after"), r.headers.get("x-other")))
            r = gw.post("/v1/replicas/h1.r-1/step", json={**STEP, "lease_id": "h1.l-bad"}, headers=AUTH)
            answers.append((r.status_code, r.json(), r.headers.get("retry-after"), r.headers.get("x-other")))
        sent.append(host.received[:])
    assert plain == [True, True]  # both served by the fast path when it is there
    assert sent[0] == sent[1]  # the host cannot tell
    (rid, body), _ = sent[0]
    assert rid == "r-1" and body["lease_id"] == "l-1" and body["metadata"] == {"model": "m"}
    assert answers[:2] == answers[2:]
    done = {"action_id": "a1", "replayed": False, "done": False, "results": [], "observation": None}
    assert answers[0] == (200, done, "1", None)  # Retry-After passes, other headers do not (as before)
    assert answers[1][:2] == (409, {"error": "lease l-bad expired", "kind": "lease"})


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/replicas/h1.r-1/step", json.dumps(STEP), {}),  # no token
        ("/v1/replicas/h1.r-1/step", json.dumps(STEP), {"Authorization": "Bearer wrong"}),
        ("/v1/replicas/h1.r-1/step", "{not json", AUTH),
        ("/v1/replicas/h1.r-1/step", "", AUTH),
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "actions": []}), AUTH),
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "actions": [{"type": "fly"}]}), AUTH),
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "extra": 1}), AUTH),
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "observe": "yes"}), AUTH),
        ("/v1/replicas/h1.r-1/step", "[" * 100_000, AUTH),  # deeper than the JSON parser goes
        ("/v1/replicas/h9.r-1/step", json.dumps(STEP), AUTH),  # no such host
        ("/v1/replicas/r-1/step", json.dumps(STEP), AUTH),  # not a fleet id
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "lease_id": "h2.l-1"}), AUTH),  # a lease elsewhere
        ("/v1/replicas/h1.r-1/step", json.dumps({**STEP, "lease_id": "l-1"}), AUTH),
    ],
)
def test_a_step_that_is_not_plain_gets_exactly_the_routes_answer(
    host: StubHost, path: str, body: str, headers: dict[str, str]
) -> None:
    answers = []
    for fast in (True, False):
        with gateway(host, fast) as gw:
            r = gw.post(path, content=body, headers={"Content-Type": "application/json", **headers})
            answers.append((r.status_code, r.json(), dict(r.headers)))
    assert answers[0] == answers[1]
    assert 400 <= answers[0][0] < 500, answers[0]


def test_a_step_sent_as_something_else_than_json_is_the_routes_too(host: StubHost) -> None:
    answers = []
    for fast in (True, False):
        with gateway(host, fast) as gw:
            r = gw.post(
                "/v1/replicas/h1.r-1/step", content=json.dumps(STEP), headers={**AUTH, "Content-Type": "text/plain"}
            )
            answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1] and answers[0][0] == 422


def test_a_host_that_is_gone_ends_the_step_as_infrastructure_either_way() -> None:
    with StubHost() as stub:
        gateways = [gateway(stub, fast) for fast in (True, False)]
        for gw in gateways:
            gw.__enter__()
    answers = []
    for gw in gateways:  # the host stopped after both gateways saw it healthy
        r = gw.post("/v1/replicas/h1.r-1/step", json=STEP, headers=AUTH)
        answers.append((r.status_code, r.json()["kind"], r.headers.get("retry-after")))
        gw.__exit__(None, None, None)
    assert answers == [(503, "infrastructure", "2")] * 2


def test_the_step_is_still_documented_with_its_request_body(host: StubHost) -> None:
    entry = HostEntry(name="h1", url=f"http://127.0.0.1:{host.port}", token="host-token")
    spec = create_gateway(TOKEN, [entry]).openapi()
    step = spec["paths"]["/v1/replicas/{rid}/step"]["post"]
    assert step["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/StepRequest"}
    assert {"401", "404", "409", "422", "503"} <= set(step["responses"])


def test_a_clients_step_names_the_client_to_the_host_either_way(host: StubHost) -> None:
    """The fast path authenticates with the route's own function: a client's step reaches the host with the
    client's name (never one the caller sent), the operator's with none."""
    for fast in (True, False):
        host.acting_for.clear()
        with gateway(host, fast) as gw:
            for headers in (
                {"Authorization": f"Bearer {CLIENT}"},
                {"Authorization": f"Bearer {CLIENT}", "X-Osfleet-Client": "bob"},
                {**AUTH, "X-Osfleet-Client": "bob"},
            ):
                assert gw.post("/v1/replicas/h1.r-1/step", json=STEP, headers=headers).status_code == 200
        assert host.acting_for == ["alice", "alice", None], fast
