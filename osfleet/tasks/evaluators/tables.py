"""``compare_table``: a spreadsheet the agent saved against the expected one (xlsx, read with openpyxl).

Semantics, as OSWorld documents them: ``options.rules`` is a list of checks, all of which must hold:
- ``sheet_data``: the cell values of two sheets are equal (formulas count by their saved values, as a
  spreadsheet application stores them; trailing empty rows and columns do not count);
- ``sheet_print``: the two sheets print the same: each cell as it is displayed (its number format applied:
  decimals, thousands separators, percentages, dates), so 0.5 shown as ``50%`` equals ``50%`` typed as text;
- ``sheet_name``: the workbooks have the same sheet names in the same order.
A sheet is named ``RI<n>``/``EI<n>`` (the n-th sheet of the result/expected workbook, from 0) or
``RN<name>``/``EN<name>`` (by name); ``sheet_idx0`` defaults to ``RI0`` and ``sheet_idx1`` to ``EI0``.
Without rules every sheet is compared by name and data.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import zipfile
from pathlib import Path
from typing import Any

Score = tuple[float, str]


def _load(path: Any, values: bool) -> Any:
    """The workbook in ``path``, whatever its name (openpyxl judges names, not contents; a getter's file may be
    named after a URL or a ``dest`` without an extension)."""
    from openpyxl import load_workbook

    if not isinstance(path, Path):
        raise TypeError(f"compare_table needs spreadsheet files, got {type(path).__name__}")
    return load_workbook(io.BytesIO(path.read_bytes()), data_only=values, read_only=False)


def _sheet(ref: str, result: Any, expected: Any) -> Any:
    m = re.fullmatch(r"([RE])([IN])(.+)", ref)
    if not m:
        raise ValueError(f"bad sheet reference {ref!r} (RI0, EI0, RNname, ENname)")
    book = result if m.group(1) == "R" else expected
    if m.group(2) == "I":
        return book.worksheets[int(m.group(3))]
    return book[m.group(3)]


def _trimmed(rows: list[list[Any]]) -> list[list[Any]]:
    """Drop trailing empty cells of each row and trailing empty rows: they are not data."""
    out = []
    for row in rows:
        row = list(row)
        while row and row[-1] in (None, ""):
            row.pop()
        out.append(row)
    while out and not out[-1]:
        out.pop()
    return out


MAX_CELLS = 10_000_000
_NO_CELL = type("NoCell", (), {"value": None, "number_format": "General"})()


def _rows(ws: Any) -> list[list[Any]]:
    """The sheet's rows, each up to its last real cell: ``iter_rows`` walks (and creates) every cell of the
    sheet's extent, 17 billion for one value in XFD1048576; an extent over ``MAX_CELLS`` is refused (pandas,
    which OSWorld reads sheets with, would walk it all too)."""
    if ws.max_row * ws.max_column > MAX_CELLS:
        raise ValueError(f"sheet {ws.title!r} spans {ws.max_row} x {ws.max_column} cells, too many to read")
    by_row: dict[int, dict[int, Any]] = {}
    for (r, c), cell in ws._cells.items():
        by_row.setdefault(r, {})[c] = cell
    return [
        [by_row.get(r, {}).get(c, _NO_CELL) for c in range(1, max(by_row.get(r, {0: None})) + 1)]
        for r in range(1, max(by_row, default=0) + 1)
    ]


def sheet_values(ws: Any) -> list[list[Any]]:
    return _trimmed([[c.value for c in row] for row in _rows(ws)])


def _general(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.10g}"


def display(value: Any, number_format: str) -> str:
    """A cell's value as a spreadsheet shows it, for the common number formats (others as General)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        fmt = number_format.lower()
        if isinstance(value, dt.datetime) and not any(t in fmt for t in ("h", "s")):
            value = value.date()
        return value.isoformat()
    if not isinstance(value, int | float):
        return str(value)
    fmt = number_format.split(";")[0]
    fmt = re.sub(r'"[^"]*"|\[[^\]]*\]|\\.', "", fmt)  # literal text, colours and escapes do not change digits
    if fmt in ("", "General", "@"):
        return _general(value)
    m = re.search(r"(#,##)?0(?:\.(0+))?(%)?", fmt)
    if not m:
        return _general(value)
    decimals = len(m.group(2) or "")
    number = value * 100 if m.group(3) else value
    text = f"{number:,.{decimals}f}" if m.group(1) else f"{number:.{decimals}f}"
    return text + ("%" if m.group(3) else "")


def sheet_printed(ws: Any) -> list[list[str]]:
    return _trimmed([[display(c.value, c.number_format) for c in row] for row in _rows(ws)])


def _rule(rule: dict[str, Any], books: dict[str, tuple[Any, Any]]) -> tuple[bool, str]:
    kind = rule.get("type")
    if kind == "sheet_name":
        a, b = books["values"]
        return a.sheetnames == b.sheetnames, f"sheet names {a.sheetnames} vs {b.sheetnames}"
    if kind not in ("sheet_data", "sheet_print"):
        raise ValueError(f"unsupported compare_table rule {kind!r} (supported: sheet_data, sheet_print, sheet_name)")
    ref0, ref1 = rule.get("sheet_idx0", "RI0"), rule.get("sheet_idx1", "EI0")
    result, expected = books["values"]
    s0, s1 = _sheet(ref0, result, expected), _sheet(ref1, result, expected)
    read = sheet_values if kind == "sheet_data" else sheet_printed
    a, b = read(s0), read(s1)
    if a == b:
        return True, f"{kind} {ref0} == {ref1}"
    for r, (row_a, row_b) in enumerate(zip(a + [[]] * len(b), b + [[]] * len(a), strict=False)):
        if row_a != row_b:
            return False, f"{kind} {ref0} != {ref1}: row {r + 1} {row_a[:6]} vs {row_b[:6]}"
    return False, f"{kind} {ref0} != {ref1}"


def compare_table(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    if expected is None:
        return 0.0, "no expected file"
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        books = {"values": (_load(result, values=True), _load(expected, values=True))}
    except (OSError, KeyError, zipfile.BadZipFile, InvalidFileException) as exc:
        return 0.0, f"not a spreadsheet openpyxl can read: {exc}"
    rules = options.get("rules")
    if rules is None:
        a, b = books["values"]
        rules = [{"type": "sheet_name"}] + [
            {"type": "sheet_data", "sheet_idx0": f"RI{i}", "sheet_idx1": f"EI{i}"}
            for i in range(min(len(a.worksheets), len(b.worksheets)))
        ]
    if not isinstance(rules, list):
        raise TypeError("compare_table options.rules must be a list")
    for rule in rules:
        ok, detail = _rule(rule, books)
        if not ok:
            return 0.0, detail
    return 1.0, f"{len(rules)} rule(s) hold"
