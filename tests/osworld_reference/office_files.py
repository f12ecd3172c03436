"""Office files made for the differential cases: spreadsheets (openpyxl), Writer documents (python-docx, odfpy),
presentations (python-pptx), PDFs (written by hand), LibreOffice and GIMP settings files, and broken files."""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docx
import openpyxl
from PIL import Image
from pptx import Presentation

Rows = list[list[Any]]


def xlsx(path: Path, sheets: dict[str, Rows] | Rows, edit: Callable[[Any], None] | None = None) -> Path:
    """A workbook with these sheets (a bare list of rows is one sheet, ``Sheet1``); ``edit`` gets the workbook."""
    wb = openpyxl.Workbook()
    default = wb.active
    wb.remove(default)
    for name, rows in (sheets if isinstance(sheets, dict) else {"Sheet1": sheets}).items():
        ws = wb.create_sheet(name)
        for row in rows:
            ws.append(row)
    if edit:
        edit(wb)
    wb.save(path)
    return path


def exported_csv(workbook: Path, sheet: str, lines: list[str], encoding: str = "utf-8") -> Path:
    """The CSV LibreOffice's ``--convert-to csv`` writes beside a workbook for one sheet."""
    path = workbook.with_name(f"{workbook.stem}-{sheet}.csv")
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return path


def text(path: Path, body: str | bytes) -> Path:
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return path


def png(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (8, 6)) -> io.BytesIO:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    buf.seek(0)
    return buf


def document(path: Path, build: Callable[[Any], None]) -> Path:
    d = docx.Document()
    build(d)
    d.save(str(path))
    return path


def paragraphs(path: Path, texts: list[str]) -> Path:
    return document(path, lambda d: [d.add_paragraph(t) for t in texts])


def odt(path: Path, paragraphs: list[list[tuple[str, str | None]]], highlight: str | None = "#ffff00") -> Path:
    """An ODF text document; each paragraph is a list of (text, span style or None). Style ``hl`` has the
    background colour ``highlight``, style ``plain`` none."""
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import P, Span

    doc = OpenDocumentText()
    hl = Style(name="hl", family="text")
    if highlight:
        hl.addElement(TextProperties(backgroundcolor=highlight))
    else:
        hl.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(hl)
    plain = Style(name="plain", family="text")
    plain.addElement(TextProperties(fontstyle="italic"))
    doc.automaticstyles.addElement(plain)
    for parts in paragraphs:
        p = P()
        for content, style in parts:
            if style is None:
                p.addText(content)
            else:
                span = Span(stylename=style)
                span.addText(content)
                p.addElement(span)
        doc.text.addElement(p)
    doc.save(str(path))
    return path


def deck(path: Path, build: Callable[[Any], None], template: Path | None = None) -> Path:
    prs = Presentation(str(template) if template else None)
    build(prs)
    prs.save(str(path))
    return path


def pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF with one Helvetica line per string, written by hand (no PDF writer library is needed)."""
    objects: list[bytes] = []
    kids = []
    font_id = 3 + 2 * len(pages)
    for i, lines in enumerate(pages):
        page_id, content_id = 3 + 2 * i, 4 + 2 * i
        kids.append(f"{page_id} 0 R")
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops += [f"({escaped}) Tj", "T*"]
        ops.append("ET")
        stream = zlib.compress("\n".join(ops).encode("latin-1"))
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream")
    head = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>"]
    body = [h if isinstance(h, bytes) else h.encode() for h in head] + objects
    body.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, obj in enumerate(body, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(body) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(body) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def xcu(path: Path, items: list[tuple[str, str, str]]) -> Path:
    """A LibreOffice ``registrymodifications.xcu`` with (item path, prop name, value) entries."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
        'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">',
    ]
    for where, name, value in items:
        lines.append(
            f'<item oor:path="{where}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop></item>'
        )
    lines.append("</oor:items>")
    return text(path, "\n".join(lines) + "\n")


BROKEN: dict[str, bytes] = {
    "empty": b"",
    "not-a-zip": b"this is plain text, not an office file\n",
    "truncated-zip": b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + b"\x00" * 20,
}
