"""PyMuPDF's ``fitz.open`` for the reference process, reading text with pypdf (PyMuPDF is not installable
here). Loaded only when a ``Reference`` asks for it (``shims=("fitz",)``): it lets OSWorld's own
``compare_pdfs`` run its logic (pairing, averaging, failures) on the text osfleet extracts, so the
differential check covers everything but the text extraction itself, which is PyMuPDF's in OSWorld."""

from __future__ import annotations

from typing import Any


class _Page:
    def __init__(self, page: Any) -> None:
        self._page = page

    def get_text(self) -> str:
        return (self._page.extract_text() or "") + "\n"


class _Document:
    def __init__(self, path: str | None) -> None:
        from pypdf import PdfReader

        self._pages = [] if path is None else list(PdfReader(path).pages)  # fitz.open(None) is a new empty PDF

    def __iter__(self) -> Any:
        return (_Page(p) for p in self._pages)

    def __enter__(self) -> _Document:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def open(path: str | None = None) -> _Document:  # noqa: A001  (PyMuPDF's name)
    return _Document(path)
