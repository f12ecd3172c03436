"""The query script's waits on a browser that is slow to answer (a window opening in an emulated guest).

CI once lost a task's whole set-up budget to one tab: the wait for the page to load asked the page through a
session bounded only by the operation's deadline, and the guest command was killed before the script could say
why. Here a real websocket server plays a browser that lists its tabs late and never answers a command.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from websockets.sync.server import ServerConnection, serve

from osfleet.tasks.osworld_format import guest_query
from osfleet.tasks.osworld_format.guest import query as q

pytestmark = pytest.mark.integration


class Browser:
    """``/json/list`` fails ``busy`` times (connection dropped) before listing one tab whose websocket takes
    commands and answers none."""

    def __init__(self, busy: int) -> None:
        self.busy, self.listed, self.commands = busy, 0, 0
        self.ws = serve(self._socket, "127.0.0.1", 0)
        self.ws_port = self.ws.socket.getsockname()[1]
        browser = self

        class Http(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                browser.listed += 1
                if browser.listed <= browser.busy:
                    self.close_connection = True
                    self.connection.close()
                    return
                body = json.dumps([{"id": "T1", "webSocketDebuggerUrl": f"ws://127.0.0.1:{browser.ws_port}/T1"}])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Http)

    def _socket(self, conn: ServerConnection) -> None:
        for _ in conn:
            self.commands += 1  # never answered: a renderer that is still starting

    def __enter__(self) -> Browser:
        threading.Thread(target=self.ws.serve_forever, daemon=True).start()
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.ws.shutdown()


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    with Browser(busy=2) as b:
        monkeypatch.setattr(q, "DEVTOOLS", f"http://127.0.0.1:{b.http.server_address[1]}")
        yield b


def test_a_page_wait_ends_with_its_share_not_the_operations_deadline(browser: Browser) -> None:
    operation, share = q.Deadline(60), q.Deadline(2)
    t0 = time.monotonic()
    page = q._page_session("T1", share)  # the tab list is refused twice, then read
    loaded = q._wait_loaded(page, share)
    took = time.monotonic() - t0
    page.close()
    assert browser.listed == 3 and browser.commands >= 1
    assert loaded is False and took < 5, took  # not the 60 s the operation has left
    assert operation.left() > 50


def test_a_tab_list_that_never_comes_ends_at_the_deadline(browser: Browser) -> None:
    browser.busy = 10**6
    t0 = time.monotonic()
    with pytest.raises(OSError):
        q._page_session("T1", q.Deadline(1.5))
    assert time.monotonic() - t0 < 4


@pytest.mark.parametrize(("timeout", "stops"), [(4.0, 1.0), (30.0, 27.0), (60.0, 54.0), (117.0, 107.0)])
def test_the_script_stops_before_its_command_is_killed(timeout: float, stops: float) -> None:
    assert guest_query.script_deadline(timeout) == pytest.approx(stops)
    assert json.loads(shlex.split(guest_query.command("op", {}, timeout))[-1])["deadline"] == stops
