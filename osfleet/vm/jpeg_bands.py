"""A screen's JPEG that re-encodes only the rows that changed, byte for byte the JPEG a whole encode gives.

The frame is encoded with a restart marker after every MCU row (16 pixel rows at 4:2:0 subsampling). At a restart
the encoder resets all it carries from one block to the next (the DC predictions and the bit buffer), so the
entropy-coded bytes of one MCU row depend on that row's pixels alone; with the standard (not optimised) Huffman
tables and one quality, the header depends on the size alone. So a run of changed rows is encoded as an image of
its own, its row segments are cut out and put in place of the old ones, and the markers between rows are numbered
as a whole encode numbers them (RST0..RST7, cycling). ``tests/test_jpeg_bands.py`` holds the result to a whole
encode of the same pixels, byte for byte.

On a desktop, a click changes a few rows (the pointer, a button): encoding them costs a small share of encoding
the screen (measured on the 1920x1080 desktop: ~0.1 ms for two MCU rows against ~3 ms for the whole screen).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

from PIL import Image

MCU_HEIGHT = 16  # pixel rows per MCU row with 4:2:0 subsampling
SUBSAMPLING = "4:2:0"  # Pillow's default for JPEG, named so the MCU height above holds
_RESTARTS = [bytes((0xFF, 0xD0 + i)) for i in range(8)]
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
_SOS = b"\xff\xda"
_EOI = b"\xff\xd9"


class JpegLayoutError(ValueError):
    """A JPEG did not have the layout this module writes (one restart interval per MCU row)."""


def mcu_rows(height: int) -> int:
    """MCU rows of a frame ``height`` pixels high (the last one may be partial)."""
    return -(-height // MCU_HEIGHT)


def encode_rows(pixels: memoryview, width: int, rows: int, quality: int) -> bytes:
    """A JPEG of ``rows`` packed RGB rows of ``width`` pixels, a restart marker after every MCU row."""
    image = Image.frombuffer("RGB", (width, rows), pixels, "raw", "RGB", 0, 1)  # type: ignore[arg-type]  # any buffer
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, subsampling=SUBSAMPLING, restart_marker_rows=1)
    return out.getvalue()


def split(jpeg: bytes) -> tuple[bytes, list[bytes]]:
    """(everything up to the entropy-coded data, one segment per MCU row) of a JPEG ``encode_rows`` wrote."""
    at = 2  # after SOI
    while True:
        if at + 4 > len(jpeg) or jpeg[at] != 0xFF:
            raise JpegLayoutError(f"no marker at byte {at}")
        marker, length = jpeg[at : at + 2], int.from_bytes(jpeg[at + 2 : at + 4], "big")
        at += 2 + length
        if marker == _SOS:
            break
    if not jpeg.endswith(_EOI):
        raise JpegLayoutError("no end-of-image marker at the end")
    return jpeg[:at], _RESTART.split(jpeg[at:-2])


class BandedJpeg:
    """The last JPEG of one screen at one size and quality, kept by MCU row; not thread-safe (one screen's
    encodes are serialised by the caller)."""

    def __init__(self, width: int, height: int, quality: int) -> None:
        self.width, self.height, self.quality = width, height, quality
        self.rows = mcu_rows(height)
        self._header = b""
        self._segments: list[bytes] = []
        self.data: bytes | None = None

    def encode(self, pixels: memoryview, changed: Iterable[int] | None) -> bytes:
        """The JPEG of ``pixels`` (the whole frame: packed RGB rows). ``changed``: the MCU rows that differ from
        the frame of the last call (None: not known, encode it all); the others are taken from the last JPEG."""
        if len(pixels) != self.width * self.height * 3:
            raise ValueError(f"{len(pixels)} bytes is not a {self.width}x{self.height} RGB frame")
        if changed is None or self.data is None:
            return self._whole(pixels)
        rows = sorted(set(changed))
        if rows and not 0 <= rows[0] <= rows[-1] < self.rows:
            raise ValueError(f"MCU rows {rows[0]}..{rows[-1]} are not all within 0..{self.rows - 1}")
        runs = _runs(rows)
        if not runs:
            return self.data
        row_bytes = self.width * 3
        for first, last in runs:
            top, bottom = first * MCU_HEIGHT, min((last + 1) * MCU_HEIGHT, self.height)
            band = pixels[top * row_bytes : bottom * row_bytes]
            _, segments = split(encode_rows(band, self.width, bottom - top, self.quality))
            if len(segments) != last - first + 1:
                raise JpegLayoutError(f"rows {first}..{last} came back as {len(segments)} segments")
            self._segments[first : last + 1] = segments
        self.data = self._assemble()
        return self.data

    def _whole(self, pixels: memoryview) -> bytes:
        jpeg = encode_rows(pixels, self.width, self.height, self.quality)
        header, segments = split(jpeg)
        if len(segments) != self.rows:
            raise JpegLayoutError(f"a {self.height}-row frame came back as {len(segments)} segments")
        self._header, self._segments, self.data = header, segments, jpeg
        return jpeg

    def _assemble(self) -> bytes:
        parts = [self._header]
        last = len(self._segments) - 1
        for i, segment in enumerate(self._segments):
            parts.append(segment)
            parts.append(_RESTARTS[i % 8] if i < last else _EOI)
        return b"".join(parts)


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted row numbers as (first, last) runs of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row - 1:
            runs[-1] = (runs[-1][0], row)
        else:
            runs.append((row, row))
    return runs
