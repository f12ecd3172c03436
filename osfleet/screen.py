"""What a screenshot shows: blank, or the desktop drawn with the recipe's background."""

from __future__ import annotations

from PIL import Image

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
