"""Impress presentations (pptx, read with python-pptx) against the expected one or a rule, and Impress' left
panel in the accessibility tree.

Semantics, as OSWorld's (desktop-env 1.0.2 ``slides.py``). A missing file is opened as python-pptx's default
(empty) presentation, as OSWorld's calls do.
- ``compare_pptx_files``: the same number of slides (``examine_number_of_slides``), and slide by slide: the
  same solid background colour (``examine_background_color``; a colour given by the theme fails the
  metric), the same notes text (``examine_note``), the same number of shapes, then shape by shape: the same
  position and size within ``approximately_tolerance`` (0.5 %, ``examine_shape``), tables with the same
  cells, paragraphs and runs (colour, bold, italic, underline), and for shapes with text: the same text
  (``examine_text``), paragraph count, alignment (``examine_alignment``, none = left), level
  (``examine_indent``), runs, and per run the font name, size, bold, italic, RGB colour, underline and
  strike-through (``examine_font_*``, ``examine_color_rgb``, ``examine_strike_through``), and the bullets
  of the slide (``examine_bullets``); finally every text shape, groups included, pairwise aligned alike.
  The task-specific options ``examine_title_bottom_position``, ``examine_table_bottom_position``,
  ``examine_right_position``, ``examine_top_position``, ``examine_shape_for_shift_size``,
  ``examine_image_size`` and ``examine_modify_height`` relax or tighten the geometry check as OSWorld's do.
- ``check_image_stretch_and_center``: the expected deck's first picture is, in the result's first slide,
  stretched to the slide and centred (within half an inch).
- ``check_slide_orientation_Portrait``: slides are taller than wide.
- ``evaluate_presentation_fill_to_rgb_distance``: 1 - the mean distance of each slide's solid background
  to ``rules.rgb`` (a slide still of ``rules.original_rgb``, or without a solid RGB background, counts 1).
- ``check_transition``: slide part ``slide<slide_idx + 1>.xml`` has a ``<p:transition>`` holding
  ``<p:<transition_type>>``.
- ``check_page_number_colors``: the second-last ``srgbClr`` under a ``solidFill`` of ``slideMaster1.xml`` is
  ``rules.color`` (red, blue, green or black; read as ``#RRGGBB`` from the value's second character on).
- ``check_left_panel``: the accessibility tree has a ``document-frame`` named "Slides View".
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
import zipfile
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored, Score, file_arg, guarded, short

A = "http://schemas.openxmlformats.org/drawingml/2006/main"
P = "http://schemas.openxmlformats.org/presentationml/2006/main"
TABLE, PICTURE, FREEFORM = 19, 13, 5


def _presentation(value: Any) -> Any:
    from pptx import Presentation

    return Presentation(file_arg(value))


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if a == b:
        return True
    if a == 0 and b == 0:
        return True
    if a == 0 or b == 0:
        return False
    return bool(abs(a - b) / max(abs(a), abs(b)) <= tolerance)


def _background(slide: Any) -> Any:
    fill = slide.background.fill
    if fill.type == 1:
        return fill.fore_color.rgb
    if fill.type == 5:
        master = slide.slide_layout.slide_master.background.fill
        return master.fore_color.rgb if master.type == 1 else None
    return None


def _notes(slide: Any) -> str:
    return str(slide.notes_slide.notes_text_frame.text)


def _text_shapes(shapes: Any) -> list[Any]:
    out = []
    for shape in shapes:
        if hasattr(shape, "text") and hasattr(shape, "text_frame"):
            out.append(shape)
        if hasattr(shape, "shapes"):
            out.extend(_text_shapes(shape.shapes))
    return out


def _flag_differs(a: Any, b: Any) -> bool:
    """Bold/italic differ, None and False both meaning "not set"."""
    return a != b and not ((a is None or a is False) and (b is None or b is False))


def _underline_differs(a: Any, b: Any) -> bool:
    if a == b:
        return False
    if a is not None and b is not None:
        return True
    return (a is None and b is True) or (a is True and b is None)


def _rgb_differs(a: Any, b: Any) -> bool:
    return hasattr(a.font.color, "rgb") and hasattr(b.font.color, "rgb") and a.font.color.rgb != b.font.color.rgb


def _bullets(xml: str) -> list[tuple[Any, ...]]:
    out = []
    for paragraph in ET.fromstring(xml).iter(f"{{{A}}}p"):
        ppr = paragraph.find(f"{{{A}}}pPr")
        if ppr is not None:
            level = ppr.get("lvl")
            char_el = ppr.find(f"{{{A}}}buChar")
            char = char_el.get("char") if char_el is not None else "No Bullet"
            colour_el = ppr.find(f"{{{A}}}buClr/{{{A}}}srgbClr")
            colour = colour_el.get("val") if colour_el is not None else "No Color"
        else:
            level, char, colour = "No Level", "No Bullet", "No Color"
        text = "".join([t.text for t in paragraph.iter(f"{{{A}}}t")])  # type: ignore[misc]  # None fails, as OSWorld
        if text.strip():
            out.append((level, char, text, colour))
    return out


def _bullets_equal(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    if len(a) != len(b):
        return False
    for (la, ca, ta, _), (lb, cb, tb, _) in zip(a, b, strict=True):
        if ta != tb or ca != cb or ("0" if la is None else la) != ("0" if lb is None else lb):
            return False
    return True


class _Deck:
    """One comparison of two presentations, with the options in force."""

    def __init__(self, options: dict[str, Any]) -> None:
        get = options.get
        self.tolerance = get("approximately_tolerance", 0.005)
        self.slides = get("examine_number_of_slides", True)
        self.shape = get("examine_shape", True)
        self.text = get("examine_text", True)
        self.indent = get("examine_indent", True)
        self.font_name = get("examine_font_name", True)
        self.font_size = get("examine_font_size", True)
        self.bold = get("examine_font_bold", True)
        self.italic = get("examine_font_italic", True)
        self.rgb = get("examine_color_rgb", True)
        self.underline = get("examine_font_underline", True)
        self.strike = get("examine_strike_through", True)
        self.alignment = get("examine_alignment", True)
        self.title_bottom = get("examine_title_bottom_position", False)
        self.table_bottom = get("examine_table_bottom_position", False)
        self.right = get("examine_right_position", False)
        self.top = get("examine_top_position", False)
        self.shift_size = get("examine_shape_for_shift_size", False)
        self.image_size = get("examine_image_size", False)
        self.modify_height = get("examine_modify_height", False)
        self.bullets = get("examine_bullets", True)
        self.background = get("examine_background_color", True)
        self.note = get("examine_note", True)

    def same_box(self, a: Any, b: Any) -> bool:
        t = self.tolerance
        return (
            _close(a.left, b.left, t)
            and _close(a.top, b.top, t)
            and _close(a.width, b.width, t)
            and _close(a.height, b.height, t)
        )

    def compare(self, prs1: Any, prs2: Any) -> str | None:
        """None when the decks match, else what differs first."""
        if len(prs1.slides) != len(prs2.slides) and self.slides:
            return f"{len(prs1.slides)} slides vs {len(prs2.slides)} expected"
        for n, (s1, s2) in enumerate(zip(prs1.slides, prs2.slides, strict=False), start=1):
            problem = self.slide(n, s1, s2)
            if problem:
                return f"slide {n}: {problem}"
        return None

    def slide(self, n: int, s1: Any, s2: Any) -> str | None:
        if _background(s1) != _background(s2) and self.background:
            return "background colour differs"
        if _notes(s1).strip() != _notes(s2).strip() and self.note:
            return "notes differ"
        text_shapes1, text_shapes2 = _text_shapes(s1.shapes), _text_shapes(s2.shapes)
        if len(s1.shapes) != len(s2.shapes):
            return f"{len(s1.shapes)} shapes vs {len(s2.shapes)} expected"
        for k, (a, b) in enumerate(zip(s1.shapes, s2.shapes, strict=True), start=1):
            problem = self.geometry(n, a, b) or self.table(a, b) or self.texts(a, b)
            if problem:
                return f"shape {k}: {problem}"
        if self.alignment and len(text_shapes1) == len(text_shapes2):
            for a, b in zip(text_shapes1, text_shapes2, strict=True):
                if a.text.strip() != b.text.strip() and self.text:
                    return f"text {short(a.text.strip(), 40)} vs {short(b.text.strip(), 40)}"
                if len(a.text_frame.paragraphs) != len(b.text_frame.paragraphs):
                    return "paragraph count differs in a text shape"
                for pa, pb in zip(a.text_frame.paragraphs, b.text_frame.paragraphs, strict=True):
                    if _aligned(pa) != _aligned(pb):
                        return f"paragraph {short(pa.text, 40)} aligned differently"
        elif len(text_shapes1) != len(text_shapes2):
            return f"{len(text_shapes1)} text shapes vs {len(text_shapes2)} expected"
        return None

    def geometry(self, n: int, a: Any, b: Any) -> str | None:
        """Shape ``a`` of slide ``n`` placed as ``b``. OSWorld's task-specific options relax the box check for
        the one shape their task moves and keep it for the others; they run in OSWorld's order, before and
        after the plain box check, so the first difference reported is the one OSWorld stops at."""
        return (
            self.title_at_bottom(a, b)
            or self.table_at_bottom(n, a, b)
            or self.picture_on_right(n, a, b)
            or self.picture_at_top(n, a, b)
            or self.shift_or_resize(a, b)
            or self.box(a, b)
            or self.picture_size(a, b)
            or self.height(a, b)
        )

    def title_at_bottom(self, a: Any, b: Any) -> str | None:
        """examine_title_bottom_position: the "Product Comparison" title moved down, low on the slide."""
        if not self.title_bottom:
            return None
        if hasattr(a, "text") and hasattr(b, "text") and a.text == b.text:
            if a.text == "Product Comparison" and (a.top <= b.top or a.top < 3600000):
                return "the title is not at the bottom"
        elif not self.same_box(a, b):
            return "position or size differs"
        return None

    def table_at_bottom(self, n: int, a: Any, b: Any) -> str | None:
        """examine_table_bottom_position: the table of slide 3 moved down, low on the slide."""
        if not self.table_bottom:
            return None
        if n == 3 and a.shape_type == TABLE and b.shape_type == TABLE:
            if a.top <= b.top or a.top < 3600000:
                return "the table is not at the bottom"
        elif not self.same_box(a, b):
            return "position or size differs"
        return None

    def picture_on_right(self, n: int, a: Any, b: Any) -> str | None:
        """examine_right_position: the shapes without text of slide 2 moved right, to the right half."""
        right = self.right and n == 2 and not hasattr(a, "text") and not hasattr(b, "text")
        if right and (a.left <= b.left or a.left < 4320000):
            return "the picture is not on the right"
        return None

    def picture_at_top(self, n: int, a: Any, b: Any) -> str | None:
        """examine_top_position: the pictures of slide 2 moved up, near the top."""
        top = self.top and n == 2 and a.shape_type == PICTURE and b.shape_type == PICTURE
        if top and (a.top >= b.top or a.top > 1980000):
            return "the picture is not at the top"
        return None

    def shift_or_resize(self, a: Any, b: Any) -> str | None:
        """examine_shape_for_shift_size: every box kept but the placeholder text's, which the task moves."""
        if self.shift_size and not self.same_box(a, b):
            texts = hasattr(a, "text") and hasattr(b, "text")
            kept = texts and a.text == b.text and a.text == "Elaborate on what you want to discuss."
            if not kept:
                return "position or size differs"
        return None

    def box(self, a: Any, b: Any) -> str | None:
        """examine_shape: position and size within the tolerance."""
        if not self.same_box(a, b) and self.shape:
            return f"box ({a.left}, {a.top}, {a.width}, {a.height}) vs ({b.left}, {b.top}, {b.width}, {b.height})"
        return None

    def picture_size(self, a: Any, b: Any) -> str | None:
        """examine_image_size: pictures only by size (the task resizes them in place), other shapes by box."""
        if not self.image_size:
            return None
        if a.shape_type == PICTURE and b.shape_type == PICTURE:
            t = self.tolerance
            if not _close(a.width, b.width, t) or not _close(a.height, b.height, t):
                return "picture size differs"
        elif not self.same_box(a, b):
            return "position or size differs"
        return None

    def height(self, a: Any, b: Any) -> str | None:
        """examine_modify_height: shapes without text and freeforms only by height, other shapes by box."""
        if not self.modify_height:
            return None
        untexted = not hasattr(a, "text") and not hasattr(b, "text")
        if untexted or (a.shape_type == FREEFORM and b.shape_type == FREEFORM):
            if not _close(a.height, b.height, self.tolerance):
                return "height differs"
        elif not self.same_box(a, b):
            return "position or size differs"
        return None

    def table(self, a: Any, b: Any) -> str | None:
        if a.shape_type != TABLE:
            return None
        t1, t2 = a.table, b.table
        if len(t1.rows) != len(t2.rows) or len(t1.columns) != len(t2.columns):
            return "table dimensions differ"
        for i in range(len(t1.rows)):
            for j in range(len(t1.columns)):
                c1, c2 = t1.cell(i, j), t2.cell(i, j)
                if len(c1.text_frame.paragraphs) != len(c2.text_frame.paragraphs):
                    return f"cell ({i + 1}, {j + 1}) paragraph count differs"
                for p1, p2 in zip(c1.text_frame.paragraphs, c2.text_frame.paragraphs, strict=True):
                    if len(p1.runs) != len(p2.runs):
                        return f"cell ({i + 1}, {j + 1}) run count differs"
                    for r1, r2 in zip(p1.runs, p2.runs, strict=True):
                        if _rgb_differs(r1, r2) and self.rgb:
                            return f"cell ({i + 1}, {j + 1}) colour differs"
                        if _flag_differs(r1.font.bold, r2.font.bold):
                            return f"cell ({i + 1}, {j + 1}) bold differs"
                        if _flag_differs(r1.font.italic, r2.font.italic):
                            return f"cell ({i + 1}, {j + 1}) italic differs"
                        if _underline_differs(r1.font.underline, r2.font.underline):
                            return f"cell ({i + 1}, {j + 1}) underline differs"
        return None

    def texts(self, a: Any, b: Any) -> str | None:
        if not (hasattr(a, "text") and hasattr(b, "text")):
            return None
        if a.text.strip() != b.text.strip() and self.text:
            return f"text {short(a.text.strip(), 40)} vs {short(b.text.strip(), 40)}"
        if len(a.text_frame.paragraphs) != len(b.text_frame.paragraphs):
            return "paragraph count differs"
        for p1, p2 in zip(a.text_frame.paragraphs, b.text_frame.paragraphs, strict=True):
            if self.alignment and _aligned(p1) != _aligned(p2):
                return f"paragraph {short(p1.text, 40)} aligned {p1.alignment}, {p2.alignment} expected"
            if p1.text != p2.text and self.text:
                return f"paragraph {short(p1.text, 40)} vs {short(p2.text, 40)}"
            if p1.level != p2.level and self.indent:
                return f"paragraph {short(p1.text, 40)} at level {p1.level}, {p2.level} expected"
            if len(p1.runs) != len(p2.runs):
                return f"paragraph {short(p1.text, 40)}: {len(p1.runs)} runs vs {len(p2.runs)}"
            for r1, r2 in zip(p1.runs, p2.runs, strict=True):
                problem = self.run(r1, r2)
                if problem:
                    return f"run {short(r1.text, 40)}: {problem}"
        return None

    def run(self, r1: Any, r2: Any) -> str | None:
        f1, f2 = r1.font, r2.font
        if f1.name != f2.name and self.font_name:
            return f"font {f1.name!r} vs {f2.name!r}"
        if f1.size != f2.size and self.font_size:
            return f"size {f1.size} vs {f2.size}"
        if f1.bold != f2.bold and self.bold and _flag_differs(f1.bold, f2.bold):
            return f"bold {f1.bold} vs {f2.bold}"
        if f1.italic != f2.italic and self.italic and _flag_differs(f1.italic, f2.italic):
            return f"italic {f1.italic} vs {f2.italic}"
        if _rgb_differs(r1, r2) and self.rgb:
            return f"colour {f1.color.rgb} vs {f2.color.rgb}"
        if f1.underline != f2.underline and self.underline and _underline_differs(f1.underline, f2.underline):
            return f"underline {f1.underline} vs {f2.underline}"
        strike1 = f1._element.attrib.get("strike", "noStrike")
        if strike1 != f2._element.attrib.get("strike", "noStrike") and self.strike:
            return "strike-through differs"
        if self.bullets:
            try:
                same = _bullets_equal(_bullets(r1.part.blob.decode("utf-8")), _bullets(r2.part.blob.decode("utf-8")))
            except Exception:  # noqa: BLE001  (OSWorld: bullets it cannot read are not compared)
                same = True
            if not same:
                return "the slide's bullets differ"
        return None


