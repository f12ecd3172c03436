"""The dashboard in real headless Chromium (Debian's, driven by Playwright) against host agents on loopback over
fake hosts (no VM): log in (the token in an HTTP-only cookie, never in a URL), a replica's thumbnail changes after
an action, the live view with take-over, a recorded trajectory stepped through; the same through the gateway.
A screenshot of each page is saved into the test's tmp dir."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import uvicorn
from fastapi import FastAPI, WebSocketDisconnect
from fastapi.testclient import TestClient
from PIL import Image

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig, RecordingConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

pytestmark = pytest.mark.system

TOKEN = "ui-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TASK = {
    "id": "t-ui",
    "instruction": "Click somewhere (the fake's check never passes: reward 0).",
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "check"},
        "expected": {"type": "rule", "rules": {"expected": "yes\n"}},  # OSWorld's exact_match: the whole output
    },
}
COLOURS = [(200, 30, 30), (30, 160, 60), (40, 80, 220), (230, 160, 0), (120, 40, 160)]


class ScreenHost(FakeHost):
    """A fake host whose screen changes with every action batch applied (one colour per count)."""

    def screen_of(self, rec: Any, fmt: str, quality: int | None) -> bytes:
        rid = rec.id
        n = sum(1 for r, _ in self.applied if r == rid)
        img = Image.new("RGB", self.image.screen, COLOURS[n % len(COLOURS)])
        buf = io.BytesIO()
        img.save(buf, {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt], quality=quality or 95)
        return buf.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: FastAPI) -> Served:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", ws="wsproto"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    return Served(f"http://127.0.0.1:{port}", server, thread)


@pytest.fixture
def fake(tmp_path: Path) -> ScreenHost:
    host = ScreenHost(tmp_path / "home", ready=2)
    host.image.screen = (320, 200)
    return host


@pytest.fixture
def agent(fake: ScreenHost) -> Iterator[Served]:
    config = AgentConfig(token=TOKEN, warm=0, recording=RecordingConfig(quality=80))
    served = serve(create_app(config, lambda: fake))
    yield served
    served.stop()


def shot(page: Any, tmp_path: Path, name: str) -> None:
    out = tmp_path / "screenshots" / f"{name}.png"
    out.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 1000


# Reads the centre pixel of an <img> through a canvas (same origin).
PIXEL = """img => { const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight; const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  return Array.from(g.getImageData(c.width >> 1, c.height >> 1, 1, 1).data.slice(0, 3)); }"""


def close_to(rgb: list[int], want: tuple[int, int, int]) -> bool:
    return all(abs(a - b) < 40 for a, b in zip(rgb, want, strict=True))


def wait_for_colour(page: Any, selector: str, want: tuple[int, int, int], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while time.monotonic() < deadline:
        img = page.query_selector(selector)
        if img is not None and page.evaluate("img => img.complete && img.naturalWidth > 0", img):
            seen = page.evaluate(PIXEL, img)
            if close_to(seen, want):
                return
        time.sleep(0.2)
    raise AssertionError(f"{selector} never showed {want}; last {seen}")


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}/ui")
    assert page.url == f"{base}/ui/login"  # pages need the cookie
    page.fill("#token", "wrong")
    page.click("#login")
    assert page.inner_text("#login-error") == "wrong token"
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_url(f"{base}/ui")
    assert TOKEN not in page.url


@pytest.fixture
def api(agent: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=agent.url, headers=AUTH, timeout=10) as client:
        yield client


def test_dashboard_login_live_thumbnail_take_over_and_replay(
    agent: Served, api: httpx.Client, fake: ScreenHost, browser: Any, tmp_path: Path
) -> None:
    lease = api.post("/v1/leases", json={"holder": "trainer-ui"}).json()
    rid, lid = lease["replica_id"], lease["lease_id"]
    assert api.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}).status_code == 200

    page = browser.new_page()
    page.goto(f"{agent.url}/ui/login")
    shot(page, tmp_path, "1-login")
    log_in(page, agent.url)
    [cookie] = [c for c in browser.cookies() if c["name"] == "osfleet_ui"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""  # not readable by scripts

    thumb = f'a[data-replica="{rid}"] img.thumb'
    wait_for_colour(page, thumb, COLOURS[0])
    assert "trainer-ui" in page.inner_text(f'a[data-replica="{rid}"]')
    assert "replicas" in page.inner_text("table.figures")  # the host's figures from /v1/host
    step = {
        "lease_id": lid,
        "action_id": "a1",
        "actions": [{"type": "click", "x": 10, "y": 10}],
        "metadata": {"model": "ui-test-policy", "tokens": 12},
    }
    assert api.post(f"/v1/replicas/{rid}/step", json=step).status_code == 200
    wait_for_colour(page, thumb, COLOURS[1])  # the thumbnail follows the screen without a reload
    shot(page, tmp_path, "2-dashboard")

    # The live view: frames over the WebSocket, then a person takes over, clicks, and hands it back.
    page.click(f'a[data-replica="{rid}"]')
    page.wait_for_url(f"{agent.url}/ui/replicas/{rid}")
    page.wait_for_function("document.getElementById('screen').dataset.frames >= '1'")
    wait_for_colour(page, "#screen", COLOURS[1])
    page.click("#take")
    page.wait_for_selector("#give:not([hidden])")
    step2 = {**step, "action_id": "a2"}
    busy = api.post(f"/v1/replicas/{rid}/step", json=step2)
    assert busy.status_code == 409 and "taken over" in busy.json()["error"]
    page.click("#screen", position={"x": 100, "y": 50})
    wait_for_colour(page, "#screen", COLOURS[2])  # the person's click went through the act path
    person = fake.applied[-1][1][0]
    assert person.type == "click" and 0 < person.x < 320 and 0 < person.y < 200  # type: ignore[union-attr]
    shot(page, tmp_path, "3-live-taken-over")
    page.click("#give")
    page.wait_for_selector("#take:not([hidden])")
    assert api.post(f"/v1/replicas/{rid}/step", json=step2).status_code == 200  # handed back
    assert api.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}).json()["reward"] == 0.0
    assert api.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}).status_code == 200

    # The trajectory browser: the episode just recorded, replayed step by step.
    page.goto(f"{agent.url}/ui/trajectories")
    rows = page.query_selector_all("#episodes tbody tr")
    assert len(rows) == 1 and "agent: evaluated" in rows[0].inner_text()
    shot(page, tmp_path, "4-trajectories")
    rows[0].query_selector("a").click()
    page.wait_for_selector("#frame")
    assert page.get_attribute("#frame", "data-position") == "0"
    wait_for_colour(page, "#frame", COLOURS[0])  # right after the reset
    page.click("#next")
    wait_for_colour(page, "#frame", COLOURS[1])
    assert '"action_id": "a1"' in page.inner_text("#detail") and "ui-test-policy" in page.inner_text("#detail")
    page.click("#next")
    assert '"source": "person"' in page.inner_text("#detail")
    wait_for_colour(page, "#frame", COLOURS[2])
    page.click("#next")
    assert page.inner_text("#position") == "step 3 of 3"
    wait_for_colour(page, "#frame", COLOURS[3])
    shot(page, tmp_path, "5-replay")
    page.click("#first")
    assert page.get_attribute("#frame", "data-position") == "0"

    page.click("text=Log out")
    page.wait_for_url(f"{agent.url}/ui/login")
    page.goto(f"{agent.url}/ui/trajectories")
    assert page.url == f"{agent.url}/ui/login"


def test_the_gateway_dashboard_shows_every_hosts_replicas_and_trajectories(
    agent: Served, api: httpx.Client, fake: ScreenHost, browser: Any, tmp_path: Path
) -> None:
    lease = api.post("/v1/leases", json={"holder": "via-gateway"}).json()
    rid, lid = lease["replica_id"], lease["lease_id"]
    step = {"lease_id": lid, "action_id": "g1", "actions": [{"type": "click", "x": 5, "y": 5}]}
    assert api.post(f"/v1/replicas/{rid}/step", json=step).status_code == 200
    assert api.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}).status_code == 200

    gw = serve(create_gateway("gw-token", [HostEntry(name="kvm1", url=agent.url, token=TOKEN)]))
    try:
        page = browser.new_page()
        page.goto(f"{gw.url}/ui/login")
        page.fill("#token", "gw-token")
        page.click("#login")
        page.wait_for_url(f"{gw.url}/ui")
        cards = page.query_selector_all("a[data-replica]")
        assert {c.get_attribute("data-replica") for c in cards} == {f"kvm1.{r.id}" for r in fake.replicas()}
        assert "kvm1" in page.inner_text("table.figures caption")
        wait_for_colour(page, f'a[data-replica="kvm1.{rid}"] img.thumb', COLOURS[1])  # through the host
        shot(page, tmp_path, "gateway-dashboard")
        page.goto(f"{gw.url}/ui/trajectories")
        page.click("#episodes tbody tr a")
        page.wait_for_selector("#frame")
        page.click("#next")
        wait_for_colour(page, "#frame", COLOURS[1])
        assert '"action_id": "g1"' in page.inner_text("#detail")
        shot(page, tmp_path, "gateway-replay")

        # Take-over through the gateway: the live view's frames come through it, and so does the person's input.
        lease = api.post("/v1/leases", json={"holder": "via-gateway"}).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        page.goto(f"{gw.url}/ui/replicas/kvm1.{rid}")
        page.wait_for_function("document.getElementById('screen').dataset.frames >= '1'")
        page.click("#take")
        page.wait_for_selector("#give:not([hidden])")
        step = {"lease_id": lid, "action_id": "g2", "actions": [{"type": "click", "x": 5, "y": 5}]}
        assert api.post(f"/v1/replicas/{rid}/step", json=step).status_code == 409
        before = len(fake.applied)
        page.click("#screen", position={"x": 30, "y": 30})
        deadline = time.monotonic() + 10
        while len(fake.applied) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fake.applied[-1][1][0].type == "click"
        shot(page, tmp_path, "gateway-live-taken-over")
        page.click("#give")
        page.wait_for_selector("#take:not([hidden])")
        assert api.post(f"/v1/replicas/{rid}/step", json=step).status_code == 200
    finally:
        gw.stop()


def ui_login(c: TestClient, token: str) -> str:
    """Log in through the form as a browser would (its CSRF field and cookie); returns the session's CSRF token."""
    form = c.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    r = c.post("/ui/login", data={"token": token, "csrf": csrf.group(1)}, headers={"Origin": "http://testserver"})
    assert r.status_code == 200 and "Replicas" in r.text, r.text[:300]  # followed the redirect with the cookie
    meta = re.search(r'<meta name="csrf" content="([^"]+)">', r.text)
    assert meta is not None
    return meta.group(1)


