"""Suite tasks on presentations (Impress, ``compare_pptx_files``) and PDF files (``compare_pdfs``).

Inputs and expected files are made here with python-pptx and a small PDF writer from the same text, so each
expected file is exactly what the instruction asks for. The oracles use only the guest's Python standard
library: a .pptx is a zip of XML parts, so a text change is a change of one part; the PDF oracle writes the
same plain PDF this module does (an agent would export from LibreOffice: ``compare_pdfs`` compares the text).
"""

from __future__ import annotations

import datetime as dt
import zlib
from pathlib import Path
from typing import Any

from osfleet.tasks.suites.common import FIXED_TIME, HOME, cloud, download, python, task, vm_file

# The PDF writer of the PDF task's oracle: one page, one line of Helvetica per paragraph. The same code makes
# the expected file here and runs in the guest as the oracle (python3's standard library only).
PDF_WRITER = r"""
import zlib
def write_pdf(path, lines):
    esc = [l.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for l in lines]
    body = "BT /F1 14 Tf 72 760 Td 18 TL " + " ".join(f"({l}) '" for l in esc) + " ET"
    stream = zlib.compress(body.encode("latin-1"))
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
            b" /Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    with open(path, "wb") as f:
        f.write(bytes(out))
"""


def _write_pdf(path: Path, lines: list[str]) -> None:
    scope: dict[str, Any] = {"zlib": zlib}
    exec(PDF_WRITER, scope)  # the oracle's own writer, so expected and oracle output are the same bytes
    scope["write_pdf"](str(path), lines)


def _pptx(path: Path, slides: list[tuple[str, str]]) -> None:
    import pptx

    deck = pptx.Presentation()
    for title, body in slides:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    deck.core_properties.created = deck.core_properties.modified = dt.datetime.fromisoformat(FIXED_TIME)
    deck.save(str(path))


def _replace_in_pptx(doc: str, old: str, new: str) -> dict[str, Any]:
    """Oracle: replace ``old`` by ``new`` in the slides' XML parts of ``doc`` (a .pptx is a zip)."""
    return python(f"""
import os, zipfile
src = {doc!r}; tmp = src + ".part"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        data = zin.read(item.filename)
        if item.filename.startswith("ppt/slides/slide"):
            data = data.replace({old!r}.encode(), {new!r}.encode())
        zout.writestr(item, data)
os.replace(tmp, src)""")


def _pptx_eval(doc: str, gold: str) -> dict[str, Any]:
    return {"func": "compare_pptx_files", "result": vm_file(doc), "expected": cloud(gold), "options": {}}


def tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    review = [("Quarterly review", "Sales grew in every region"), ("Next steps", "Hire two engineers")]
    _pptx(assets / "review.pptx", review)
    _pptx(assets / "review-title-gold.pptx", [("Quarterly review 2024", review[0][1]), review[1]])
    doc = f"{HOME}/Desktop/review.pptx"
    out.append(
        task(
            "impress-title-year",
            "libreoffice_impress",
            "In ~/Desktop/review.pptx, change the first slide's title to 'Quarterly review 2024' and save the "
            "presentation in its format.",
            [download("review.pptx", doc)],
            _pptx_eval(doc, "review-title-gold.pptx"),
            [_replace_in_pptx(doc, "Quarterly review", "Quarterly review 2024")],
        )
    )
    plan = [("Launch plan", "We will recieve the parts in May"), ("Risks", "Late parts")]
    _pptx(assets / "plan.pptx", plan)
    _pptx(assets / "plan-spelling-gold.pptx", [("Launch plan", "We will receive the parts in May"), plan[1]])
    doc = f"{HOME}/Desktop/plan.pptx"
    out.append(
        task(
            "impress-fix-spelling",
            "libreoffice_impress",
            "Fix the misspelled word 'recieve' in ~/Desktop/plan.pptx (it should be 'receive') and save the "
            "presentation in its format.",
            [download("plan.pptx", doc)],
            _pptx_eval(doc, "plan-spelling-gold.pptx"),
            [_replace_in_pptx(doc, "recieve", "receive")],
        )
    )
    lines = ["Release notes", "Faster start-up", "Fewer crashes"]
    (assets / "release-notes.txt").write_text("\n".join(lines) + "\n")
    _write_pdf(assets / "release-notes-gold.pdf", lines)
    src, pdf = f"{HOME}/Documents/release-notes.txt", f"{HOME}/Documents/release-notes.pdf"
    out.append(
        task(
            "writer-text-to-pdf",
            "libreoffice_writer",
            "Make a PDF of ~/Documents/release-notes.txt (one line per line of the text, nothing else) and save it as "
            "~/Documents/release-notes.pdf.",
            [download("release-notes.txt", src)],
            {"func": "compare_pdfs", "result": vm_file(pdf), "expected": cloud("release-notes-gold.pdf")},
            [python(PDF_WRITER + f"write_pdf({pdf!r}, open({src!r}).read().splitlines())")],
        )
    )
    return out
