"""OSWorld's ``/start_recording`` and ``/end_recording`` for one leased desktop: its screen as an MP4.

OSWorld's in-VM server records the screen with ffmpeg's x11grab and ``/end_recording`` answers the MP4
(``lib_run_single`` saves it as ``recording.mp4``). Here the desktop is a replica reached through the fleet, so
``ScreenRecorder`` takes screenshots (``observe``, JPEG) one after the other in a thread, at most ``MAX_FPS`` a
second, each kept in a temporary folder with the time it was taken, and at the end encodes them with osfleet's
video export (``osfleet.recording.video``: each screen on until the next, H.264; its ffmpeg is the one the
``imageio-ffmpeg`` package ships). A replica under TCG gives a screenshot every second or so: the video shows
the desktop at that pace, not at x11grab's.

Bounded as every guest read: at most ``MAX_FRAMES`` screenshots and ``MAX_BYTES`` of them are kept (the recording
stops taking new ones past either, and says so in the log), and a video over ``MAX_VIDEO_BYTES`` is refused (413)
rather than answered. The temporary folder goes when the recording ends or the lease is given back.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

from osfleet.client import FleetError, Screen
from osfleet.osworld.errors import RecordingError
from osfleet.protocol.models import ImageFormat

log = logging.getLogger(__name__)

MAX_FPS = 2.0
MAX_FRAMES = 7200  # an hour at 2 a second
MAX_BYTES = 1 << 30  # of screenshots kept
MAX_VIDEO_BYTES = 512 * 2**20
JPEG_QUALITY = 80


class Observing(Protocol):
    def observe(self, *, format: ImageFormat | None = ..., quality: int | None = ...) -> Screen: ...


class ScreenRecorder:
    """One desktop's recording (the module's docstring); ``start`` then ``stop`` returns the MP4's bytes."""

    def __init__(self, desktop: Observing) -> None:
        self.desktop = desktop
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._folder: Path | None = None
        self.shots: list[tuple[float, Path]] = []
        self.kept_bytes = 0
        self.full: str | None = None

    @property
    def recording(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                raise RecordingError("a recording is already in progress", 400)
            self._folder = Path(tempfile.mkdtemp(prefix="osfleet-osworld-recording-"))
            self.shots, self.kept_bytes, self.full = [], 0, None
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="osworld-recording", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._folder is not None
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                screen = self.desktop.observe(format="jpeg", quality=JPEG_QUALITY)
            except FleetError as exc:  # the lease went away: the recording ends with what it has
                log.warning("recording stopped taking screenshots: %s", exc)
                return
            if len(self.shots) >= MAX_FRAMES or self.kept_bytes + len(screen.data) > MAX_BYTES:
                self.full = f"stopped at {len(self.shots)} screenshots ({self.kept_bytes} bytes): the recording's cap"
                log.warning("recording %s", self.full)
                return
            path = self._folder / f"{len(self.shots):06d}.jpg"
            path.write_bytes(screen.data)
            self.shots.append((time.time(), path))
            self.kept_bytes += len(screen.data)
            self._stop.wait(max(0.0, 1.0 / MAX_FPS - (time.monotonic() - began)))

    def stop(self) -> bytes:
        """Stop and return the MP4 (``RecordingError``: none started, nothing taken, or the video too large)."""
        from osfleet.errors import OsfleetError
        from osfleet.recording import video

        with self._lock:
            thread, folder = self._thread, self._folder
            if thread is None or folder is None:
                raise RecordingError("no recording is in progress", 400)
            self._stop.set()
            thread.join(60)
            self._thread = None
        try:
            shots = list(self.shots)
            if not shots:
                raise RecordingError("the recording took no screenshot (the fleet did not answer)", 500)
            out = folder / "recording.mp4"
            try:
                video.encode_mp4(video.timed(shots), out, what="the recording")
            except OsfleetError as exc:  # no ffmpeg here (imageio-ffmpeg not installed), or it failed
                raise RecordingError(f"the recording could not be encoded: {exc}", 501) from None
            size = out.stat().st_size
            if size > MAX_VIDEO_BYTES:
                raise RecordingError(f"the recording's video is {size} bytes, over {MAX_VIDEO_BYTES}", 413)
            return out.read_bytes()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self._folder = None

    def close(self) -> None:
        """End a recording nobody asked for (the lease is given back)."""
        with self._lock:
            thread, folder, self._thread, self._folder = self._thread, self._folder, None, None
        self._stop.set()
        if thread is not None:
            thread.join(60)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
