"""The dashboard's CSRF token never travels in a URL (URLs end up in access logs, proxies and history). A real
browser (Debian's chromium) logs in and opens a replica's live view on a real server: the token from the page is
in no URL the browser requested, WebSockets included, and so in no access log line; and the live view's socket
takes the token as its first message only (a token in its URL opens nothing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from tests.fakes import FakeHost

pytestmark = pytest.mark.system

TOKEN = "ui-csrf-token-0123456789"


def test_the_csrf_token_is_in_no_url_the_browser_requests(
    tmp_path: Path, served: Callable[..., str], browser: Any
) -> None:
    fake = FakeHost(tmp_path / "home", ready=1)
    url = served(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake), ws="wsproto")
    rid = fake.replicas()[0].id
    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("websocket", lambda ws: requested.append(ws.url))
    page.goto(f"{url}/ui/login")
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_url(f"{url}/ui")
    page.goto(f"{url}/ui/replicas/{rid}")
    page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
    page.wait_for_function("document.getElementById('screen').dataset.frames >= '1'")  # the socket works
    csrf = page.get_attribute('meta[name="csrf"]', "content")
    assert csrf and len(csrf) >= 32
    sockets = [u for u in requested if u.startswith("ws")]
    assert sockets == [f"ws{url.removeprefix('http')}/ui/ws/replicas/{rid}"]
    assert [u for u in requested if csrf in u or "csrf=" in u] == []


@pytest.mark.parametrize("where", ["url", "nowhere"])
def test_a_token_in_the_sockets_url_opens_nothing(
    tmp_path: Path, served: Callable[..., str], browser: Any, where: str
) -> None:
    fake = FakeHost(tmp_path / "home", ready=1)
    url = served(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake), ws="wsproto")
    rid = fake.replicas()[0].id
    page = browser.new_page()
    page.goto(f"{url}/ui/login")
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_url(f"{url}/ui")
    page.goto(f"{url}/ui/replicas/{rid}")
    csrf = page.get_attribute('meta[name="csrf"]', "content")
    [cookie] = [c for c in browser.cookies() if c["name"] == "osfleet_ui"]
    socket_url = f"ws{url.removeprefix('http')}/ui/ws/replicas/{rid}" + (f"?csrf={csrf}" if where == "url" else "")
    headers = {"Cookie": f"osfleet_ui={cookie['value']}", "Origin": url}
    with connect(socket_url, additional_headers=headers, open_timeout=10) as ws:
        ws.send(json.dumps({"op": "take"}))  # no hello: the token in the URL does not count
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=15)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
