"""What a screenshot shows (blank, or the desktop drawn with the recipe's background), and screens encoded
for clients."""

from __future__ import annotations

import io

from PIL import Image

from osfleet.measure.timing import stage
from osfleet.protocol.models import DEFAULT_QUALITY, ImageFormat

PNG_LEVEL = 1  # zlib's fastest: a desktop compresses nearly as well as at 6, in a fraction of the time
WEBP_METHOD = 0  # libwebp's fastest effort: ~20 ms for 1280x800 here instead of ~200 ms at its default (4)

# The desktop counts as drawn when the recipe's background covers at least this share of the screen and
# something else (the terminal window) covers at least WINDOW_SHARE: a cursor alone is not a desktop.
DESKTOP_BACKGROUND_SHARE = 0.3
WINDOW_SHARE = 0.02


def is_blank(image: Image.Image) -> bool:
    """True when every pixel has one colour (a black boot screen, an unmapped display)."""
    extrema = image.convert("RGB").getextrema()
    return all(band[0] == band[1] for band in extrema)  # type: ignore[index]


def background_share(image: Image.Image, rgb: tuple[int, int, int]) -> float:
    """Share of pixels that are exactly ``rgb``."""
    img = image.convert("RGB")
    counts = img.getcolors(maxcolors=img.width * img.height) or []
    hit = sum(n for n, colour in counts if colour == rgb)
    return hit / (img.width * img.height)


def desktop_drawn(image: Image.Image, background: tuple[int, int, int], size: tuple[int, int]) -> bool:
    """The X desktop is up: the screen has the recipe's size, its background and a window on top."""
    if image.size != size or is_blank(image):
        return False
    share = background_share(image, background)
    return DESKTOP_BACKGROUND_SHARE <= share <= 1.0 - WINDOW_SHARE


def encode(image: Image.Image, fmt: ImageFormat, quality: int | None = None) -> bytes:
    """``image`` as PNG (lossless; ``quality`` ignored), JPEG or WebP at ``quality`` 1..100 (timed as stage
    ``encode``)."""
    q = DEFAULT_QUALITY if quality is None else quality
    if not 1 <= q <= 100:
        raise ValueError(f"quality {q} is not between 1 and 100")
    buf = io.BytesIO()
    with stage("encode"):
        if fmt == "png":
            image.save(buf, "PNG", compress_level=PNG_LEVEL)
        elif fmt == "jpeg":
            image.save(buf, "JPEG", quality=q)
        elif fmt == "webp":
            image.save(buf, "WEBP", quality=q, method=WEBP_METHOD)
        else:
            raise ValueError(f"unknown image format {fmt!r} (png, jpeg or webp)")
    return buf.getvalue()