def test_ui_routes_need_a_session_and_stay_out_of_the_openapi(fake: ScreenHost) -> None:
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake)) as c:
        assert not [p for p in c.get("/openapi.json").json()["paths"] if p.startswith("/ui")]
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        rid = fake.replicas()[0].id
        assert c.get(f"/ui/replicas/{rid}/screen.jpg").status_code == 401
        assert c.get("/ui/api/replicas").status_code == 401
        assert c.get("/ui/api/replicas", headers=AUTH).json()[0]["id"] == rid  # the gateway's way in
        csrf = ui_login(c, TOKEN)
        assert c.get(f"/ui/replicas/{rid}/screen.jpg").headers["content-type"] == "image/jpeg"
        with c.websocket_connect(f"/ui/ws/replicas/{rid}") as ws:
            ws.send_json({"op": "hello", "csrf": csrf})  # the session's CSRF token: the first message
            assert ws.receive_bytes()[:2] == b"\xff\xd8"  # a JPEG frame
            ws.send_json({"op": "take"})  # a ready replica (no lease) is not taken over
            assert "only a leased replica" in ws.receive_json()["error"]
        # A take-over holds for the lease it was made under: released, the replica serves its next lease.
        lease = c.post("/v1/leases", json={}, headers=AUTH).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        change = {"X-CSRF-Token": csrf, "Origin": "http://testserver"}
        assert c.post(f"/ui/api/replicas/{rid}/take-over", headers=change).status_code == 200
        step = {"lease_id": lid, "action_id": "s1", "actions": [{"type": "click", "x": 1, "y": 1}]}
        assert c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).json()["kind"] == "busy"
        r = c.post(f"/ui/api/replicas/{rid}/act", json=[{"type": "click", "x": 999, "y": 1}], headers=change)
        assert r.status_code == 422
        assert c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH).status_code == 200
        again = c.post("/v1/leases", json={}, headers=AUTH).json()
        while again["replica_id"] != rid:  # the other ready replica came first
            again = c.post("/v1/leases", json={}, headers=AUTH).json()
        step = {**step, "lease_id": again["lease_id"]}
        assert c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).status_code == 200
        c.cookies.clear()  # no session: the live view's socket is closed before it opens (policy violation)
        with pytest.raises(WebSocketDisconnect) as closed, c.websocket_connect(f"/ui/ws/replicas/{rid}"):
            pass
        assert closed.value.code == 1008


