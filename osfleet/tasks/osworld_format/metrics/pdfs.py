"""PDF metrics: ``check_pdf_pages`` (the page count against a relation), ``compare_pdfs`` (text similarity) and
``compare_pdf_images`` (the embedded images).

Semantics, as OSWorld's:
- ``check_pdf_pages``: ``operator.<rules.relation>(pages, rules.ref_value)`` (``eq``, ``lt``, ``ge``...);
- ``compare_pdfs``: the texts of two PDFs (or, when the expected value is a list, of each pair of files)
  compared by similarity in [0, 1] and averaged over the pairs; a pair that cannot be read adds 0; a missing
  file reads as an empty document.
Where the score can differ from OSWorld's: OSWorld extracts text with PyMuPDF (``page.get_text()``, not
installable here); osfleet uses pypdf (``page.extract_text()``, pages joined by newlines). Both give the
page's text in content order, one line per text line, but spacing and the order of text in complex layouts
can differ, so the similarity of two *different* PDFs can differ slightly; identical texts score 1 in both.
- ``compare_pdf_images``: the embedded raster images of the two files (page by page, XObjects, as MuPDF
  lists them; inline images are left out as MuPDF's ``get_images`` leaves them out) are compared by
  perceptual hash (a difference of at most 5 counts as the same); the score is the share of pairs that
  are the same, 0 when the counts differ, 1 when neither has images. pypdf decodes the image streams
  itself where MuPDF hands out the stored bytes: a hash can differ by a bit or two on lossy images.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import (
    NotScored,
    Score,
    file_arg,
    file_path,
    fuzz_ratio,
    guarded,
    scored,
)

MAX_PAGES = 2000


def pdf_text(path: str | None) -> str:
    """The document's text, pages in order, stripped at both ends; a missing file is an empty document."""
    from pypdf import PdfReader

    if path is None:
        return ""
    reader = PdfReader(path)
    return "".join((page.extract_text() or "") + "\n" for page in reader.pages).strip()


@guarded("check_pdf_pages")
def check_pdf_pages(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from pypdf import PdfReader

    path = file_arg(result)
    if path is None:
        return 0.0, "no result file"
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    pages = len(PdfReader(path).pages)
    relation, ref = expected["relation"], expected["ref_value"]
    ok = bool(getattr(operator, relation)(pages, ref))
    return float(ok), f"{pages} page(s) {relation} {ref}: {ok}"


@guarded("compare_pdfs")
def compare_pdfs(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if isinstance(expected, list):
        if result is None:
            raise NotScored("no result files")
        # OSWorld pairs a single result path's characters with the expected files: none of them reads.
        firsts = result if isinstance(result, list) else []
        pairs, count = list(zip(firsts, expected, strict=False)), len(expected)
    else:
        pairs, count = [(result, expected)], 1
    total = 0.0
    for a, b in pairs:
        try:
            total += fuzz_ratio(pdf_text(file_arg(a)), pdf_text(file_arg(b))) / 100
        except Exception:  # noqa: BLE001  (OSWorld: a pair it cannot read adds nothing)
            continue
    if count == 0:
        raise NotScored("no expected files")
    score = total / count
    return score, f"text similarity {score:.3f} over {count} file(s)"


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


METRICS = {"check_pdf_pages": check_pdf_pages, "compare_pdfs": compare_pdfs, "compare_pdf_images": compare_pdf_images}
# Python modules each metric needs on the host, with the package that provides them (the ``office`` extra).
NEEDS = {
    "check_pdf_pages": (("pypdf", "pypdf"),),
    "compare_pdfs": (("pypdf", "pypdf"), ("rapidfuzz", "rapidfuzz")),
    "compare_pdf_images": (("pypdf", "pypdf"), ("imagehash", "imagehash")),
}
