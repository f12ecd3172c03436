"""OSWorld's /start_recording and /end_recording on osfleet (``osfleet.osworld.recording``), through the protocol
server, over a desktop whose screenshots change: the answer is an MP4 (H.264) of them; the refusals OSWorld's
server gives (none in progress, one already running) are 400; what is kept is bounded."""

from __future__ import annotations

import http.client
import io
import itertools
import subprocess
import threading
from typing import Any

import pytest
from PIL import Image

from osfleet.client import LeaseError, Screen
from osfleet.osworld import ProtocolServer, recording
from osfleet.osworld.endpoints import Endpoints
from osfleet.recording.video import ffmpeg

pytestmark = pytest.mark.system


class ChangingDesktop:
    """Screenshots of one colour after another; ``observe`` is all the recorder uses."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.colours = itertools.cycle([(200, 30, 30), (30, 200, 30), (30, 30, 200)])
        self.taken = 0
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def observe(self, *, format: Any = None, quality: Any = None, **_: Any) -> Screen:
        with self.lock:
            self.taken += 1
            if self.fail_after is not None and self.taken > self.fail_after:
                raise LeaseError("lease ended", status=409, kind="lease")
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), next(self.colours)).save(buf, "JPEG")
        return Screen(buf.getvalue(), "jpeg", 64, 48)


def post(port: int, path: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        conn.close()


def test_a_recording_comes_back_as_an_mp4_of_the_screens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording, "MAX_FPS", 20.0)
    desktop = ChangingDesktop()
    with ProtocolServer(Endpoints(desktop)) as server:  # type: ignore[arg-type]
        assert post(server.port, "/end_recording")[0] == 400  # none in progress
        assert post(server.port, "/start_recording")[0] == 200
        assert post(server.port, "/start_recording")[0] == 400  # one already running
        pause = threading.Event()
        for _ in range(600):  # until a few screenshots are in (at most 30 s)
            if desktop.taken >= 8:
                break
            pause.wait(0.05)
        status, content_type, body = post(server.port, "/end_recording")
    assert status == 200 and content_type == "video/mp4" and body[4:8] == b"ftyp", body[:64]
    probe = subprocess.run([ffmpeg(), "-hide_banner", "-i", "pipe:0"], input=body, capture_output=True)
    assert "h264" in probe.stderr.decode() and "64x48" in probe.stderr.decode()


def test_what_a_recording_keeps_is_bounded_and_a_lost_lease_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording, "MAX_FPS", 50.0)
    monkeypatch.setattr(recording, "MAX_FRAMES", 5)
    rec = recording.ScreenRecorder(ChangingDesktop())
    rec.start()
    rec._thread.join(30)  # type: ignore[union-attr]  # it stops by itself at the cap
    assert len(rec.shots) == 5 and rec.full and "cap" in rec.full
    assert rec.stop()[4:8] == b"ftyp"
    lost = recording.ScreenRecorder(ChangingDesktop(fail_after=3))
    lost.start()
    lost._thread.join(30)  # type: ignore[union-attr]  # the fleet took the lease back: no more screenshots
    assert len(lost.shots) == 3
    lost.close()
    assert lost._folder is None
