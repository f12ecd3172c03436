"""Writer documents (docx, and odt where OSWorld reads it) against the expected document or a rule.

Semantics, as OSWorld's (desktop-env 1.0.2 ``docs.py``); "paragraphs" are the body's top-level paragraphs as
python-docx lists them (not table cells, headers or footers), "runs" theirs:
- ``compare_docx_files``: two .docx (or two .odt: each ``<text:p>``'s own text and its spans' text) with the
  same paragraphs. Options: ``ignore_blanks`` (default true: the whole text, whitespace runs as one space),
  ``ignore_case``, ``ignore_order`` (paragraphs sorted), ``delete_empty_lines``, ``content_only`` and
  ``fuzzy_match`` (the score is the texts' similarity in [0, 1] instead of 0/1). Other file kinds score 0.
- ``compare_docx_files_and_ignore_new_lines``: two .docx whose non-empty paragraphs are equal (``ignore_blanks``
  as above, default true).
- ``compare_docx_lines``: the same set of stripped non-empty paragraphs.
- ``compare_docx_tables``: the same tables, cell texts stripped; ``compare_docx_images``: the same images
  (decoded pixels) in the document part's relationship order.
- ``compare_line_spacing``, ``compare_insert_equation``, ``evaluate_colored_words_in_tables``,
  ``evaluate_strike_through_last_paragraph``, ``check_italic_font_size_14``, ``check_highlighted_words``:
  first ``compare_docx_files`` with its defaults must hold, then: every paragraph has the expected one's line
  spacing; some pair of runs at the same place both hold an equation object; in the result's tables every
  word starting with a vowel is red and every other word blue (CIEDE2000 distance <= ``threshold``, 3.5);
  every run of the result's last paragraph is struck through; every italic run is 14 pt; no span of the
  result (odt) has a yellow (#ffff00) background.
- ``compare_subscript_contains``: some pair of runs at the same place are both subscript;
  ``compare_contains_image``: no pair of runs at the same place where only one holds a drawing.
- ``compare_font_names``: every run's font is ``rules.font_name``; ``contains_page_break``: the result has a
  page break (exactly ``rules.page_break_count`` of them if given; OSWorld's function needs the rules object,
  so a task without ``expected`` cannot score); ``has_page_numbers_in_footers``: the first footer paragraph of
  every section holds a digit; ``is_first_line_centered``: the first paragraph is centred.
- ``check_tabstops``: the same number of non-empty paragraphs (option ``word_number_split_by_tabstop``: each
  result paragraph's ``index``-th tab-separated part has that many words) and the same tab stops, scored
  1 - the mean over paragraphs of the summed position differences relative to the text width.
- ``compare_references``: after the first paragraph that is exactly ``reference_indicator`` (``References``),
  the same number of non-empty entries; their mean similarity s scores (s - b) / (1 - b) when s >= b + 0.01
  (b = ``reference_base_result``, 0.5), else 0; no such heading in either document scores 1.
- ``compare_highlighted_text``: the same set of highlighted run texts.
- ``compare_unique_train_records`` (OSWorld's main branch; ``expected`` is the gold and the original document):
  every non-empty line of the result is a line of the original, no train id (the second field of a line of four
  comma-separated fields) twice, the same set of ids and as many lines as the gold document.
A file python-docx cannot open scores 0.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored, Score, file_arg, fuzz_ratio, guarded, short

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _open(path: str | None) -> Any:
    """The python-docx document, or None for a missing or unreadable file (scored 0, as in OSWorld); a
    malformed one raises ``NotScored`` (scored 0 with the reason)."""
    import docx

    if not path:
        return None
    try:
        document = docx.Document(path)
    except Exception:  # noqa: BLE001  (any file python-docx cannot read)
        return None
    _check_spans(document)
    return document


MAX_GRID_SPAN = 64  # Word's tables have at most 63 columns


def _check_spans(document: Any) -> None:
    """Refuses a cell that spans more columns than Word allows: python-docx expands each cell's ``gridSpan``
    into a list that long (2^31 entries for a 4 KB file), so such a file is input built to hurt a parser, never
    a document Word or LibreOffice writes; it scores 0 rather than being read with a clamped span."""
    from docx.oxml.ns import qn

    for span in document.element.body.iter(qn("w:gridSpan")):
        val = span.get(qn("w:val"), "1")
        if not (val.isdigit() and len(val) <= 3 and int(val) <= MAX_GRID_SPAN):
            raise NotScored(f"a table cell spans {short(val, 20)} columns (Word allows {MAX_GRID_SPAN - 1})")


def _two(result: Any, expected: Any) -> tuple[Any, Any] | None:
    a, b = file_arg(result), file_arg(expected)
    if not a or not b:
        return None
    da, db = _open(a), _open(b)
    return None if da is None or db is None else (da, db)


def _odt_paragraphs(path: str) -> list[str]:
    """Each ``<text:p>``: its own text nodes and the text directly inside its ``<text:span>`` children."""
    from odf.opendocument import load
    from odf.text import P

    texts = []
    for p in load(path).getElementsByType(P):
        parts = []
        for node in p.childNodes:
            if node.nodeType == node.TEXT_NODE:
                parts.append(node.data)
            elif node.nodeType == node.ELEMENT_NODE and node.tagName == "text:span":
                parts.extend(c.data for c in node.childNodes if c.nodeType == c.TEXT_NODE)
        texts.append("".join(parts))
    return texts


def _blank_folded(paragraphs: list[str]) -> str:
    return re.sub(r"\s+", " ", "\n".join(paragraphs)).strip()


def docx_similarity(result: Any, expected: Any, options: dict[str, Any]) -> tuple[float, str]:
    """``compare_docx_files``' score and reason (also the precondition of several other metrics)."""
    a, b = file_arg(result), file_arg(expected)
    if not a or not b:
        return 0.0, "no result file" if not a else "no expected file"
    if a.endswith(".docx") and b.endswith(".docx"):
        da, db = _open(a), _open(b)
        if da is None or db is None:
            return 0.0, "not a document python-docx can read"
        pa, pb = [p.text for p in da.paragraphs], [p.text for p in db.paragraphs]
    elif a.endswith(".odt") and b.endswith(".odt"):
        try:
            pa, pb = _odt_paragraphs(a), _odt_paragraphs(b)
        except Exception:  # noqa: BLE001  (any file odfpy cannot read)
            return 0.0, "not a document odfpy can read"
    else:
        return 0.0, "needs two .docx or two .odt files"
    if options.get("ignore_order", False):
        pa, pb = sorted(pa), sorted(pb)
    if options.get("delete_empty_lines", False):
        pa, pb = [p for p in pa if p.strip()], [p for p in pb if p.strip()]
    case = options.get("ignore_case", False)
    fuzzy = options.get("fuzzy_match", False)
    if options.get("content_only", False) or options.get("ignore_blanks", True):
        ta, tb = _blank_folded(pa), _blank_folded(pb)
        if case:
            ta, tb = ta.lower(), tb.lower()
        if options.get("content_only", False) or fuzzy:
            ratio = fuzz_ratio(ta, tb) / 100.0
            return ratio, f"text similarity {ratio:.3f}"
        return (1.0, "same text") if ta == tb else (0.0, f"text differs: {_first_difference(ta, tb)}")
    if len(pa) != len(pb):
        return 0.0, f"{len(pa)} paragraphs vs {len(pb)} expected"
    if fuzzy:
        if not pa:
            return 1.0, "no paragraphs"
        total = 0.0
        for x, y in zip(pa, pb, strict=True):
            total += (fuzz_ratio(x.lower(), y.lower()) if case else fuzz_ratio(x, y)) / 100.0
        return total / len(pa), "mean paragraph similarity"
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if case:
            x, y = x.lower(), y.lower()
        if x != y:
            return 0.0, f"paragraph {i + 1} differs: {short(x, 60)} vs {short(y, 60)}"
    return 1.0, f"{len(pa)} paragraphs equal"


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at character {i}: {short(a[max(0, i - 20) : i + 40])} vs {short(b[max(0, i - 20) : i + 40])}"


