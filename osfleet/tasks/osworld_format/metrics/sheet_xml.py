"""A cell's value as the sheet's XML stores it, the way OSWorld reads it for ``sheet_fuzzy``, ``check_cell``
and conditional formatting (not through openpyxl's cell model).

OSWorld's semantics, which scores depend on:
- the sheet part is ``xl/worksheets/sheet<sheetId>.xml``, with the ``sheetId`` that ``xl/workbook.xml`` gives
  the sheet's name (not the relationship target);
- the first ``<c r="A1">`` inside a ``<row>`` is the cell; none is ``None``;
- by the cell's ``t``: none or ``n`` a float; ``s`` the shared string (the concatenated ``<t>`` texts of its
  ``<si>``: when any ``<t>`` of the table is empty, no shared string can be read and an index raises);
  ``str`` and ``e`` the ``<v>`` text; ``inlineStr`` the ``<is><t>`` text; anything else ``None``;
- texts read from ``<v>``/``<is><t>`` are whitespace-stripped, and empty ones are ``None``; an element with
  attributes is a dict of them (``@name``) and its text (``#text``);
- a missing file, a file that is not a zip, a missing sheet or part: ``None``. A ``<v>`` that is not a
  number where one is needed raises ``NotScored`` where OSWorld raises, and is ``None`` where it does not.

Each workbook is parsed once per metric call (OSWorld reopens it per cell, with the same result).
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored

MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_PREFIXES = {
    MAIN: None,
    "http://schemas.microsoft.com/office/spreadsheetml/2009/9/main": "x14",
    "http://schemas.microsoft.com/office/excel/2006/main": "xm",
}
_MISSING = object()


def _key(qname: str) -> str:
    if qname.startswith("{"):
        uri, _, local = qname[1:].partition("}")
        prefix = _PREFIXES.get(uri, uri)
        return local if prefix is None else f"{prefix}:{local}"
    return qname


def _parent_is(elem: Any, local: str) -> bool:
    parent = elem.getparent()
    return parent is not None and parent.tag == f"{{{MAIN}}}{local}"


def as_dict_value(elem: Any) -> Any:
    """The element as a generic XML-to-dict conversion gives it (attributes ``@``, children, ``#text``)."""
    if not isinstance(elem.tag, str):
        return None
    if not elem.attrib and len(elem) == 0:
        return (elem.text or "").strip() or None
    out: dict[str, Any] = {f"@{_key(k)}": v for k, v in elem.attrib.items()}
    for child in elem:
        if not isinstance(child.tag, str):
            continue
        key, value = _key(child.tag), as_dict_value(child)
        if key in out:
            previous = out[key]
            out[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            out[key] = value
    text = "".join(t for t in [elem.text, *(c.tail for c in elem)] if t).strip()
    if text:
        out["#text"] = text
    return out


def _child(elem: Any, local: str) -> Any:
    """``dict[local]`` of the element's conversion: one child, a list of several, or ``_MISSING``."""
    found = [as_dict_value(c) for c in elem if c.tag == f"{{{MAIN}}}{local}"]
    if not found:
        return _MISSING
    return found[0] if len(found) == 1 else found


def _float(v: Any) -> float:
    if v is _MISSING:
        raise KeyError("v")
    if not isinstance(v, str):
        raise NotScored(f"a number cell without a readable value ({type(v).__name__})")
    return float(v)


class RawCells:
    """Cell values of one workbook file, read from its XML parts."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._strings: list[str] | None = None
        self._ids: dict[str, str | None] | None = None
        self._sheets: dict[str, dict[str, Any] | None] = {}
        self._broken = False

    def _load_common(self, z: zipfile.ZipFile) -> None:
        from lxml import etree

        if self._strings is None:
            try:
                root = etree.fromstring(z.read("xl/sharedStrings.xml"))
                items = [si for si in root.iter(f"{{{MAIN}}}si") if _parent_is(si, "sst")]
                strings = []
                for si in items:
                    texts = [t.text for t in si.iter(f"{{{MAIN}}}t")]
                    if any(t is None for t in texts):
                        raise ValueError("an empty text in the shared strings")
                    strings.append("".join(texts))
                self._strings = strings
            except Exception:  # noqa: BLE001  (OSWorld: no shared strings at all)
                self._strings = []
        if self._ids is None:
            root = etree.fromstring(z.read("xl/workbook.xml"))
            ids: dict[str, str | None] = {}
            for sheet in root.iter(f"{{{MAIN}}}sheet"):
                if _parent_is(sheet, "sheets"):
                    ids[sheet.get("name")] = sheet.get("sheetId")
            self._ids = ids

    def _cells(self, sheet: str) -> dict[str, Any] | None:
        if sheet in self._sheets:
            return self._sheets[sheet]
        from lxml import etree

        cells: dict[str, Any] | None = None
        try:
            with zipfile.ZipFile(str(self.path)) as z:
                self._load_common(z)
                assert self._ids is not None
                root = etree.fromstring(z.read(f"xl/worksheets/sheet{self._ids[sheet]}.xml"))
            cells = {}
            for c in root.iter(f"{{{MAIN}}}c"):
                r = c.get("r")
                if r is not None and r not in cells and _parent_is(c, "row"):
                    cells[r] = c
        except Exception:  # noqa: BLE001  (OSWorld: a file, sheet or part it cannot read is no value)
            cells = None
        self._sheets[sheet] = cells
        return cells

    def value(self, sheet: str, coordinate: str) -> Any:
        if not self.path or not os.path.exists(self.path):
            return None
        cells = self._cells(sheet)
        if cells is None or coordinate not in cells:
            return None
        c = cells[coordinate]
        kind = c.get("t")
        try:
            if kind is None or kind == "n":
                return _float(_child(c, "v"))
            if kind == "s":
                v = _child(c, "v")
                if v is _MISSING:
                    raise KeyError("v")
                if not isinstance(v, str):
                    raise NotScored("a shared-string cell without an index")
                index = int(v)
                strings = self._strings or []
                if not -len(strings) <= index < len(strings):
                    raise NotScored(f"shared string {index} does not exist")
                return strings[index]
            if kind in ("str", "e"):
                v = _child(c, "v")
                if v is _MISSING:
                    raise KeyError("v")
                return v
            if kind == "inlineStr":
                inline = _child(c, "is")
                if inline is _MISSING:
                    raise KeyError("is")
                if not isinstance(inline, dict):
                    raise NotScored("an inline-string cell without text")
                return inline["t"]
        except (KeyError, ValueError):
            return None
        return None
