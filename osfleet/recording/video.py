"""A recorded episode as an MP4 video: each screen on from the moment it was recorded until the next one.

The screens are the one right after the reset (at the episode's start) and each step's (at the step's ``time``,
when it finished); a step recorded without a screen leaves the one before it on. The video runs at a constant
``FPS``: frame n shows the screen that was on n/FPS seconds after the first, so each screen is repeated for as
many frames as its time on covers (counted from the start and rounded, so times never drift; a screen on for
less than one frame may not be seen). The last screen stays on ``LAST_SCREEN_SECONDS``.

Every frame has the first screen's size, rounded up to even sides (H.264 in yuv420p needs them): a screen of
another size (the resolution changed) is scaled to fit and centred on black. Frames are decoded here (PIL) and
piped raw to ffmpeg, the binary the ``imageio-ffmpeg`` package ships (``osfleet[host]``); the MP4 is written to a
temporary file beside the output and renamed over it only once ffmpeg has finished, so an export that fails or is
interrupted leaves no half-written video behind (and kills its ffmpeg).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from PIL import Image

from osfleet.errors import MissingToolError, OsfleetError
from osfleet.recording.store import TrajectoryError, TrajectoryStore

FPS = 10
LAST_SCREEN_SECONDS = 1.0
PRESET = "veryfast"  # x264: a desktop's screens are mostly still; fast encoding, small files all the same
Progress = Callable[[int, int], None]  # (frames written, frames in all)


@dataclass(frozen=True)
class Screen:
    image: Path
    frames: int  # how many frames it is on


@dataclass(frozen=True)
class Video:
    path: Path
    frames: int
    seconds: float
    width: int
    height: int


def frame_counts(times: list[float], fps: int = FPS, last: float = LAST_SCREEN_SECONDS) -> list[int]:
    """How many frames each screen is on, for screens recorded at ``times`` (seconds, in order; a time earlier
    than the one before is taken as the one before): frame n shows the screen on at ``n / fps`` seconds after the
    first, and the last stays on ``last`` seconds."""
    if not times:
        return []
    start, edges, latest = times[0], [], times[0]
    for t in times:
        latest = max(latest, t)
        edges.append(round((latest - start) * fps))
    edges.append(round((latest + last - start) * fps))
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def timed(shown: list[tuple[float, Path]], fps: int = FPS) -> list[Screen]:
    """Screens recorded at the given times, in order, with their frame counts (those on for less than a frame
    left out)."""
    counts = frame_counts([t for t, _ in shown], fps)
    return [Screen(path, n) for (_, path), n in zip(shown, counts, strict=True) if n > 0]


def screens(store: TrajectoryStore, tid: str, fps: int = FPS) -> list[Screen]:
    """The episode's screens in order with their frame counts (those on for less than a frame left out)."""
    meta = store.meta(tid)
    shown: list[tuple[float, Path]] = []
    if meta.reset_image:
        shown.append((meta.started_at, store.image_path(tid, meta.reset_image)))
    shown += [(s.time, store.image_path(tid, s.image)) for s in store.steps(tid) if s.image]
    if not shown:
        raise TrajectoryError(f"recorded episode {tid} has no screens to make a video of")
    return timed(shown, fps)


def export_mp4(store: TrajectoryStore, tid: str, out: Path, fps: int = FPS, progress: Progress | None = None) -> Video:
    """Write episode ``tid`` to ``out`` as an MP4 (H.264, yuv420p, ``fps`` frames a second); see the module."""
    return encode_mp4(screens(store, tid, fps), out, fps, progress, what=tid)


def encode_mp4(
    shown: list[Screen], out: Path, fps: int = FPS, progress: Progress | None = None, what: str = "the screens"
) -> Video:
    """Write ``shown`` (each screen for its frame count) to ``out`` as an MP4; see the module."""
    if not shown:
        raise OsfleetError(f"{what}: no screens to make a video of")
    with Image.open(shown[0].image) as first:
        size = (first.width + first.width % 2, first.height + first.height % 2)
    total = sum(s.frames for s in shown)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.{os.getpid()}.part")
    command = [
        ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{size[0]}x{size[1]}", "-r", str(fps), "-i", "pipe:0",
        "-an", "-c:v", "libx264", "-preset", PRESET, "-pix_fmt", "yuv420p", "-movflags", "+faststart",
        "-f", "mp4", str(part),
    ]  # fmt: skip
    with tempfile.TemporaryFile() as errors:
        # its own session: a Ctrl-C at the terminal reaches this process, which stops ffmpeg itself
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True
        )
        try:
            _feed(proc, shown, size, total, progress)
            if proc.wait() != 0:
                raise OsfleetError(f"ffmpeg could not encode {what}: {_tail(errors) or f'exit code {proc.returncode}'}")
            part.replace(out)
        except BaseException:
            proc.kill()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):  # frames still buffered for a killed ffmpeg
                    proc.stdin.close()
            proc.wait()
            part.unlink(missing_ok=True)
            raise
    return Video(out, total, total / fps, *size)


def ffmpeg() -> str:
    """The ffmpeg binary of the ``imageio-ffmpeg`` package."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise MissingToolError("ffmpeg", where="this host (MP4 export: pip install 'osfleet[host]')") from None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError as exc:  # the package is there without its binary (a platform it has none for)
        raise MissingToolError("ffmpeg", where=f"this host ({exc})") from None


def _feed(
    proc: subprocess.Popen[bytes], shown: list[Screen], size: tuple[int, int], total: int, progress: Progress | None
) -> None:
    assert proc.stdin is not None
    done = 0
    try:
        for screen in shown:
            frame = _frame(screen.image, size)
            for _ in range(screen.frames):
                proc.stdin.write(frame)
                done += 1
                if progress is not None and (done % 50 == 0 or done == total):
                    progress(done, total)
        proc.stdin.close()
    except BrokenPipeError:  # ffmpeg stopped reading: its exit code and its words say why
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()


def _frame(image: Path, size: tuple[int, int]) -> bytes:
    """The screen as raw RGB of ``size``: scaled to fit and centred on black when its own size differs (by more than
    the pixel an odd side is padded with)."""
    with Image.open(image) as img:
        rgb = img.convert("RGB")
    if rgb.size == size:
        return rgb.tobytes()
    padded_only = 0 <= size[0] - rgb.width <= 1 and 0 <= size[1] - rgb.height <= 1
    scale = 1.0 if padded_only else min(size[0] / rgb.width, size[1] / rgb.height)
    fitted = rgb.resize(
        (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))), Image.Resampling.BILINEAR
    )
    canvas = Image.new("RGB", size)
    canvas.paste(fitted, ((size[0] - fitted.width) // 2, (size[1] - fitted.height) // 2))
    return canvas.tobytes()


def _tail(errors: IO[bytes]) -> str:
    """The last line ffmpeg wrote (it writes errors only)."""
    errors.seek(0)
    text = errors.read()[-2000:].decode(errors="replace").strip()
    return text.splitlines()[-1][:300] if text else ""
