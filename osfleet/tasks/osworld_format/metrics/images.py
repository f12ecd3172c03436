"""Metrics on images: similarity to a gold image and the edits GIMP tasks ask for.

Similarity is what OSWorld computes, with the same libraries (Pillow, NumPy, scikit-image's SSIM, OpenCV):
- ``compare_images``: the SSIM of the two images in grey, both resized (Lanczos) to the smaller size (the
  smaller by width, then height); with option ``reference_base_result`` the score is how far the SSIM rose
  above that base (0 unless by 0.01 or more), scaled to [0, 1].
- ``compare_image_list``: each image of the result equals its gold one pixel for pixel, after resizing to
  the gold's size and converting to its mode (an empty list scores 1).
- "structure the same": SSIM (7x7 windows, colour) at least 0.9 on images of the same size (each side at
  least 7 pixels) in RGB; "MSE the same": the mean squared difference of RGB values in [0, 1] below 0.03
  after resizing the first image to the second's size.
- ``check_structure_sim``: same size and structure; ``check_structure_sim_resized``: the source (cropped
  to its opaque part when it has transparency) resized to the target's size has the same structure;
  ``check_structure_sim_with_threshold`` (OSWorld's main branch): the source resized (Lanczos) to the target's
  size, both in RGB, have an SSIM of at least option ``ssim_threshold`` (0.85), with 7x7 windows (the largest
  odd size that fits a smaller image).
- ``check_brightness_decrease_and_structure_sim``: the result is darker (mean grey) than the original and,
  both brought to a mean of 128, the same by MSE (option ``threshold``, 0.03).
- ``check_contrast_increase_and_structure_sim``: a larger standard deviation of the pixel values than the
  original, and the same structure at SSIM 0.65.
- ``check_saturation_increase_and_structure_sim``: a larger mean HSV saturation than the original, and the
  hue and value channels each of the same structure.
- ``check_palette_and_structure_sim``: the result is a palette image with the structure of the original.
- ``check_file_exists_and_structure_sim``: the exported file exists and has the original's structure.
- ``check_image_mirror``: the original flipped left to right has the result's structure at SSIM 0.99.
- ``check_image_size``: the width and/or height are ``rules.width``/``rules.height`` (with
  ``rules.ignore_transparent``, those of the opaque part; as in OSWorld, an image with a ``transparency``
  entry is measured by its opaque part whatever the rule says).
- ``check_image_file_size``: the file is smaller than ``rules.max_size`` bytes.
- ``check_green_background``: every pixel of the original that is not black is green (G above R and B)
  in the result; as in OSWorld (which indexes ``[x, y]``), only square originals can pass.
- ``check_triangle_position``: the second most frequent colour's centroid lies within 5 % of the centre.
- ``check_textbox_on_leftside``: the leftmost dark pixel (grey below 128) lies in the left 5 %.
- ``check_sharper``: the variance of the Laplacian (OpenCV, grey) is larger than the original's.

Images larger than ``MAX_PIXELS`` score 0 (decoding them would take the memory of several replicas).
"""

from __future__ import annotations

import io
import os
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, file_path, read_bytes, scored, short

MAX_PIXELS = 64 * 2**20
MAX_IMAGE_FILE_BYTES = 256 * 2**20


def open_image(value: Any) -> Any:
    """The image in a getter's file, refused before decoding when it is too large."""
    from PIL import Image

    # From memory (the file is at most a guest file's size): no file handle stays open behind a lazy image.
    image = Image.open(io.BytesIO(read_bytes(value, MAX_IMAGE_FILE_BYTES)))
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise CannotScore(f"image of {width}x{height} pixels is larger than {MAX_PIXELS} pixels")
    return image


def _ssim(a: Any, b: Any, **kwargs: Any) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(a, b, **kwargs))


