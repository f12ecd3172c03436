"""EasyOCR's ``Reader(...).readtext`` for the reference process, reading words with Tesseract (EasyOCR needs torch
and downloads its models from the internet the first time it runs: neither is possible here). Loaded only when a
``Reference`` asks for it (``shims=("easyocr",)``): it lets OSWorld's own ``compare_image_text`` run its logic
(missing files, X window dumps, the rule, joining the texts) on the words osfleet's engine reads, with the same
preparation (``osfleet.tasks.osworld_format.metrics.ocr``: three times the size, Lanczos), so the differential
check covers everything but the OCR engine itself, whose agreement with EasyOCR is a separate, stated figure."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

UPSCALE = 3  # as osfleet.tasks.osworld_format.metrics.ocr.UPSCALE


class Reader:
    def __init__(self, languages: list[str], **kwargs: Any) -> None:
        self.languages = languages

    def readtext(self, path: str) -> list[tuple[Any, str, float]]:
        from PIL import Image

        image = Image.open(path).convert("RGB")
        image = image.resize((image.width * UPSCALE, image.height * UPSCALE), Image.Resampling.LANCZOS)
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "picture.png"
            image.save(png, "PNG", compress_level=1)
            out = subprocess.run(["tesseract", str(png), "stdout", "-l", "eng"], capture_output=True, check=True)
        return [(None, word, 1.0) for word in out.stdout.decode(errors="replace").split()]
