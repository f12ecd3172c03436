"""``compare_docx_files`` and ``compare_pptx_files``: documents the agent saved against the expected ones.

Semantics, as OSWorld documents them (the basic form):
- ``compare_docx_files``: the two documents have the same paragraphs with the same text, in order; options
  ``ignore_blanks`` (default true: whitespace runs count as one space and empty paragraphs are dropped),
  ``ignore_case``, ``ignore_order`` (paragraphs compared as a sorted list) and ``content_only`` (only the
  whole text matters, not how it is split into paragraphs). Table cells count as paragraphs.
- ``compare_pptx_files``: the two presentations have the same number of slides and, slide by slide, the
  same shapes with the same text; option ``examine_shape`` (default true) also compares each shape's
  position and size, ``examine_text`` (default true) its text.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

Score = tuple[float, str]


def _file(value: Any, what: str) -> Path:
    if not isinstance(value, Path):
        raise TypeError(f"{what} needs document files, got {type(value).__name__}")
    return value


MAX_GRID_SPAN = 64  # Word's tables have at most 63 columns


def docx_paragraphs(path: Path) -> list[str]:
    import docx
    from docx.oxml.ns import qn

    document = docx.Document(str(path))
    for span in document.element.body.iter(qn("w:gridSpan")):  # python-docx makes a list that long per cell
        val = span.get(qn("w:val"), "1")
        if not (val.isdigit() and len(val) <= 3 and int(val) <= MAX_GRID_SPAN):
            span.set(qn("w:val"), str(MAX_GRID_SPAN))
    texts = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            texts.extend(cell.text for cell in row.cells)
    return texts


def compare_docx_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from docx.opc.exceptions import OpcError

    if result is None or expected is None:
        return 0.0, "no result file" if result is None else "no expected file"
    try:
        a, b = docx_paragraphs(_file(result, "compare_docx_files")), docx_paragraphs(_file(expected, "docx"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, OpcError) as exc:
        return 0.0, f"not a document python-docx can read: {exc}"
    blanks = bool(options.get("ignore_blanks", True))
    if blanks:
        a = [t for t in (re.sub(r"\s+", " ", t).strip() for t in a) if t]
        b = [t for t in (re.sub(r"\s+", " ", t).strip() for t in b) if t]
    if options.get("ignore_case"):
        a, b = [t.lower() for t in a], [t.lower() for t in b]
    if options.get("content_only"):
        ok = " ".join(a).split() == " ".join(b).split()
        return float(ok), "same text" if ok else "text differs"
    if options.get("ignore_order"):
        a, b = sorted(a), sorted(b)
    if len(a) != len(b):
        return 0.0, f"{len(a)} paragraphs vs {len(b)} expected"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return 0.0, f"paragraph {i + 1} differs: {x[:60]!r} vs {y[:60]!r}"
    return 1.0, f"{len(a)} paragraphs equal"


def _shapes(slide: Any, geometry: bool, text: bool) -> list[tuple[Any, ...]]:
    out = []
    for shape in slide.shapes:
        item: tuple[Any, ...] = (shape.shape_type,)
        if geometry:
            item += (shape.left, shape.top, shape.width, shape.height)
        if text and shape.has_text_frame:
            item += tuple(p.text for p in shape.text_frame.paragraphs)
        out.append(item)
    return out


def compare_pptx_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from pptx import Presentation
    from pptx.exc import PythonPptxError

    if result is None or expected is None:
        return 0.0, "no result file" if result is None else "no expected file"
    try:
        a = Presentation(str(_file(result, "compare_pptx_files")))
        b = Presentation(str(_file(expected, "compare_pptx_files")))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, PythonPptxError) as exc:
        return 0.0, f"not a presentation python-pptx can read: {exc}"
    geometry, text = bool(options.get("examine_shape", True)), bool(options.get("examine_text", True))
    if len(a.slides) != len(b.slides):
        return 0.0, f"{len(a.slides)} slides vs {len(b.slides)} expected"
    for i, (sa, sb) in enumerate(zip(a.slides, b.slides, strict=True)):
        shapes_a, shapes_b = _shapes(sa, geometry, text), _shapes(sb, geometry, text)
        if len(shapes_a) != len(shapes_b):
            return 0.0, f"slide {i + 1}: {len(shapes_a)} shapes vs {len(shapes_b)} expected"
        for j, (x, y) in enumerate(zip(shapes_a, shapes_b, strict=True)):
            if x != y:
                return 0.0, f"slide {i + 1} shape {j + 1} differs"
    return 1.0, f"{len(a.slides)} slides equal"