def same_structure(a: Any, b: Any, threshold: float = 0.9) -> bool:
    """OSWorld's ``structure_check_by_ssim``."""
    import numpy as np

    if min(a.width, a.height, b.width, b.height) < 7:
        return False
    a = a if a.mode == "RGB" else a.convert("RGB")
    b = b if b.mode == "RGB" else b.convert("RGB")
    if a.size != b.size:
        return False
    x, y = np.array(a), np.array(b)
    if x.shape != y.shape:
        return False
    try:
        return _ssim(x, y, win_size=7, channel_axis=2) >= threshold
    except Exception:  # noqa: BLE001  (OSWorld counts a failed SSIM as "not the same")
        return False


def same_by_mse(a: Any, b: Any, threshold: float = 0.03) -> bool:
    """OSWorld's ``structure_check_by_mse``."""
    import numpy as np
    from PIL import Image

    if a.size != b.size:
        a = a.resize(b.size, Image.Resampling.LANCZOS)
    a = a if a.mode == "RGB" else a.convert("RGB")
    b = b if b.mode == "RGB" else b.convert("RGB")
    mse = np.mean((np.array(a, dtype=np.float32) / 255 - np.array(b, dtype=np.float32) / 255) ** 2)
    return bool(mse < threshold)


@scored(any_options=True)
def compare_images(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import numpy as np
    from PIL import Image

    if not result or not expected:
        return 0.0, "no image"
    base = options.get("reference_base_result")
    a, b = open_image(result).convert("L"), open_image(expected).convert("L")
    size = min(a.size, b.size)
    a, b = a.resize(size, Image.Resampling.LANCZOS), b.resize(size, Image.Resampling.LANCZOS)
    similarity = _ssim(np.array(a), np.array(b))
    if base is None:
        return similarity, f"SSIM {similarity:.4f}"
    if similarity >= base + 0.01:
        return (similarity - base) / (1 - base), f"SSIM {similarity:.4f}, base {base}"
    return 0.0, f"SSIM {similarity:.4f} not above the base {base}"


@scored()
def compare_image_list(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from PIL import Image, ImageChops

    if type(result) is not list:
        result, expected = [result], [expected]
    for i, (got, want) in enumerate(zip(result, expected, strict=False)):
        if not got or not want:
            return 0.0, f"image {i + 1} is missing"
        a, b = open_image(got), open_image(want)
        if a.size != b.size:
            a = a.resize(b.size, Image.Resampling.LANCZOS)
        if a.mode != b.mode:
            a = a.convert(b.mode)
        if ImageChops.difference(a, b).getbbox():
            return 0.0, f"image {i + 1} differs from the gold one"
    return 1.0, "every image equals its gold one"


@scored()
def check_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    try:
        a, b = open_image(result), open_image(expected)
        if a.size != b.size:
            return 0.0, f"size {a.size}, expected {b.size}"
        ok = same_structure(a, b)
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot compare: {type(exc).__name__}"
    return float(ok), "same structure" if ok else "different structure"


@scored(any_options=True)
def check_structure_sim_with_threshold(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import numpy as np
    from PIL import Image

    if result is None or expected is None:
        return 0.0, "no image"
    threshold = options.get("ssim_threshold", 0.85)
    try:
        a, b = open_image(result), open_image(expected)
        if a.size != b.size:  # resized before the colour conversion, as OSWorld does
            a = a.resize(b.size, Image.Resampling.LANCZOS)
        x, y = (np.array(i if i.mode == "RGB" else i.convert("RGB")) for i in (a, b))
        side = min(x.shape[0], x.shape[1])
        window = 7 if side >= 7 else (side if side % 2 == 1 else side - 1)
        if window < 1:
            return 0.0, "image too small for SSIM"
        similarity = _ssim(x, y, win_size=window, channel_axis=2)
        ok = similarity >= threshold
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot compare: {type(exc).__name__}"
    return float(ok), f"SSIM {similarity:.4f} {'>=' if ok else '<'} {threshold}"


def _opaque_part(image: Any) -> Any:
    """The image cropped to its non-transparent pixels (None when it is all transparent), in RGBA."""
    image = image if image.mode == "RGBA" else image.convert("RGBA")
    box = image.split()[-1].getbbox()
    return None if box is None else image.crop(box)


def _has_transparency(image: Any) -> bool:
    return image.mode in ("RGBA", "LA") or "transparency" in image.info


@scored()
def check_structure_sim_resized(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    a, b = open_image(result), open_image(expected)
    if _has_transparency(a):
        content = _opaque_part(a)
        if content is None:
            return 0.0, "the image is fully transparent"
        a = content.convert("RGB").resize(b.size)
    else:
        a = a.resize(b.size)
    if b.mode != "RGB":
        b = b.convert("RGB")
    ok = same_structure(a, b)
    return float(ok), "same structure once resized" if ok else "different structure"


def _brightness(image: Any) -> float:
    from PIL import ImageStat

    return float(ImageStat.Stat(image.convert("L")).mean[0])


def _with_brightness(image: Any, target: float) -> Any:
    factor = target / _brightness(image)
    return image.point(lambda x: min(255, max(0, int(x * factor))))


@scored("threshold")
def check_brightness_decrease_and_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    a, b = open_image(result), open_image(expected)
    darker = _brightness(b) > _brightness(a)
    same = same_by_mse(_with_brightness(a, 128), _with_brightness(b, 128), options.get("threshold", 0.03))
    ok = darker and same
    return float(ok), f"darker: {darker}, same once brightness is evened out: {same}"


def _saturation(hsv: Any) -> float:
    import numpy as np

    return float(np.mean(np.array(hsv.split()[1])))


@scored()
def check_saturation_increase_and_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    a, b = open_image(result).convert("HSV"), open_image(expected).convert("HSV")
    richer = _saturation(b) < _saturation(a)
    (h1, _, v1), (h2, _, v2) = a.split(), b.split()
    same = same_structure(h1, h2) and same_structure(v1, v2)
    ok = richer and same
    return float(ok), f"more saturated: {richer}, same hue and value structure: {same}"


@scored()
def check_file_exists_and_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    if not os.path.isfile(file_path(result)):
        return 0.0, "the exported file does not exist"
    ok = same_structure(open_image(result), open_image(expected))
    return float(ok), "exported with the same structure" if ok else "exported, with a different structure"


def _contrast(image: Any) -> float:
    import numpy as np

    return float(np.std(np.asarray(image, dtype=np.float32)))


@scored()
def check_contrast_increase_and_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    a, b = open_image(result), open_image(expected)
    stronger = _contrast(b) < _contrast(a)
    same = same_structure(a, b, threshold=0.65)
    ok = stronger and same
    return float(ok), f"more contrast: {stronger}, same structure: {same}"


def _loaded(value: Any) -> Any:
    """The image fully decoded, or None (OSWorld's ``safe_open_image_with_retry`` gives up the same way)."""
    try:
        path = file_path(value)
        if not path.exists() or path.stat().st_size == 0:
            return None
        image = open_image(path)
        image.load()
        return image
    except Exception:  # noqa: BLE001  (any failure to open is "no image", as in OSWorld)
        return None


@scored()
def check_palette_and_structure_sim(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no image"
    a = _loaded(result)
    if a is None:
        return 0.0, "cannot open the result image"
    b = _loaded(expected)
    if b is None:
        return 0.0, "cannot open the original image"
    try:
        palette = a.mode == "P"
        same = same_structure(a.convert("RGB"), b)
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot compare: {type(exc).__name__}"
    ok = palette and same
    return float(ok), f"palette image: {palette}, same structure: {same}"


@scored()
def check_image_mirror(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from PIL import Image

    if result is None or expected is None:
        return 0.0, "no image"
    flipped = open_image(result).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    ok = same_structure(flipped, open_image(expected), 0.99)
    return float(ok), "mirrored" if ok else "not the mirror image"


@scored()
def check_image_size(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no image"
    image = open_image(result)
    if (expected.get("ignore_transparent", False) and image.mode in ("RGBA", "LA")) or "transparency" in image.info:
        content = _opaque_part(image)
        width, height = (0, 0) if content is None else content.size
    else:
        width, height = image.size
    ok = (expected.get("height", None) is None or height == expected["height"]) and (
        expected.get("width", None) is None or width == expected["width"]
    )
    return float(ok), f"{width}x{height}"


@scored()
def check_image_file_size(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no image"
    size = os.path.getsize(file_path(result))
    ok = size < expected["max_size"]
    return float(ok), f"{size} bytes, limit {short(expected['max_size'])}"


@scored()
def check_green_background(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import numpy as np

    if result is None or expected is None:
        return 0.0, "no image"
    source, target = np.array(open_image(result)), np.array(open_image(expected))
    if target.ndim != 3 or target.shape[0] != target.shape[1]:
        return 0.0, f"OSWorld's check only reads square colour originals (shape {target.shape})"
    rows, cols = np.nonzero(
        np.any(target[:, :, :3] != 0, axis=2) if target.shape[2] >= 3 else np.ones(target.shape[:2])
    )
    if len(rows) == 0:
        return 1.0, "the original has no background pixel"
    if source.ndim != 3 or source.shape[2] < 3 or rows.max() >= source.shape[0] or cols.max() >= source.shape[1]:
        return 0.0, f"the result (shape {source.shape}) does not cover the original {target.shape}"
    r, g, b = (source[rows, cols, channel] for channel in range(3))
    green = (g > r) & (g > b)
    return float(bool(green.all())), f"{int((~green).sum())} background pixels are not green"


@scored()
def check_triangle_position(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import numpy as np

    if result is None:
        return 0.0, "no image"
    pixels = np.array(open_image(result))
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0, return_counts=True)
    triangle = colours[np.argsort(counts)][1]
    centroid = np.argwhere(np.all(pixels == triangle, axis=2)).mean(axis=0)
    shape = np.array(pixels.shape[:2])
    ok = bool(np.all(np.abs(centroid - shape / 2) < 0.05 * shape))
    return float(ok), f"triangle centred at {centroid.round(1).tolist()} in {shape.tolist()}"


@scored()
def check_textbox_on_leftside(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import numpy as np

    if result is None:
        return 0.0, "no image"
    image = open_image(result)
    width = image.size[0]
    grey = np.array(image.convert("L"))
    dark = np.nonzero(grey < 128)[1]
    leftmost = int(dark.min()) if len(dark) else width
    ok = leftmost < width * 0.05
    return float(ok), f"leftmost dark pixel at x={leftmost} of {width}"


def _sharpness(value: Any) -> float:
    import cv2
    import numpy as np

    open_image(value)  # the size bound, before OpenCV decodes it
    grey = cv2.imread(str(file_path(value)), cv2.IMREAD_GRAYSCALE)
    if grey is None:
        raise CannotScore("OpenCV cannot read the image")  # OSWorld's Laplacian fails on it: no score
    return float(np.var(cv2.Laplacian(grey, cv2.CV_64F)))


@scored()
def check_sharper(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    a, b = _sharpness(result), _sharpness(expected)
    return float(a > b), f"sharpness {a:.1f} vs original {b:.1f}"


METRICS: dict[str, Metric] = {
    "compare_images": compare_images,
    "compare_image_list": compare_image_list,
    "check_structure_sim": check_structure_sim,
    "check_structure_sim_resized": check_structure_sim_resized,
    "check_structure_sim_with_threshold": check_structure_sim_with_threshold,
    "check_brightness_decrease_and_structure_sim": check_brightness_decrease_and_structure_sim,
    "check_saturation_increase_and_structure_sim": check_saturation_increase_and_structure_sim,
    "check_contrast_increase_and_structure_sim": check_contrast_increase_and_structure_sim,
    "check_file_exists_and_structure_sim": check_file_exists_and_structure_sim,
    "check_palette_and_structure_sim": check_palette_and_structure_sim,
    "check_image_mirror": check_image_mirror,
    "check_image_size": check_image_size,
    "check_image_file_size": check_image_file_size,
    "check_green_background": check_green_background,
    "check_triangle_position": check_triangle_position,
    "check_textbox_on_leftside": check_textbox_on_leftside,
    "check_sharper": check_sharper,
}
_SSIM = ("numpy", "skimage")
NEEDS: dict[str, tuple[str, ...]] = {name: _SSIM for name in METRICS} | {
    "check_sharper": ("numpy", "cv2"),
    "check_image_file_size": (),
    "compare_image_list": (),
}
