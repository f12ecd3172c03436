"""A server command stops on SIGTERM although a client keeps a stream open (``osfleet.cli_support.serve``).

Seen with ``osfleet e2b serve``: a client that followed a background command kept its stream open, and the server
waited for it for ever after SIGTERM (uvicorn's graceful shutdown has no deadline by default), so its clean-up never
ran. Every server command shares ``serve``; an endless stream stands for any of theirs here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from osfleet.cli_support import GRACEFUL_SECONDS
from tests.test_fleet import free_port

pytestmark = pytest.mark.system

ENDLESS = """
import asyncio, sys
from osfleet.cli_support import serve

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                print("lifespan shutdown ran", flush=True)
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    while True:  # a stream that never ends by itself
        await send({"type": "http.response.body", "body": b"tick\\n", "more_body": True})
        await asyncio.sleep(0.2)

serve(app, "127.0.0.1", int(sys.argv[1]), "warning")
"""


def test_sigterm_stops_a_server_whose_client_keeps_a_stream_open() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ENDLESS, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    stream = client.stream("GET", f"http://127.0.0.1:{port}/")
                    response = stream.__enter__()
                    break
                except httpx.TransportError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            try:
                assert next(response.iter_lines()) == "tick"  # the stream is open and flowing
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.wait(GRACEFUL_SECONDS + 30)  # without the deadline: TimeoutExpired
                assert time.monotonic() - t0 >= min(GRACEFUL_SECONDS, 1.0)  # graceful first, then cut
            finally:
                stream.__exit__(None, None, None)
        assert proc.stdout is not None and "lifespan shutdown ran" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