def _aligned(paragraph: Any) -> Any:
    from pptx.enum.text import PP_ALIGN

    return PP_ALIGN.LEFT if paragraph.alignment is None else paragraph.alignment


@guarded("compare_pptx_files")
def compare_pptx_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    prs1, prs2 = _presentation(result), _presentation(expected)
    problem = _Deck(options).compare(prs1, prs2)
    if problem:
        return 0.0, problem
    return 1.0, f"{len(prs1.slides)} slides match"


@guarded("check_image_stretch_and_center")
def check_image_stretch_and_center(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from pptx.util import Inches

    original, modified = _presentation(expected), _presentation(result)
    pictures = [s for s in original.slides[0].shapes if s.shape_type == PICTURE]
    candidates = [s for s in modified.slides[0].shapes if s.shape_type == PICTURE]
    if not pictures:
        return 0.0, "the expected deck's first slide has no picture"
    found = None
    for shape in candidates:
        if pictures[0].image.blob == shape.image.blob:
            found = shape
    if found is None:
        return 0.0, "the picture is not on the result's first slide"
    w, h, slack = original.slide_width, original.slide_height, Inches(0.5)
    if (
        abs(found.width - w) > slack
        or abs(found.height - h) > slack
        or abs(found.left - (w - found.width) / 2) > slack
        or abs(found.top - (h - found.height) / 2) > slack
    ):
        return 0.0, f"picture at ({found.left}, {found.top}) sized {found.width}x{found.height}, slide {w}x{h}"
    return 1.0, "the picture fills the slide, centred"


@guarded("check_slide_orientation_Portrait")
def check_slide_orientation_Portrait(result: Any, expected: Any, options: dict[str, Any]) -> Score:  # noqa: N802
    prs = _presentation(result)
    w, h = prs.slide_width, prs.slide_height
    if w < h:
        return 1.0, f"portrait ({w} x {h})"
    return 0.0, f"not portrait ({w} x {h})"


def _rgb_or_none(colour: Any) -> Any:
    try:
        return colour.rgb if hasattr(colour, "rgb") else None
    except Exception:  # noqa: BLE001  (OSWorld: no readable RGB)
        return None


def _fill_distance(slide: Any, rgb: Any, original: Any) -> float:
    fill = slide.background.fill
    if fill.type == 1:
        colour = _rgb_or_none(fill.fore_color)
    elif fill.type == 5:
        master = slide.slide_layout.slide_master.background.fill
        if master.type != 1:
            return 1
        colour = _rgb_or_none(master.fore_color)
    else:
        return 1
    if colour is None:
        return 1
    r1, g1, b1 = colour
    r2, g2, b2 = rgb
    if original is not None:
        r3, g3, b3 = original
        if r1 == r3 and g1 == g3 and b1 == b3:
            return 1
    return math.sqrt((r1 - r2) ** 2 + (g1 - g2) ** 2 + (b1 - b2) ** 2) / math.sqrt(255**2 + 255**2 + 255**2)


@guarded("evaluate_presentation_fill_to_rgb_distance")
def evaluate_presentation_fill_to_rgb_distance(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    rgb, original = expected["rgb"], expected.get("original_rgb")
    prs = _presentation(result)
    distances = [_fill_distance(s, rgb, original) for s in prs.slides]
    score = 1 - sum(distances) / len(distances)
    return score, f"backgrounds {score:.3f} of the way to {rgb}"


@guarded("check_left_panel")
def check_left_panel(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not isinstance(result, str):
        raise NotScored(f"needs the accessibility tree (XML text), got {type(result).__name__}")
    root = ET.fromstring(result)
    for frame in root.iter("document-frame"):
        if frame.attrib.get("name") == "Slides View":
            return 1.0, "the slide panel is open"
    return 0.0, "no 'Slides View' in the accessibility tree: the slide panel is closed"


@guarded("check_transition")
def check_transition(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    index, kind = expected["slide_idx"], expected["transition_type"]
    path = file_arg(result)
    if path is None:
        raise NotScored("no result file")
    with zipfile.ZipFile(path) as z:
        name = f"ppt/slides/slide{index + 1}.xml"
        try:
            z.getinfo(name)
        except KeyError:
            return 0.0, f"no slide {index + 1}"
        with z.open(name) as f:
            root = ET.parse(f).getroot()
    transition = root.find(f".//{{{P}}}transition")
    if transition is None:
        return 0.0, f"slide {index + 1} has no transition"
    if transition.find(f".//{{{P}}}{kind}") is None:
        return 0.0, f"slide {index + 1}'s transition is not {kind!r}"
    return 1.0, f"slide {index + 1} has a {kind!r} transition"


def _channels(value: str) -> tuple[int, int, int]:
    return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)


_COLOURS = {
    "red": lambda r, g, b: r > g + 50 and r > b + 50,
    "blue": lambda r, g, b: b > g + 50 and b > r + 50,
    "green": lambda r, g, b: g > r + 50 and g > b + 50,
    "black": lambda r, g, b: r < 50 and g < 50 and b < 50,
}


@guarded("check_page_number_colors")
def check_page_number_colors(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    colour = expected["color"]
    path = file_arg(result)
    if path is None:
        raise NotScored("no result file")
    with zipfile.ZipFile(path) as z, z.open("ppt/slideMasters/slideMaster1.xml") as f:
        root = ET.parse(f).getroot()
    values = root.findall(f".//{{{A}}}solidFill//{{{A}}}srgbClr")
    value = values[-2].get("val")
    if value is None:
        return 0.0, "the page number has no RGB colour"
    test = _COLOURS.get(colour)
    if test is not None and not test(*_channels(value)):
        return 0.0, f"the page number colour {value} is not {colour}"
    return 1.0, f"the page number colour {value} is {colour}"


METRICS = {
    "compare_pptx_files": compare_pptx_files,
    "check_image_stretch_and_center": check_image_stretch_and_center,
    "check_slide_orientation_Portrait": check_slide_orientation_Portrait,
    "evaluate_presentation_fill_to_rgb_distance": evaluate_presentation_fill_to_rgb_distance,
    "check_left_panel": check_left_panel,
    "check_transition": check_transition,
    "check_page_number_colors": check_page_number_colors,
}
# Python modules each metric needs on the host, with the package that provides them (the ``office`` extra).
NEEDS = {name: (("pptx", "python-pptx"),) for name in METRICS if name != "check_left_panel"}
