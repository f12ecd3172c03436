"""Screens for observations: QEMU's screendump read in place, only the changed rows encoded again, an unchanged
screen's encoding served again byte for byte, never a stale one; libvirt's stream where screendumps fail."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from osfleet.errors import VirtError
from osfleet.measure.timing import collecting
from osfleet.replicas import capture
from osfleet.replicas.capture import ScreenCapture
from osfleet.vm import jpeg_bands
from osfleet.vm.jpeg_bands import encode_rows
from osfleet.vm.screen import encode

pytestmark = pytest.mark.unit

SIZE = (160, 100)


class FakeVirt:
    """QMP ``screendump`` writes ``screen`` as QEMU does (a binary PPM where it is told); libvirt's stream
    returns another colour."""

    def __init__(self, dump_error: Exception | None = None, running: bool = True) -> None:
        self.screen = Image.new("RGB", SIZE, (58, 110, 165))
        ImageDraw.Draw(self.screen).rectangle((10, 10, 90, 60), fill=(255, 255, 255), outline=(0, 0, 0))
        self.dump_error = dump_error
        self.running = running
        self.dumped: list[str] = []
        self.streamed = 0
        self.lock = threading.Lock()

    def qmp(self, name: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        assert command == "screendump" and arguments is not None
        if self.dump_error is not None:
            raise self.dump_error
        with self.lock:
            self.dumped.append(arguments["filename"])
            self.screen.save(arguments["filename"], "PPM")
        return {}

    def screenshot(self, name: str) -> Image.Image:
        if not self.running:
            raise VirtError(f"domain {name} is not running")
        self.streamed += 1
        return Image.new("RGB", SIZE, (9, 9, 9))

    def is_running(self, name: str) -> bool:
        return self.running

    def qemu_ids(self) -> tuple[int, int] | None:
        return None

    def draw(self, box: tuple[int, int, int, int], colour: tuple[int, int, int]) -> None:
        with self.lock:
            ImageDraw.Draw(self.screen).rectangle(box, fill=colour)


def _fresh(image: Image.Image, quality: int = 85) -> bytes:
    """A whole encode of ``image`` as the capture lays a JPEG out."""
    return encode_rows(memoryview(image.tobytes()), image.width, image.height, quality)


def _observe(cap: ScreenCapture, fmt: str = "jpeg", quality: int | None = None, domain: str = "d") -> bytes:
    return cap.take(domain).encode(fmt, quality)  # type: ignore[arg-type]


class Counting:
    """Counts the MCU rows the JPEG encoder is asked for."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, pixels: memoryview, width: int, rows: int, quality: int) -> bytes:
        self.rows.append(rows)
        return encode_rows(pixels, width, rows, quality)


def test_a_screendump_is_read_from_its_directory_and_its_file_kept_until_close(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path / "screens")  # type: ignore[arg-type]
    with collecting() as stages:
        img = cap.grab("osfleet-r-1-g1")
    assert img.mode == "RGB" and img.tobytes() == virt.screen.tobytes() and virt.streamed == 0
    assert cap.method == "screendump" and "capture" in stages.seconds
    assert (tmp_path / "screens").stat().st_mode & 0o777 == 0o700
    assert [p.name for p in (tmp_path / "screens").iterdir()] == [f"osfleet-r-1-g1.{os.getpid()}.ppm"]
    cap.close()
    assert list((tmp_path / "screens").iterdir()) == []


def test_an_unchanged_screen_is_served_its_last_encoding_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    first = _observe(cap)
    assert first == _fresh(virt.screen)
    counting = Counting()
    monkeypatch.setattr(jpeg_bands, "encode_rows", counting)
    with collecting() as stages:
        again = _observe(cap)
    assert again == first == _fresh(virt.screen) and counting.rows == []
    assert {"capture", "encode"} <= set(stages.seconds) and len(virt.dumped) == 2  # a fresh dump each time


