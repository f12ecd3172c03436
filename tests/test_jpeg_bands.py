"""A screen's JPEG with only the changed MCU rows re-encoded is, byte for byte, a whole encode of the same pixels."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from osfleet.vm.jpeg_bands import MCU_HEIGHT, BandedJpeg, JpegLayoutError, encode_rows, mcu_rows, split

pytestmark = pytest.mark.unit


def _frame(width: int, height: int, seed: int) -> bytearray:
    """A frame with flat areas (a desktop) and noise (photos, text): both kinds of entropy-coded data."""
    rng = random.Random(seed)
    pixels = bytearray((58, 110, 165) * (width * height))
    for _ in range(6):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = min(width, x0 + rng.randrange(1, 120)), min(height, y0 + rng.randrange(1, 90))
        for y in range(y0, y1):
            row = bytes(rng.randrange(256) for _ in range((x1 - x0) * 3))
            pixels[(y * width + x0) * 3 : (y * width + x1) * 3] = row
    return pixels


def _whole(pixels: bytearray, width: int, height: int, quality: int) -> bytes:
    return encode_rows(memoryview(pixels), width, height, quality)


def _scribble(pixels: bytearray, width: int, height: int, rng: random.Random) -> set[int]:
    """Change a few pixels in a few places; returns the MCU rows touched."""
    rows = set()
    for _ in range(rng.randrange(1, 4)):
        y, x = rng.randrange(height), rng.randrange(width)
        at = (y * width + x) * 3
        pixels[at : at + 3] = bytes(rng.randrange(256) for _ in range(3))
        rows.add(y // MCU_HEIGHT)
    return rows


@pytest.mark.parametrize(("width", "height", "quality"), [(320, 200, 85), (123, 77, 40), (64, 16, 95), (200, 9, 85)])
def test_rows_encoded_anew_give_the_bytes_of_a_whole_encode(width: int, height: int, quality: int) -> None:
    rng = random.Random(width * height)
    pixels = _frame(width, height, seed=quality)
    bands = BandedJpeg(width, height, quality)
    assert bands.encode(memoryview(pixels), None) == _whole(pixels, width, height, quality)
    for _ in range(25):
        changed = _scribble(pixels, width, height, rng)
        assert bands.encode(memoryview(pixels), changed) == _whole(pixels, width, height, quality)


def test_the_last_partial_row_and_runs_of_rows_are_spliced_in_place() -> None:
    width, height = 96, 16 * 5 + 3  # the sixth MCU row holds 3 pixel rows
    pixels = _frame(width, height, seed=1)
    bands = BandedJpeg(width, height, 85)
    bands.encode(memoryview(pixels), None)
    pixels[-3 * width * 3 :] = bytes(3 * width * 3)  # the partial row, black
    for y in (16, 20, 40):
        pixels[y * width * 3 : y * width * 3 + 3] = b"\xff\xff\xff"
    assert bands.encode(memoryview(pixels), {1, 2, 5}) == _whole(pixels, width, height, 85)
    corner = Image.open(io.BytesIO(bands.data or b"")).convert("RGB").getpixel((width - 1, height - 1))
    assert isinstance(corner, tuple) and max(corner) < 60  # the black rows made it into the JPEG


def test_an_unchanged_frame_gives_back_the_last_jpeg_without_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = _frame(64, 48, seed=2)
    bands = BandedJpeg(64, 48, 85)
    first = bands.encode(memoryview(pixels), None)
    monkeypatch.setattr("osfleet.vm.jpeg_bands.encode_rows", _refuse)
    assert bands.encode(memoryview(pixels), []) is first


def test_a_stale_row_list_is_not_enough_to_skip_the_rows_it_misses() -> None:
    """The caller's row list is the truth: rows it leaves out keep their old bytes (which is why the capture
    compares every row of every frame before it asks)."""
    pixels = _frame(64, 48, seed=3)
    bands = BandedJpeg(64, 48, 85)
    before = bands.encode(memoryview(pixels), None)
    pixels[0:3] = b"\x00\x00\x00"
    assert bands.encode(memoryview(pixels), []) == before != _whole(pixels, 64, 48, 85)
    assert bands.encode(memoryview(pixels), [0]) == _whole(pixels, 64, 48, 85)


def test_bad_input_is_refused_by_name() -> None:
    bands = BandedJpeg(32, 32, 85)
    with pytest.raises(ValueError, match="not a 32x32 RGB frame"):
        bands.encode(memoryview(bytearray(10)), None)
    pixels = _frame(32, 32, seed=4)
    bands.encode(memoryview(pixels), None)
    with pytest.raises(ValueError, match=r"MCU rows 0\.\.2 are not all within 0\.\.1"):
        bands.encode(memoryview(pixels), [0, 2])
    with pytest.raises(JpegLayoutError, match="no end-of-image"):
        split(_whole(pixels, 32, 32, 85)[:-2])
    with pytest.raises(JpegLayoutError, match="no marker"):
        split(b"\xff\xd8not a jpeg")


def test_a_jpeg_without_a_restart_per_row_is_refused() -> None:
    plain = io.BytesIO()
    Image.new("RGB", (32, 48), (1, 2, 3)).save(plain, "JPEG")
    _, segments = split(plain.getvalue())
    assert len(segments) == 1 != mcu_rows(48)


def _refuse(*_: object) -> bytes:
    raise AssertionError("encoded although nothing changed")
