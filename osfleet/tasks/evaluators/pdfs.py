"""Metrics on PDF files: their text and their embedded images.

OSWorld reads PDFs with PyMuPDF, which this machine's package index does not serve; osfleet uses
pdfplumber (pdfminer) for text and pypdf for images. Where the result can differ from OSWorld's:
- ``compare_pdfs``: the score is the mean, over the pairs of files, of rapidfuzz's ratio of the two
  texts (stripped), as in OSWorld, but pdfminer and MuPDF do not lay text out identically (spaces between
  words set apart, line breaks inside a paragraph, the order of columns), so the ratio of two different
  PDFs can differ by a few points; identical files score 1 in both. A file that cannot be read adds 0.
- ``compare_pdf_images``: the embedded raster images of the two files (page by page, XObjects, as MuPDF
  lists them; inline images are left out as MuPDF's ``get_images`` leaves them out) are compared by
  perceptual hash (a difference of at most 5 counts as the same); the score is the share of pairs that
  are the same, 0 when the counts differ, 1 when neither has images. pypdf decodes the image streams
  itself where MuPDF hands out the stored bytes: a hash can differ by a bit or two on lossy images.
"""

from __future__ import annotations

import os
from typing import Any

from osfleet.tasks.evaluators.common import Metric, Score, file_path, scored

MAX_PAGES = 2000


def pdf_text(value: Any) -> str:
    import pdfplumber

    with pdfplumber.open(str(file_path(value))) as pdf:
        pages = pdf.pages[:MAX_PAGES]
        return "\n".join(page.extract_text() or "" for page in pages).strip()


@scored()
def compare_pdfs(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from rapidfuzz import fuzz

    if type(expected) is not list:
        result, expected = [result], [expected]
    total, notes = 0.0, []
    for got, want in zip(result, expected, strict=False):
        try:
            ratio = fuzz.ratio(pdf_text(got), pdf_text(want)) / 100
        except Exception as exc:  # noqa: BLE001  (OSWorld adds 0 for a pair it cannot read)
            notes.append(f"unreadable ({type(exc).__name__})")
            continue
        total += ratio
        notes.append(f"{ratio:.3f}")
    score = total / len(expected)
    return score, f"text similarity {score:.3f} ({', '.join(notes)})"


def _images(value: Any) -> list[Any]:
    from pypdf import PdfReader

    images = []
    for page in PdfReader(str(file_path(value))).pages[:MAX_PAGES]:
        for image in page.images:
            if image.name.startswith("~"):  # an inline image: not an XObject, MuPDF does not list it
                continue
            try:
                images.append(image.image)
            except Exception:  # noqa: BLE001  (OSWorld skips an image it cannot decode)
                continue
    return images


@scored(any_options=True)
def compare_pdf_images(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import imagehash

    if not result or not expected:
        return 0.0, "no PDF"
    if not (os.path.exists(file_path(result)) and os.path.exists(file_path(expected))):
        return 0.0, "a PDF file does not exist"
    try:
        got, want = _images(result), _images(expected)
    except Exception as exc:  # noqa: BLE001  (OSWorld scores 0 when it cannot list the images)
        return 0.0, f"cannot read the images: {type(exc).__name__}"
    if len(got) != len(want):
        return 0.0, f"{len(got)} images, expected {len(want)}"
    if not got:
        return 1.0, "neither PDF has images"
    same = sum(1 for a, b in zip(got, want, strict=True) if imagehash.phash(a) - imagehash.phash(b) <= 5)
    return same / len(got), f"{same} of {len(got)} images the same"


METRICS: dict[str, Metric] = {"compare_pdfs": compare_pdfs, "compare_pdf_images": compare_pdf_images}
NEEDS: dict[str, tuple[str, ...]] = {
    "compare_pdfs": ("pdfplumber", "rapidfuzz"),
    "compare_pdf_images": ("pypdf", "imagehash"),
}
