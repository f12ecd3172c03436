"""``compare_image_text``: text read off an image (OSWorld's main branch), with Tesseract instead of EasyOCR.

OSWorld reads the picture with EasyOCR (``easyocr.Reader(['en']).readtext``), joins the texts it found with
spaces and scores 1 when ``rules.text`` is a substring of that (``rules.type`` must be ``text``; anything else, a
missing file or a picture that cannot be read scores 0). EasyOCR needs torch and downloads its models from the
internet the first time it runs, neither of which a host here has, so osfleet reads the picture with Debian's
Tesseract (``tesseract-ocr``, run as a program inside the evaluation sandbox), its words joined with single
spaces. The two engines do not always read the same words: ``docs/reference/osworld-verified.md`` has the
agreement measured on the pictures this task produces, and the check is the same substring test.

The picture may be an X window dump (``xwd -root``, what a desktop without a screenshot tool makes), which
OSWorld's function converts with a reader of its own: ``read_xwd`` reads it the same way.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, read_bytes, scored, short
from osfleet.tasks.osworld_format.metrics.images import MAX_IMAGE_FILE_BYTES, MAX_PIXELS

TESSERACT = "tesseract"
OCR_SECONDS = 25.0  # within the sandbox's 30 CPU seconds: a 1920x1080 screenshot took 3-5 s here
# Tesseract reads text of ~20-30 pixels best: on a 1920x1080 screenshot of xterm's 6x13 font it read nothing at
# the picture's own size, two words at twice, every word at three times (docs/reference/osworld-verified.md).
UPSCALE = 3
XWD_HEADER = struct.Struct(">25I")


def read_xwd(data: bytes) -> Any:
    """An X window dump read as OSWorld's own reader reads it: the pixels start right after the header (the
    colour map is not skipped), 4 bytes per pixel (blue, green, red, unused) when the depth is 32 and 3 (red,
    green, blue) when it is 24, whatever the dump's bits per pixel; any other depth, or too few bytes, raises
    ``CannotScore``. (So a 24-bit-deep dump of a true-colour screen, written with 32 bits per pixel, reads as a
    scrambled picture in OSWorld, and here.)"""
    from PIL import Image

    if len(data) < XWD_HEADER.size:
        raise CannotScore("not an X window dump (too short)")
    header_size, _version, _format, depth, width, height = XWD_HEADER.unpack_from(data)[:6]
    if depth not in (24, 32):
        raise CannotScore(f"an X window dump of depth {depth} (OSWorld reads 24 and 32)")
    if width * height > MAX_PIXELS:
        raise CannotScore(f"X window dump of {width}x{height} pixels")
    step = depth // 8
    pixels = data[header_size : header_size + width * height * step]
    if len(pixels) != width * height * step or not pixels:
        raise CannotScore("X window dump cut short")
    return Image.frombytes("RGB", (width, height), pixels, "raw", "BGRX" if step == 4 else "RGB")


def open_picture(value: Any) -> Any:
    """The picture in a getter's file: anything Pillow reads, or an X window dump."""
    from PIL import Image, UnidentifiedImageError

    data = read_bytes(value, MAX_IMAGE_FILE_BYTES)
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        return read_xwd(data)
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise CannotScore(f"image of {width}x{height} pixels is larger than {MAX_PIXELS} pixels")
    return image


def ocr_words(image: Any) -> str:
    """The words Tesseract reads in ``image``, joined with single spaces."""
    from PIL import Image

    tool = shutil.which(TESSERACT)
    if tool is None:
        raise ImportError("compare_image_text needs Tesseract on this host (apt-get install tesseract-ocr)")
    image = image.convert("RGB")
    if UPSCALE != 1:
        image = image.resize((image.width * UPSCALE, image.height * UPSCALE), Image.Resampling.LANCZOS)
    with tempfile.TemporaryDirectory(prefix="osfleet-ocr-") as tmp:
        png = Path(tmp) / "picture.png"
        image.save(png, "PNG", compress_level=1)
        out = subprocess.run(
            [tool, str(png), "stdout", "-l", "eng"],
            capture_output=True,
            timeout=OCR_SECONDS,
            env={"OMP_THREAD_LIMIT": "1", "PATH": "/usr/bin:/bin"},
            check=False,
        )
    if out.returncode != 0:
        raise CannotScore(f"tesseract failed: {out.stderr.decode(errors='replace').strip()[-200:]}")
    return " ".join(out.stdout.decode(errors="replace").split())


@scored()
def compare_image_text(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no image"
    if expected["type"] != "text":
        return 0.0, f"unknown rule type {short(expected['type'])} (text)"
    words = ocr_words(open_picture(result))
    want = expected["text"]
    ok = want in words
    return float(ok), f"{short(want)} {'found' if ok else 'not found'} in the text read: {short(words, 100)}"


METRICS: dict[str, Metric] = {"compare_image_text": compare_image_text}
NEEDS: dict[str, tuple[str, ...]] = {"compare_image_text": ()}
TOOLS: dict[str, tuple[str, ...]] = {"compare_image_text": (TESSERACT,)}