def test_the_session_cookie_holds_an_id_never_the_token(fake: ScreenHost) -> None:
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake)) as c:
        ui_login(c, TOKEN)
        cookie = c.cookies.get("osfleet_ui")
        assert cookie and TOKEN not in cookie and len(cookie) >= 40
        assert c.get("/ui", follow_redirects=False).status_code == 200
        c.cookies.clear()
        c.cookies.set("osfleet_ui", TOKEN)  # the old scheme: the token as the cookie
        assert c.get("/ui", follow_redirects=False).headers["location"] == "/ui/login"


def test_every_state_change_needs_the_origin_and_the_csrf_token(fake: ScreenHost) -> None:
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake)) as c:
        # the login form: its CSRF field must match its cookie, and come from this origin
        form = c.get("/ui/login").text
        field = re.search(r'name="csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
        for data, origin in (
            ({"token": TOKEN}, "http://testserver"),
            ({"token": TOKEN, "csrf": "forged"}, "http://testserver"),
            ({"token": TOKEN, "csrf": field}, "http://evil.example"),
        ):
            r = c.post("/ui/login", data=data, headers={"Origin": origin}, follow_redirects=False)
            assert r.status_code == 403 and "osfleet_ui=" not in r.headers.get("set-cookie", ""), data
        r = c.post(
            "/ui/login", content=b"token=" + b"x" * 8192, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert r.status_code == 413  # the form's own limit, read no further
        csrf = ui_login(c, TOKEN)
        rid = c.post("/v1/leases", json={}, headers=AUTH).json()["replica_id"]
        take = f"/ui/api/replicas/{rid}/take-over"
        here = {"Origin": "http://testserver"}
        assert c.post(take, headers=here).status_code == 403  # no CSRF token
        assert c.post(take, headers={**here, "X-CSRF-Token": "forged"}).status_code == 403
        assert c.post(take, headers={"Origin": "http://evil.example", "X-CSRF-Token": csrf}).status_code == 403
        assert c.post(f"/ui/api/replicas/{rid}/hand-back", headers=here).status_code == 403
        assert c.post(f"/ui/api/replicas/{rid}/act", json=[], headers=here).status_code == 403
        assert fake.applied == []
        assert c.post(take, headers={**here, "X-CSRF-Token": csrf}).status_code == 200
        # the live view's socket: from this origin (else closed before it opens), then the session's CSRF token
        # as its first message (else closed before a frame is sent)
        live = f"/ui/ws/replicas/{rid}"
        evil = {"Origin": "http://evil.example"}
        with pytest.raises(WebSocketDisconnect) as closed, c.websocket_connect(live, headers=evil):
            pass
        assert closed.value.code == 1008
        for hello in ({"op": "hello"}, {"op": "hello", "csrf": "forged"}, {"op": "take", "csrf": csrf}, "not json"):
            with c.websocket_connect(live) as ws, pytest.raises(WebSocketDisconnect) as closed:
                ws.send_text(json.dumps(hello) if isinstance(hello, dict) else hello)
                ws.receive_bytes()
            assert closed.value.code == 1008, hello
        # logging out: the session's CSRF token too; then the session is gone, whoever kept its cookie
        kept = c.cookies.get("osfleet_ui")
        assert c.post("/ui/logout", data={"csrf": "forged"}, headers=here).status_code == 403
        assert c.get("/ui", follow_redirects=False).status_code == 200
        r = c.post("/ui/logout", data={"csrf": csrf}, headers=here, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        c.cookies.clear()
        c.cookies.set("osfleet_ui", kept or "")
        assert c.get("/ui", follow_redirects=False).headers["location"] == "/ui/login"


ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"


def test_a_clients_dashboard_shows_and_changes_only_its_own(fake: ScreenHost, tmp_path: Path) -> None:
    clients_file = tmp_path / "clients"
    clients_file.write_text(f"alice {ALICE}\nbob {BOB}\n")
    config = AgentConfig(token=TOKEN, warm=0, recording=RecordingConfig(), clients=load_clients(clients_file, TOKEN))
    with TestClient(create_app(config, lambda: fake)) as c:
        alice = {"Authorization": f"Bearer {ALICE}"}
        lease = c.post("/v1/leases", json={}, headers=alice).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        step = {"lease_id": lid, "action_id": "a1", "actions": [{"type": "click", "x": 1, "y": 1}], "observe": False}
        assert c.post(f"/v1/replicas/{rid}/step", json=step, headers=alice).status_code == 200
        csrf = ui_login(c, BOB)
        change = {"X-CSRF-Token": csrf, "Origin": "http://testserver"}
        assert c.get("/ui/api/replicas").json() == []  # not alice's, not the warm pool
        page = c.get("/ui").text
        assert rid not in page and "figures" not in page  # nor the host's figures (every tenant's)
        assert c.get(f"/ui/replicas/{rid}/screen.jpg").status_code == 404
        assert c.get(f"/ui/replicas/{rid}").status_code == 404
        assert c.post(f"/ui/api/replicas/{rid}/take-over", headers=change).status_code == 404
        assert c.post(f"/ui/api/replicas/{rid}/hand-back", headers=change).status_code == 404
        with c.websocket_connect(f"/ui/ws/replicas/{rid}") as ws:
            ws.send_json({"op": "hello", "csrf": csrf})
            assert "no replica" in ws.receive_json()["error"]  # no frame of alice's screen
            ws.send_json({"op": "take"})
            assert "no replica" in ws.receive_json()["error"]
        assert c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=alice).status_code == 200
        (episode,) = c.get("/ui/api/trajectories", headers=alice).json()
        assert episode["owner"] == "alice"
        assert c.get("/ui/api/trajectories").json() == []  # bob's session
        assert c.get(f"/ui/api/trajectories/{episode['id']}").status_code == 404
        assert c.get(f"/ui/trajectories/{episode['id']}").status_code == 404
        assert c.get("/ui/api/trajectories", headers=AUTH).json()[0]["id"] == episode["id"]  # the operator's
        # bob's own: he sees it, takes it over and drives it
        mine = c.post("/v1/leases", json={}, headers={"Authorization": f"Bearer {BOB}"}).json()
        assert [r["id"] for r in c.get("/ui/api/replicas").json()] == [mine["replica_id"]]
        assert c.post(f"/ui/api/replicas/{mine['replica_id']}/take-over", headers=change).status_code == 200
        root = [{"type": "shell", "command": "id -u", "as_root": True}]
        r = c.post(f"/ui/api/replicas/{mine['replica_id']}/act", json=root, headers=change)
        assert r.status_code == 403 and "as_root" in r.json()["error"]


def test_through_the_gateway_a_clients_dashboard_shows_only_its_own(
    agent: Served, api: httpx.Client, fake: ScreenHost, tmp_path: Path
) -> None:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\nbob {BOB}\n")
    gw = create_gateway("gw-token-0123456789", [HostEntry(name="kvm1", url=agent.url, token=TOKEN)],
                        clients=load_clients(clients, "gw-token-0123456789"))  # fmt: skip
    with TestClient(gw) as c:
        mine = c.post("/v1/leases", json={}, headers={"Authorization": f"Bearer {ALICE}"}).json()
        theirs = c.post("/v1/leases", json={}, headers={"Authorization": f"Bearer {BOB}"}).json()
        assert mine["replica_id"] != theirs["replica_id"]
        csrf = ui_login(c, ALICE)
        assert [r["id"] for r in c.get("/ui/api/replicas").json()] == [mine["replica_id"]]
        page = c.get("/ui").text
        assert mine["replica_id"] in page and theirs["replica_id"] not in page
        change = {"X-CSRF-Token": csrf, "Origin": "http://testserver"}
        assert c.get(f"/ui/replicas/{theirs['replica_id']}/screen.jpg").status_code == 404
        assert c.post(f"/ui/api/replicas/{theirs['replica_id']}/take-over", headers=change).status_code == 404
        assert c.post(f"/ui/api/replicas/{mine['replica_id']}/take-over", headers=change).status_code == 200