def test_a_changed_screen_is_never_served_stale_and_only_its_changed_rows_are_encoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    _observe(cap)
    counting = Counting()
    monkeypatch.setattr(jpeg_bands, "encode_rows", counting)
    for i, box in enumerate([(100, 20, 104, 24), (0, 99, 0, 99), (150, 40, 159, 70), (5, 5, 6, 6)]):
        virt.draw(box, (i * 40, 200, 0))
        seen = _observe(cap)
        assert seen == _fresh(virt.screen), f"change {i} served stale"
    # rows 16-31; the last partial row (96-99); rows 32-79 as one run of three MCU rows; rows 0-15
    assert counting.rows == [16, 4, 48, 16]


def test_png_and_webp_are_encoded_whole_when_anything_changed_and_reused_when_not(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    png = _observe(cap, "png")
    assert Image.open(io.BytesIO(png)).convert("RGB").tobytes() == virt.screen.tobytes()
    assert _observe(cap, "png") is png
    webp = _observe(cap, "webp", 60)
    assert webp == encode(virt.screen, "webp", 60)
    virt.draw((0, 0, 3, 3), (255, 0, 0))
    png2 = _observe(cap, "png")
    assert png2 != png and Image.open(io.BytesIO(png2)).convert("RGB").tobytes() == virt.screen.tobytes()
    assert _observe(cap, "webp", 60) == encode(virt.screen, "webp", 60)


def test_each_quality_is_kept_apart_and_only_a_few_per_screen(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    for q in (10, 50, 90):
        assert _observe(cap, "jpeg", q) == _fresh(virt.screen, q)
    virt.draw((0, 50, 10, 60), (0, 0, 0))
    for q in (10, 50, 90, 20, 30, 40):
        assert _observe(cap, "jpeg", q) == _fresh(virt.screen, q)
    kept = cap._screens["d"]
    assert len(kept.encodings) == capture.ENCODINGS_PER_SCREEN
    with pytest.raises(ValueError, match="quality 0"):
        _observe(cap, "jpeg", 0)


def test_a_new_screen_size_is_encoded_whole(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    _observe(cap)
    virt.screen = Image.new("RGB", (64, 40), (1, 2, 3))
    assert _observe(cap) == _fresh(virt.screen)


def test_screens_beyond_the_budget_are_forgotten_least_recent_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = 2 * SIZE[0] * SIZE[1] * 3  # a frame and its dump file
    monkeypatch.setattr(capture, "SCREENS_KEPT_BYTES", 3 * one)
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    for name in ("a", "b", "c", "a", "d"):
        _observe(cap, domain=name)
    assert list(cap._screens) == ["c", "a", "d"]
    assert sorted(p.name.split(".")[0] for p in tmp_path.iterdir()) == ["a", "c", "d"]
    cap.forget("a")
    assert list(cap._screens) == ["c", "d"] and not (tmp_path / f"a.{os.getpid()}.ppm").exists()


def test_a_frame_taken_before_its_screen_was_forgotten_still_encodes(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    frame = cap.take("d")
    cap.close()
    assert frame.encode("jpeg") == _fresh(virt.screen)


def test_dump_files_of_agents_that_died_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / "osfleet-r-1-g1.999999999.ppm"  # no such pid
    mine = tmp_path / f"osfleet-r-2-g1.{os.getpid()}.ppm"
    other = tmp_path / "osfleet-r-3-g1.ppm"  # a generation's own screen check, not ours to judge
    for path in (dead, mine, other):
        path.write_bytes(b"P6\n1 1\n255\n\x00\x00\x00")
    ScreenCapture(FakeVirt(), tmp_path).grab("x")  # type: ignore[arg-type]
    assert not dead.exists() and mine.exists() and other.exists()


@pytest.mark.parametrize(
    "content", [b"", b"P6\n160 100\n255\n\x00\x00", b"P3\n1 1\n255\n0 0 0\n", b"P6\n99999 1\n255\n"]
)
def test_a_dump_that_is_not_a_whole_frame_falls_back_to_libvirt(tmp_path: Path, content: bytes) -> None:
    class Broken(FakeVirt):
        def qmp(self, name: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
            assert arguments is not None
            Path(arguments["filename"]).write_bytes(content)

    virt = Broken()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    assert cap.grab("d").getpixel((0, 0)) == (9, 9, 9) and cap.method == "libvirt"


def test_captures_racing_on_one_screen_each_give_a_whole_frame_that_existed(tmp_path: Path) -> None:
    virt = FakeVirt()
    virt.screen = Image.new("RGB", SIZE, (58, 110, 165))
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    frames: dict[bytes, int] = {}
    later = virt.screen.copy()
    for i in range(8):  # the frames the screen goes through, each a whole encode
        ImageDraw.Draw(later).rectangle((i * 20, 0, i * 20 + 19, 99), fill=(i * 30, 0, 255 - i * 30))
        frames[_fresh(later)] = i
    seen: list[bytes] = []
    start = threading.Barrier(5)

    def drawer() -> None:
        start.wait()
        for i in range(8):
            virt.draw((i * 20, 0, i * 20 + 19, 99), (i * 30, 0, 255 - i * 30))
            _observe(cap)

    def observer() -> None:
        start.wait()
        for _ in range(12):
            seen.append(_observe(cap))

    threads = [threading.Thread(target=drawer)] + [threading.Thread(target=observer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = _fresh(Image.new("RGB", SIZE, (58, 110, 165)))
    assert seen and all(s in frames or s == first for s in seen)  # never a mix of two frames
    assert _observe(cap) == _fresh(virt.screen) and frames[_observe(cap)] == 7


def test_capture_falls_back_to_libvirts_stream_when_qemu_cannot_dump(tmp_path: Path) -> None:
    virt = FakeVirt(dump_error=VirtError("QMP screendump on d: Permission denied"))
    cap = ScreenCapture(virt, tmp_path / "screens")  # type: ignore[arg-type]
    assert cap.grab("d").getpixel((0, 0)) == (9, 9, 9) and cap.method == "libvirt"
    virt.dump_error = None
    assert _observe(cap, "png") == encode(Image.new("RGB", SIZE, (9, 9, 9)), "png")
    assert virt.dumped == [] and virt.streamed == 2  # no second try of a path that failed on a running domain


def test_a_gone_domain_is_reported_as_libvirt_names_it_and_keeps_the_fast_path(tmp_path: Path) -> None:
    virt = FakeVirt(dump_error=VirtError("no domain d"), running=False)
    cap = ScreenCapture(virt, tmp_path / "screens")  # type: ignore[arg-type]
    with pytest.raises(VirtError, match="not running"):
        cap.grab("d")
    assert cap.method == "screendump"


def test_without_a_directory_capture_uses_libvirt(tmp_path: Path) -> None:
    virt = FakeVirt()
    cap = ScreenCapture(virt, None)  # type: ignore[arg-type]
    frame = cap.take("d")
    assert cap.method == "libvirt" and virt.streamed == 1 and virt.dumped == []
    assert frame.fingerprint == cap.take("d").fingerprint  # the same pixels from the stream


def test_a_capture_that_comes_during_an_encode_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture of the screen while its frame is being encoded would change the rows under the encoder and
    leave the encoding filed under the newer frame: it waits for the encode to finish."""
    virt = FakeVirt()
    cap = ScreenCapture(virt, tmp_path)  # type: ignore[arg-type]
    _observe(cap)
    virt.draw((0, 0, 159, 5), (200, 0, 0))  # rows of MCU row 0 change: the next encode works on them
    interloper_done = threading.Event()

    def interloper() -> None:
        virt.draw((0, 40, 159, 45), (0, 200, 0))  # MCU row 2 changes in the next frame
        cap.take("d")
        interloper_done.set()

    def encode_while_capturing(pixels: memoryview, width: int, rows: int, quality: int) -> bytes:
        threading.Thread(target=interloper).start()
        interloper_done.wait(0.5)  # returns at once if the capture does not wait for this encode
        return encode_rows(pixels, width, rows, quality)

    monkeypatch.setattr(jpeg_bands, "encode_rows", encode_while_capturing)
    _observe(cap)
    monkeypatch.setattr(jpeg_bands, "encode_rows", encode_rows)
    assert interloper_done.wait(10)
    assert _observe(cap) == _fresh(virt.screen)
