"""PDF metrics: ``check_pdf_pages`` (the page count against a relation) and ``compare_pdfs`` (text similarity).

Semantics, as OSWorld's:
- ``check_pdf_pages``: ``operator.<rules.relation>(pages, rules.ref_value)`` (``eq``, ``lt``, ``ge``...);
- ``compare_pdfs``: the texts of two PDFs (or, when the expected value is a list, of each pair of files)
  compared by similarity in [0, 1] and averaged over the pairs; a pair that cannot be read adds 0; a missing
  file reads as an empty document.
Where the score can differ from OSWorld's: OSWorld extracts text with PyMuPDF (``page.get_text()``, not
installable here); osfleet uses pypdf (``page.extract_text()``, pages joined by newlines). Both give the
page's text in content order, one line per text line, but spacing and the order of text in complex layouts
can differ, so the similarity of two *different* PDFs can differ slightly; identical texts score 1 in both.
"""

from __future__ import annotations

import operator
from typing import Any

from osfleet.tasks.evaluators.common import NotScored, Score, file_arg, fuzz_ratio, guarded


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


METRICS = {"check_pdf_pages": check_pdf_pages, "compare_pdfs": compare_pdfs}
# Python modules each metric needs on the host, with the package that provides them (the ``office`` extra).
NEEDS = {"check_pdf_pages": (("pypdf", "pypdf"),), "compare_pdfs": (("pypdf", "pypdf"), ("rapidfuzz", "rapidfuzz"))}