@guarded("compare_docx_files")
def compare_docx_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    return docx_similarity(result, expected, options)


def _precondition(result: Any, expected: Any) -> Score | None:
    """0 with the reason when a document is missing or the documents' texts differ (``compare_docx_files``
    with its defaults): what OSWorld's formatting checks require before they look at the formatting."""
    if not file_arg(result) or not file_arg(expected):
        return 0.0, "a document is missing"
    score, reason = docx_similarity(result, expected, {})
    return None if score else (0.0, f"the texts differ first: {reason}")


def _result_document(result: Any, expected: Any) -> tuple[Any, Score | None]:
    """The result's python-docx document once ``_precondition`` holds; else None and the 0 to return."""
    failed = _precondition(result, expected)
    if failed:
        return None, failed
    document = _open(file_arg(result))
    return document, None if document is not None else (0.0, "no readable result document")


@guarded("compare_docx_files_and_ignore_new_lines")
def compare_docx_files_and_ignore_new_lines(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    a, b = file_arg(result), file_arg(expected)
    if not a or not b:
        return 0.0, "no result file" if not a else "no expected file"
    if not (a.endswith(".docx") and b.endswith(".docx")):
        return 0.0, "needs two .docx files"
    docs = _two(a, b)
    if docs is None:
        return 0.0, "not a document python-docx can read"
    pa = [p.text for p in docs[0].paragraphs if p.text != ""]
    pb = [p.text for p in docs[1].paragraphs if p.text != ""]
    if options.get("ignore_blanks", True):
        ok = _blank_folded(pa) == _blank_folded(pb)
        return (1.0, "same text") if ok else (0.0, "text differs")
    if len(pa) != len(pb):
        return 0.0, f"{len(pa)} non-empty paragraphs vs {len(pb)} expected"
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x != y:
            return 0.0, f"paragraph {i + 1} differs: {short(x, 60)} vs {short(y, 60)}"
    return 1.0, f"{len(pa)} paragraphs equal"


@guarded("compare_docx_lines")
def compare_docx_lines(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    a, b = ({p.text.strip() for p in d.paragraphs if p.text.strip()} for d in docs)
    if a == b:
        return 1.0, f"{len(a)} lines equal"
    return 0.0, f"lines differ: {short(sorted(a ^ b)[:3])}"


@guarded("compare_docx_tables")
def compare_docx_tables(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    ta, tb = docs[0].tables, docs[1].tables
    if len(ta) != len(tb):
        return 0.0, f"{len(ta)} tables vs {len(tb)} expected"
    for n, (x, y) in enumerate(zip(ta, tb, strict=True)):
        if len(x.rows) != len(y.rows) or len(x.columns) != len(y.columns):
            return 0.0, f"table {n + 1}: {len(x.rows)}x{len(x.columns)} vs {len(y.rows)}x{len(y.columns)}"
        for i in range(len(x.rows)):
            for j in range(len(x.columns)):
                if x.cell(i, j).text.strip() != y.cell(i, j).text.strip():
                    return 0.0, f"table {n + 1} cell ({i + 1}, {j + 1}) differs"
    return 1.0, f"{len(ta)} tables equal"


def _image_blobs(document: Any) -> list[bytes]:
    return [rel.target_part.blob for rel in document.part.rels.values() if "image" in rel.reltype]


@guarded("compare_docx_images")
def compare_docx_images(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from PIL import Image

    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    a, b = _image_blobs(docs[0]), _image_blobs(docs[1])
    if len(a) != len(b):
        return 0.0, f"{len(a)} images vs {len(b)} expected"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if Image.open(io.BytesIO(x)).tobytes() != Image.open(io.BytesIO(y)).tobytes():
            return 0.0, f"image {i + 1} differs"
    return 1.0, f"{len(a)} images equal"


@guarded("compare_line_spacing")
def compare_line_spacing(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    failed = _precondition(result, expected)
    if failed:
        return failed
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is unreadable"
    pa, pb = docs[0].paragraphs, docs[1].paragraphs
    if len(pa) != len(pb):
        return 0.0, f"{len(pa)} paragraphs vs {len(pb)} expected"
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x.paragraph_format.line_spacing != y.paragraph_format.line_spacing:
            a, b = x.paragraph_format.line_spacing, y.paragraph_format.line_spacing
            return 0.0, f"paragraph {i + 1}: line spacing {a} vs {b}"
    return 1.0, f"{len(pa)} paragraphs with the expected line spacing"


def _run_pairs(a: Any, b: Any) -> Any:
    for pa, pb in zip(a.paragraphs, b.paragraphs, strict=False):
        yield from zip(pa.runs, pb.runs, strict=False)


@guarded("compare_insert_equation")
def compare_insert_equation(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    failed = _precondition(result, expected)
    if failed:
        return failed
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is unreadable"
    for ra, rb in _run_pairs(*docs):
        if ra.element.xpath(".//w:object") and rb.element.xpath(".//w:object"):
            return 1.0, "an equation object where the expected document has one"
    return 0.0, "no equation object where the expected document has one"


@guarded("compare_subscript_contains")
def compare_subscript_contains(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    for ra, rb in _run_pairs(*docs):
        if ra.font.subscript and rb.font.subscript:
            return 1.0, f"subscript {short(ra.text)} where the expected document has one"
    return 0.0, "no subscript where the expected document has one"


@guarded("compare_contains_image")
def compare_contains_image(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    for ra, rb in _run_pairs(*docs):
        if ("graphicData" in ra._element.xml) != ("graphicData" in rb._element.xml):
            return 0.0, f"a drawing in only one document, at run {short(ra.text)}"
    return 1.0, "drawings where the expected document has them"


def _rules(expected: Any) -> dict[str, Any]:
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    return expected


@guarded("compare_font_names")
def compare_font_names(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document = _open(file_arg(result))
    if document is None:
        return 0.0, "no readable result document"
    font = _rules(expected)["font_name"]
    for p in document.paragraphs:
        for run in p.runs:
            if run.font.name != font:
                return 0.0, f"run {short(run.text, 40)} is in {run.font.name!r}, not {font!r}"
    return 1.0, f"every run is in {font!r}"


@guarded("contains_page_break")
def contains_page_break(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document = _open(file_arg(result))
    if document is None:
        return 0.0, "no readable result document"
    if expected is None:
        raise NotScored("OSWorld's function needs a rules object (the task has no 'expected'), so it cannot score")
    try:
        wanted = expected["page_break_count"]
    except Exception:  # noqa: BLE001  (OSWorld: no count asked)
        wanted = None
    breaks = sum(
        1
        for p in document.paragraphs
        for run in p.runs
        for br in run.element.findall(f".//{{{W}}}br")
        if br.attrib.get(f"{{{W}}}type") == "page"
    )
    if wanted is not None and breaks != wanted:
        return 0.0, f"{breaks} page break(s), {wanted} wanted"
    return (1.0, f"{breaks} page break(s)") if breaks > 0 else (0.0, "no page break")


@guarded("has_page_numbers_in_footers")
def has_page_numbers_in_footers(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document = _open(file_arg(result))
    if document is None:
        return 0.0, "no readable result document"
    for i, section in enumerate(document.sections):
        footer = section.footer
        text = footer.paragraphs[0].text if footer.paragraphs else ""
        if not any(ch.isdigit() for ch in text):
            return 0.0, f"section {i + 1}'s footer has no number ({short(text, 40)})"
    return 1.0, "every section's footer has a number"


@guarded("is_first_line_centered")
def is_first_line_centered(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    document = _open(file_arg(result))
    if document is None:
        return 0.0, "no readable result document"
    alignment = document.paragraphs[0].paragraph_format.alignment
    if alignment == WD_PARAGRAPH_ALIGNMENT.CENTER:
        return 1.0, "the first paragraph is centred"
    return 0.0, f"the first paragraph is aligned {alignment}"


@guarded("check_tabstops")
def check_tabstops(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from docx.enum.text import WD_TAB_ALIGNMENT

    docs = _two(result, expected)
    if docs is None:
        return 0.0, "a document is missing or unreadable"
    pa = [p for p in docs[0].paragraphs if p.text.strip()]
    pb = [p for p in docs[1].paragraphs if p.text.strip()]
    if len(pa) != len(pb):
        return 0.0, f"{len(pa)} non-empty paragraphs vs {len(pb)} expected"
    if options.get("word_number_split_by_tabstop") is not None:
        number, index = options["word_number_split_by_tabstop"], options.get("index", 0)
        for p in pa:
            part = p.text.split("\t")[index]
            words = [w for w in re.split(r"\s", part) if w.strip()]
            if len(words) != number:
                return 0.0, f"{short(part, 40)} has {len(words)} words before the tab, {number} wanted"
    section = docs[1].sections[0]
    width = section.page_width - section.left_margin - section.right_margin

    def counted(tab: Any) -> bool:
        return not (
            tab.alignment == WD_TAB_ALIGNMENT.CLEAR or (tab.alignment == WD_TAB_ALIGNMENT.LEFT and tab.position == 0)
        )

    penalty = 0.0
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        ta = [t for t in x.paragraph_format.tab_stops if counted(t)]
        tb = [t for t in y.paragraph_format.tab_stops if counted(t)]
        if len(ta) != len(tb):
            return 0.0, f"paragraph {i + 1}: {len(ta)} tab stops vs {len(tb)} expected"
        offset = 0.0
        for s, t in zip(ta, tb, strict=True):
            if s.alignment != t.alignment:
                return 0.0, f"paragraph {i + 1}: a tab stop aligned {s.alignment}, {t.alignment} expected"
            offset += abs(s.position - t.position)
        penalty += offset / width
    score = 1 - penalty / len(pa)
    return score, f"tab stops {score:.3f} of the way to the expected ones"


def _srgb_to_lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """CIE L*a*b* (D65, 2-degree observer) of an sRGB colour in [0, 1]."""
    linear = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb]
    matrix = ((0.412453, 0.357580, 0.180423), (0.212671, 0.715160, 0.072169), (0.019334, 0.119193, 0.950227))
    white = (0.95047, 1.0, 1.08883)
    xyz = [sum(m * c for m, c in zip(row, linear, strict=True)) / w for row, w in zip(matrix, white, strict=True)]
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16.0 / 116.0 for t in xyz)
    return 116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)


def ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """The CIEDE2000 colour difference (kL = kC = kH = 1)."""
    l1, a1, b1 = lab1
    l2, a2, b2 = lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25.0**7)))
    a1, a2 = a1 * (1 + g), a2 * (1 + g)
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    h1 = math.atan2(b1, a1) % (2 * math.pi)
    h2 = math.atan2(b2, a2) % (2 * math.pi)
    dl, dc = l2 - l1, c2 - c1
    dh = h2 - h1
    if c1 * c2 == 0:
        dh = 0.0
    elif dh > math.pi:
        dh -= 2 * math.pi
    elif dh < -math.pi:
        dh += 2 * math.pi
    dh_big = 2 * math.sqrt(c1 * c2) * math.sin(dh / 2)
    l_mean, c_mean2 = (l1 + l2) / 2, (c1 + c2) / 2
    h_sum = h1 + h2
    if c1 * c2 == 0:
        h_mean = h_sum
    elif abs(h1 - h2) <= math.pi:
        h_mean = h_sum / 2
    elif h_sum < 2 * math.pi:
        h_mean = (h_sum + 2 * math.pi) / 2
    else:
        h_mean = (h_sum - 2 * math.pi) / 2
    t = (
        1
        - 0.17 * math.cos(h_mean - math.radians(30))
        + 0.24 * math.cos(2 * h_mean)
        + 0.32 * math.cos(3 * h_mean + math.radians(6))
        - 0.20 * math.cos(4 * h_mean - math.radians(63))
    )
    sl = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    sc = 1 + 0.045 * c_mean2
    sh = 1 + 0.015 * c_mean2 * t
    rc = 2 * math.sqrt(c_mean2**7 / (c_mean2**7 + 25.0**7))
    rotation = math.radians(30) * math.exp(-(((math.degrees(h_mean) - 275) / 25) ** 2))
    rt = -math.sin(2 * rotation) * rc
    squared = (dl / sl) ** 2 + (dc / sc) ** 2 + (dh_big / sh) ** 2 + rt * (dc / sc) * (dh_big / sh)
    return math.sqrt(max(squared, 0.0))


def _distance(rgb: Any, target: tuple[int, int, int]) -> float:
    lab1 = _srgb_to_lab((rgb[0] / 255.0, rgb[1] / 255.0, rgb[2] / 255.0))
    lab2 = _srgb_to_lab((target[0] / 255.0, target[1] / 255.0, target[2] / 255.0))
    return ciede2000(lab1, lab2)


@guarded("evaluate_colored_words_in_tables")
def evaluate_colored_words_in_tables(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document, failed = _result_document(result, expected)
    if failed:
        return failed
    threshold = options.get("threshold", 3.5)
    for table in document.tables:
        for row in table.rows:
            for cell in row.cells:
                for p in cell.paragraphs:
                    for run in p.runs:
                        if not run.text:
                            continue
                        rgb = run.font.color.rgb
                        if rgb is None:
                            raise NotScored(f"run {short(run.text, 30)} has no RGB colour")
                        vowel = run.text[0].lower() in "aeiou"
                        target, name = ((255, 0, 0), "red") if vowel else ((0, 0, 255), "blue")
                        if _distance(rgb, target) > threshold:
                            return 0.0, f"{short(run.text, 30)} is {rgb}, not {name}"
    return 1.0, "vowel words red, the others blue"


@guarded("evaluate_strike_through_last_paragraph")
def evaluate_strike_through_last_paragraph(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document, failed = _result_document(result, expected)
    if failed:
        return failed
    for run in document.paragraphs[-1].runs:
        if not run.font.strike:
            return 0.0, f"{short(run.text, 40)} of the last paragraph is not struck through"
    return 1.0, "the last paragraph is struck through"


@guarded("check_italic_font_size_14")
def check_italic_font_size_14(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    document, failed = _result_document(result, expected)
    if failed:
        return failed
    for p in document.paragraphs:
        for run in p.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0, f"italic {short(run.text, 40)} is not 14 pt"
    return 1.0, "every italic run is 14 pt"


@guarded("check_highlighted_words")
def check_highlighted_words(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from odf.opendocument import load
    from odf.text import Span

    failed = _precondition(result, expected)
    if failed:
        return failed
    document = load(file_arg(result))
    for span in document.getElementsByType(Span):
        style = span.getAttribute("stylename")
        if not style:
            continue
        highlighted = False
        for auto in document.automaticstyles.childNodes:
            if auto.getAttribute("name") == style:
                for prop in auto.childNodes:
                    if prop.getAttribute("backgroundcolor") == "#ffff00":
                        highlighted = True
                        break
        if highlighted:
            return 0.0, f"a span is still highlighted (style {style})"
    return 1.0, "no highlighted span"


@guarded("compare_highlighted_text")
def compare_highlighted_text(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import xml.etree.ElementTree as ET

    a, b = file_arg(result), file_arg(expected)
    if not a or not b:
        return 0.0, "a document is missing"

    def highlighted(path: str) -> set[str | None]:
        with zipfile.ZipFile(path) as z, z.open("word/document.xml") as f:
            root = ET.parse(f).getroot()
        out: set[str | None] = set()
        for run in root.iter(f"{{{W}}}r"):
            mark = run.find(f".//{{{W}}}highlight")
            if mark is not None and mark.get(f"{{{W}}}val") != "none":
                text = run.find(f".//{{{W}}}t")
                if text is not None:
                    out.add(text.text)
        return out

    ha, hb = highlighted(a), highlighted(b)
    if ha == hb:
        return 1.0, f"{len(ha)} highlighted text(s) as expected"
    return 0.0, f"highlighted {short(sorted(map(str, ha)))} vs {short(sorted(map(str, hb)))}"


@guarded("compare_references")
def compare_references(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    a, b = file_arg(result), file_arg(expected)
    if not a or not b:
        return 0.0, "a document is missing"
    heading = options.get("reference_indicator", "References")
    base = options.get("reference_base_result", 0.5)
    if not (a.endswith(".docx") and b.endswith(".docx")):
        return 0.0, "needs two .docx files"
    docs = _two(a, b)
    if docs is None:
        return 0.0, "not a document python-docx can read"
    pa, pb = ([p.text for p in d.paragraphs] for d in docs)
    ia = pa.index(heading) if heading in pa else -1
    ib = pb.index(heading) if heading in pb else -1
    if ia == -1 and ib == -1:
        return 1.0, f"no {heading!r} section in either document"
    if ia == -1 or ib == -1:
        return 0.0, f"a {heading!r} section in only one document"
    ra, rb = [p for p in pa[ia + 1 :] if p.strip()], [p for p in pb[ib + 1 :] if p.strip()]
    if len(ra) != len(rb):
        return 0.0, f"{len(ra)} references vs {len(rb)} expected"
    mean = sum(fuzz_ratio(x, y) / 100.0 for x, y in zip(ra, rb, strict=True)) / len(ra)
    if mean >= base + 0.01:
        return (mean - base) / (1 - base), f"references {mean:.3f} similar"
    return 0.0, f"references only {mean:.3f} similar (base {base})"


def _train_records(path: Any) -> tuple[list[str], list[str]] | None:
    """A train record document's non-empty stripped paragraphs and the ids (second field) of its lines with
    exactly four comma-separated fields; None when python-docx cannot read it."""
    document = _open(file_arg(path))
    if document is None:
        return None
    lines = [p.text.strip() for p in document.paragraphs if p.text.strip()]
    return lines, [line.split(",")[1].strip() for line in lines if len(line.split(",")) == 4]


@guarded("compare_unique_train_records")
def compare_unique_train_records(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result or not isinstance(expected, list) or len(expected) < 2:
        return 0.0, "needs the result and a list of the gold and the original documents"
    if not expected[0] or not expected[1]:
        return 0.0, "the gold or the original document is missing"
    got, gold, initial = (_train_records(v) for v in (result, expected[0], expected[1]))
    if got is None or gold is None or initial is None:
        return 0.0, "not a document python-docx can read"
    (lines, ids), (gold_lines, gold_ids) = got, gold
    extra = set(lines) - set(initial[0])
    if extra:
        return 0.0, f"lines not in the original: {short(sorted(extra))}"
    if len(ids) != len(set(ids)):
        return 0.0, "a train id is there twice"
    if set(ids) != set(gold_ids):
        return 0.0, f"train ids {short(sorted(set(ids)))}, expected {short(sorted(set(gold_ids)))}"
    if len(lines) != len(gold_lines):
        return 0.0, f"{len(lines)} lines, expected {len(gold_lines)}"
    return 1.0, f"{len(ids)} unique train records, as the gold document"


METRICS = {
    "compare_docx_files": compare_docx_files,
    "compare_docx_files_and_ignore_new_lines": compare_docx_files_and_ignore_new_lines,
    "compare_docx_lines": compare_docx_lines,
    "compare_docx_tables": compare_docx_tables,
    "compare_docx_images": compare_docx_images,
    "compare_line_spacing": compare_line_spacing,
    "compare_insert_equation": compare_insert_equation,
    "compare_subscript_contains": compare_subscript_contains,
    "compare_contains_image": compare_contains_image,
    "compare_font_names": compare_font_names,
    "contains_page_break": contains_page_break,
    "has_page_numbers_in_footers": has_page_numbers_in_footers,
    "is_first_line_centered": is_first_line_centered,
    "check_tabstops": check_tabstops,
    "evaluate_colored_words_in_tables": evaluate_colored_words_in_tables,
    "evaluate_strike_through_last_paragraph": evaluate_strike_through_last_paragraph,
    "check_italic_font_size_14": check_italic_font_size_14,
    "check_highlighted_words": check_highlighted_words,
    "compare_highlighted_text": compare_highlighted_text,
    "compare_references": compare_references,
    "compare_unique_train_records": compare_unique_train_records,
}
DOCX, ODF, FUZZ = ("docx", "python-docx"), ("odf", "odfpy"), ("rapidfuzz", "rapidfuzz")
# Python modules each metric needs on the host, with the package that provides them (the ``office`` extra).
NEEDS = {name: (DOCX, ODF, FUZZ) for name in METRICS}
