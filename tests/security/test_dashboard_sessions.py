"""Dashboard logins: no client can end another's sessions, guessing tokens is throttled per address, logging in
in a loop is throttled per principal (429 with ``Retry-After``), and a login never adopts a session id the
browser brought (a new id, and the old session ends). Driven through the login form as a browser posts it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.ui import sessions
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

OPERATOR = "operator-token-0123456789"
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"
HERE = {"Origin": "http://testserver"}


@pytest.fixture
def app(tmp_path: Path) -> object:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\nbob {BOB}\n")
    config = AgentConfig(token=OPERATOR, warm=0, clients=load_clients(clients, OPERATOR))
    return create_app(config, lambda: FakeHost(tmp_path / "home", ready=1))


@pytest.fixture
def ui(app: object) -> Iterator[TestClient]:
    with TestClient(app) as c:  # type: ignore[arg-type]
        yield c


def login(c: TestClient, token: str) -> tuple[int, str | None]:
    """Post the login form as a browser does; (status, the session cookie set, if any)."""
    field = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
    assert field is not None
    r = c.post("/ui/login", data={"token": token, "csrf": field.group(1)}, headers=HERE, follow_redirects=False)
    cookie = re.search(r"osfleet_ui=([^;]+)", r.headers.get("set-cookie", ""))
    return r.status_code, cookie.group(1) if cookie else None


def page_with(c: TestClient, sid: str) -> int:
    c.cookies.clear()
    c.cookies.set("osfleet_ui", sid, path="/ui")
    return c.get("/ui", follow_redirects=False).status_code


def test_a_client_logging_in_over_and_over_never_ends_another_clients_session(
    ui: TestClient, app: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 40)  # the server-wide cap, small enough to fill here
    gate = app.state.ui_gate  # type: ignore[attr-defined]
    gate.throttle = sessions.LoginThrottle(logins_per_principal=10_000)  # only the session cap is under test
    status, alice = login(ui, ALICE)
    assert status == 303 and alice is not None
    statuses = []
    for _ in range(60):  # bob logs in more times than the server-wide cap
        ui.cookies.clear()
        statuses.append(login(ui, BOB)[0])
    # each one succeeds: past SESSIONS_PER_PRINCIPAL his own oldest session makes room, never alice's
    assert statuses == [303] * 60 and sessions.SESSIONS_PER_PRINCIPAL < sessions.MAX_SESSIONS - 1
    assert page_with(ui, alice) == 200  # alice is still logged in


def test_a_full_server_refuses_new_logins_instead_of_evicting(monkeypatch: pytest.MonkeyPatch) -> None:
    from osfleet.api.auth import Principal

    monkeypatch.setattr(sessions, "MAX_SESSIONS", 2)
    book = sessions.Sessions()
    a, b = book.create(Principal("a")), book.create(Principal("b"))
    with pytest.raises(sessions.SessionsFull):
        book.create(Principal("c"))
    assert book.get(a.id) is not None and book.get(b.id) is not None
    book.end(a.id)  # a logs out: a slot is free again
    assert book.get(book.create(Principal("c")).id) is not None


def test_guessing_tokens_is_throttled_per_address(app: object) -> None:
    with TestClient(app, client=("192.0.2.7", 40000)) as guesser:  # type: ignore[arg-type]
        answers = [login(guesser, f"guess-{n:04d}-0123456789")[0] for n in range(sessions.LOGIN_FAILURES_PER_ADDRESS)]
        assert answers == [401] * sessions.LOGIN_FAILURES_PER_ADDRESS
        field = re.search(r'name="csrf" value="([^"]+)"', guesser.get("/ui/login").text)
        r = guesser.post("/ui/login", data={"token": ALICE, "csrf": field.group(1)}, headers=HERE)  # type: ignore[union-attr]
        assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= sessions.LOGIN_WINDOW_SECONDS
        assert "too many login attempts" in r.text  # even the right token waits: nothing is compared
    with TestClient(app, client=("192.0.2.8", 40000)) as other:  # type: ignore[arg-type]
        assert login(other, ALICE)[0] == 303  # another address is not held up


def test_logging_in_in_a_loop_is_throttled_per_principal(app: object) -> None:
    with TestClient(app) as c:  # type: ignore[arg-type]
        for _ in range(sessions.LOGINS_PER_PRINCIPAL):
            c.cookies.clear()
            assert login(c, BOB)[0] == 303
        c.cookies.clear()
        field = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        r = c.post("/ui/login", data={"token": BOB, "csrf": field.group(1)}, headers=HERE)  # type: ignore[union-attr]
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        c.cookies.clear()
        assert login(c, ALICE)[0] == 303  # alice is not bob


def test_a_login_never_adopts_the_session_id_a_browser_brought(ui: TestClient) -> None:
    status, first = login(ui, ALICE)
    assert status == 303 and first is not None
    ui.cookies.set("osfleet_ui", first, path="/ui")
    status, second = login(ui, ALICE)  # the same browser logs in again with its cookie
    assert status == 303 and second not in (None, first)
    assert page_with(ui, first) == 303  # the old session ended: whoever kept its id is logged out
    assert page_with(ui, second) == 200  # type: ignore[arg-type]
    planted = "attacker-chosen-session-id-0123456789abcdef"
    ui.cookies.set("osfleet_ui", planted, path="/ui")
    status, third = login(ui, ALICE)
    assert third != planted and page_with(ui, planted) == 303
