"""``compare_table``: a spreadsheet the agent saved against the expected one, rule by rule; and
``compare_conference_city_in_order``.

Semantics, as OSWorld's (desktop-env 1.0.2 ``table.py``), rule by rule in ``options.rules``; the first rule
that fails scores 0, a rule type it does not know, or a rule that cannot be read, scores 0 too:
- both files open with openpyxl (formulas kept) and pandas, or the score is 0;
- sheets are named by ``sheet_idx0``/``sheet_idx1``/``sheet_idx``: an int is the n-th sheet of the *result*
  (whichever key it is in); ``RI<n>``/``EI<n>`` the n-th sheet of the result/expected workbook, ``RN<name>``/
  ``EN<name>`` a sheet by name; an index out of range names no sheet;
- ``sheet_name``: the two workbooks' worksheet names are equal, in order;
- ``sheet_data``: the two sheets read by pandas (first row as header, cached formula values) and rounded to
  ``precision`` decimals (default 4) are equal, dtypes included;
- ``sheet_print``: the CSV files LibreOffice exported beside each workbook, ``<workbook without
  extension>-<sheet name>.csv``, have the same lines (each stripped, trailing empty lines dropped; option
  ``ignore_case``); a missing CSV of the first sheet scores 0;
- ``sheet_fuzzy``: cell by cell over ``rules[].range``, the cells' XML values (see ``sheet_xml``) as text,
  after ``normalization`` (replacements), ``trim_leadings``/``trim_trailings``, ``ignore_chars`` and
  ``ignore_case``: ``exact_match``, ``includes`` (first contains second), ``included_by`` or
  ``fuzzy_match`` (similarity >= ``threshold``, default 85);
- ``chart``, ``pivot_table``, ``style`` (with conditional formats), ``row_props``/``col_props``: the sheets'
  charts, pivot tables, cell styles or dimensions with the asked properties are equal (``sheet_features``);
- ``freeze``: the same frozen panes; ``zoom``: the sheet's zoom (100 when unset) meets ``method``/``ref``;
- ``data_validation``: the sheet has at least as many validations as ``dv_props``, and each validation meets
  every ``{attribute: {"method", "ref"}}`` of one of them;
- ``check_cell``: the cell at ``coordinate`` meets every ``props`` rule (``value`` is its XML value, the
  rest its style); a cell or sheet that cannot be read scores 0.
OSWorld's ``sparkline`` and ``filter`` rules, which no task file uses, are refused (score 0, named).
Where osfleet can differ: a ``style`` rule on a sheet over ``sheet_features.MAX_STYLED_CELLS`` cells scores 0
(OSWorld would touch every cell); the order in which a conditional format's ranges are visited (a set) can
differ between processes, which matters only past 50 empty cells in one format.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from osfleet.tasks.osworld_format.metrics import sheet_features as features
from osfleet.tasks.osworld_format.metrics.common import NotScored, Score, file_arg, fuzz_ratio, guarded, short
from osfleet.tasks.osworld_format.metrics.sheet_xml import RawCells
from osfleet.tasks.osworld_format.metrics.sheets_csv import read_lines

_NO_SHEET = ""
MAX_CELLS = 10_000_000  # one value in XFD1048576 makes pandas walk 17 billion cells


class _Workbooks:
    """The two files, each as openpyxl and pandas read them, with the raw XML values on demand."""

    def __init__(self, result: str, expected: str | None) -> None:
        import openpyxl
        import pandas as pd

        self.paths = {"R": result, "E": expected}
        self.frames: dict[str, Any] = {}
        self.books: dict[str, Any] = {}
        self.names: dict[str, list[str] | None] = {"R": None, "E": None}
        try:
            self.books["R"] = openpyxl.load_workbook(filename=result)
            self.frames["R"] = pd.ExcelFile(result)
        except Exception as exc:  # noqa: BLE001  (any file openpyxl or pandas cannot open)
            self.close()
            raise NotScored(f"the result is not a workbook openpyxl and pandas can open ({short(str(exc))})") from None
        self.names["R"] = list(self.frames["R"].sheet_names)
        if expected is not None:
            try:
                self.books["E"] = openpyxl.load_workbook(filename=expected)
                self.frames["E"] = pd.ExcelFile(expected)
            except Exception as exc:  # noqa: BLE001
                self.close()
                raise NotScored(f"the expected file cannot be opened ({short(str(exc))})") from None
            self.names["E"] = list(self.frames["E"].sheet_names)
        self._raw: dict[str, RawCells] = {}

    def close(self) -> None:
        for frame in self.frames.values():
            frame.close()

    def sheet(self, ref: Any) -> tuple[str, str]:
        """Which workbook (``R``/``E``) and which sheet name a sheet reference means."""
        if isinstance(ref, int):
            names: list[str] = self.names["R"] or []
            return "R", names[ref] if -len(names) <= ref < len(names) else _NO_SHEET
        if not isinstance(ref, str) or ref[:2] not in ("RI", "RN", "EI", "EN"):
            raise NotScored(f"unrecognised sheet reference {ref!r} (0, RI0, EI0, RNname, ENname)")
        side, how, rest = ref[0], ref[1], ref[2:]
        if how == "N":
            return side, rest
        try:
            return side, self.names[side][int(rest)]  # type: ignore[index]
        except (TypeError, ValueError, IndexError):
            return side, _NO_SHEET

    def book(self, side: str) -> Any:
        if side not in self.books:
            raise NotScored("the rule names the expected workbook, but there is none")
        return self.books[side]

    def raw(self, side: str) -> RawCells:
        if self.paths[side] is None:
            raise NotScored("the rule names the expected workbook, but there is none")
        if side not in self._raw:
            self._raw[side] = RawCells(self.paths[side])
        return self._raw[side]

    def worksheet(self, ref: Any) -> Any:
        """The openpyxl worksheet, or None when there is no such sheet."""
        side, name = self.sheet(ref)
        try:
            return self.book(side)[name]
        except KeyError:
            return None

    def frame(self, ref: Any) -> Any:
        side, name = self.sheet(ref)
        if side not in self.frames:
            raise NotScored("the rule names the expected workbook, but there is none")
        ws = self.worksheet(ref)  # openpyxl's extent counts real cells; pandas walks every cell inside it
        if ws is not None and ws.max_row * ws.max_column > MAX_CELLS:
            raise NotScored(f"sheet {name!r} spans {ws.max_row} x {ws.max_column} cells, too many to read")
        import pandas as pd

        try:
            return pd.read_excel(self.frames[side], name)
        except Exception:  # noqa: BLE001  (OSWorld: a sheet pandas cannot read is no sheet)
            return None

    def printed(self, ref: Any) -> list[str] | None:
        """The lines of the CSV exported beside the workbook for that sheet, trailing empty lines dropped."""
        side, name = self.sheet(ref)
        path = self.paths[side]
        if path is None:
            raise NotScored("the rule names the expected workbook, but there is none")
        try:
            lines = [line.strip() for line in read_lines(f"{os.path.splitext(path)[0]}-{name}.csv")]
        except OSError:
            return None
        while lines and not lines[-1]:
            lines.pop()
        return lines


Rule = dict[str, Any]


def _sheet_name(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    a, b = wb.names["R"], wb.names["E"]
    return a == b, f"sheet names {a} vs {b}"


def _sheet_data(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    precision = rule.get("precision", 4)
    first = wb.frame(rule["sheet_idx0"])
    if first is None:
        return False, f"no sheet {rule['sheet_idx0']!r}"
    second = wb.frame(rule["sheet_idx1"])
    if second is None:
        raise NotScored(f"no sheet {rule['sheet_idx1']!r}")
    same = bool(first.round(precision).equals(second.round(precision)))
    return same, f"values {'equal' if same else 'differ'} ({first.shape} vs {second.shape})"


def _sheet_print(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    first = wb.printed(rule["sheet_idx0"])
    if first is None:
        return False, f"no exported CSV for sheet {rule['sheet_idx0']!r} beside the result"
    second = wb.printed(rule["sheet_idx1"])
    if rule.get("ignore_case", False):
        if second is None:
            raise NotScored(f"no exported CSV for sheet {rule['sheet_idx1']!r}")
        first, second = [x.lower() for x in first], [x.lower() for x in second]
    if first == second:
        return True, f"{len(first)} printed lines equal"
    if second is None:
        return False, f"no exported CSV for sheet {rule['sheet_idx1']!r}"
    for i, (x, y) in enumerate(zip(first + [""] * len(second), second + [""] * len(first), strict=False)):
        if x != y:
            return False, f"printed line {i + 1}: {short(x)} vs {short(y)}"
    return False, "printed lines differ"


def _normalised(text: str, rule: Rule) -> str:
    for pair in rule.get("normalization", []):
        text = text.replace(pair[0], pair[1])
    if "trim_leadings" in rule:
        text = text.lstrip(rule["trim_leadings"])
    if "trim_trailings" in rule:
        text = text.rstrip(rule["trim_trailings"])
    if "ignore_chars" in rule:
        ignored = set(rule["ignore_chars"])
        text = "".join(ch for ch in text if ch not in ignored)
    if rule.get("ignore_case", False):
        text = text.lower()
    return text


def _fuzzy_cell(kind: str, a: str, b: str, rule: Rule) -> bool:
    if kind == "includes":
        return b in a
    if kind == "included_by":
        return a in b
    if kind == "fuzzy_match":
        return fuzz_ratio(a, b) >= rule.get("threshold", 85.0)
    if kind == "exact_match":
        return a == b
    raise NotScored(f"unknown sheet_fuzzy type {kind!r}")


def _sheet_fuzzy(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import MultiCellRange

    (side0, name0), (side1, name1) = wb.sheet(rule["sheet_idx0"]), wb.sheet(rule["sheet_idx1"])
    raw0, raw1 = wb.raw(side0), wb.raw(side1)
    failed: list[str] = []
    for sub in rule["rules"]:
        for cell_range in MultiCellRange(sub["range"]):
            for row, col in cell_range.cells:
                coordinate = f"{get_column_letter(col)}{row}"
                a = _normalised(str(raw0.value(name0, coordinate)), sub)
                b = _normalised(str(raw1.value(name1, coordinate)), sub)
                if not _fuzzy_cell(sub["type"], a, b, sub) and not failed:
                    failed.append(f"{coordinate} {short(a, 40)} vs {short(b, 40)} ({sub['type']})")
    return not failed, failed[0] if failed else "every fuzzy cell rule holds"


def _features(read: Callable[[Any, str], Any]) -> Callable[[Rule, _Workbooks], tuple[bool, str]]:
    def check(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
        (side0, name0), (side1, name1) = wb.sheet(rule["sheet_idx0"]), wb.sheet(rule["sheet_idx1"])
        a, b = read(wb.book(side0), name0), read(wb.book(side1), name1)
        return a == b, f"{rule['type']} {'equal' if a == b else 'differ'}: {short(a, 100)} vs {short(b, 100)}"

    return check


def _style(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    props = rule.get("props", [])
    (side0, name0), (side1, name1) = wb.sheet(rule["sheet_idx0"]), wb.sheet(rule["sheet_idx1"])
    a = features.styles(wb.book(side0), name0, str(wb.paths[side0]), props)
    b = features.styles(wb.book(side1), name1, str(wb.paths[side1]), props)
    if a == b:
        return True, f"styles {props} equal over {len(a)} cells"
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return False, f"styles {props} differ at {', '.join(diff[:5])}" if diff else "styles differ"


def _freeze(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    first = wb.worksheet(rule["sheet_idx0"])
    if first is None:
        return False, f"no sheet {rule['sheet_idx0']!r}"
    second = wb.worksheet(rule["sheet_idx1"])
    if second is None:
        raise NotScored(f"no sheet {rule['sheet_idx1']!r}")
    a, b = first.freeze_panes, second.freeze_panes
    return a == b, f"frozen panes {a} vs {b}"


def _zoom(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    ws = wb.worksheet(rule["sheet_idx"])
    if ws is None:
        return False, f"no sheet {rule['sheet_idx']!r}"
    zoom = ws.sheet_view.zoomScale or 100.0
    ok = features.matches(zoom, rule)
    return ok, f"zoom {zoom} {rule['method']} {rule['ref']}: {ok}"


def _data_validation(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    ws = wb.worksheet(rule["sheet_idx"])
    if ws is None:
        return False, f"no sheet {rule['sheet_idx']!r}"
    validations, wanted = ws.data_validations.dataValidation, rule["dv_props"]
    if len(validations) < len(wanted):
        return False, f"{len(validations)} data validation(s), {len(wanted)} wanted"
    for dv in validations:
        if not any(all(features.matches(getattr(dv, a), m) for a, m in p.items()) for p in wanted):
            return False, f"data validation on {dv.sqref} matches none of {short(wanted)}"
    return True, f"{len(validations)} data validation(s) match"


def _check_cell(rule: Rule, wb: _Workbooks) -> tuple[bool, str]:
    try:
        side, name = wb.sheet(rule["sheet_idx"])
        ws = wb.worksheet(rule["sheet_idx"])
        if ws is None:
            return False, f"no sheet {rule['sheet_idx']!r}"
        coordinate = rule["coordinate"]
        cell = ws[coordinate]
        for prop, check in rule["props"].items():
            try:
                value = wb.raw(side).value(name, coordinate) if prop == "value" else features.cell_style(prop, cell)
            except Exception:  # noqa: BLE001  (OSWorld: a value it cannot read is None)
                value = None
            if not features.matches(value, check):
                return False, f"{coordinate} {prop} = {short(value)}, wanted {check.get('method')} {check.get('ref')!r}"
    except Exception as exc:  # noqa: BLE001  (OSWorld: a cell rule that cannot be checked scores 0)
        return False, f"cannot check cell ({type(exc).__name__}: {short(str(exc))})"
    return True, f"{rule['coordinate']} meets {list(rule['props'])}"


RULES: dict[str, Callable[[Rule, _Workbooks], tuple[bool, str]]] = {
    "sheet_name": _sheet_name,
    "sheet_data": _sheet_data,
    "sheet_print": _sheet_print,
    "sheet_fuzzy": _sheet_fuzzy,
    "chart": lambda r, wb: _features(lambda b, s: features.charts(b, s, set(r.get("chart_props", []))))(r, wb),
    "pivot_table": lambda r, wb: _features(lambda b, s: features.pivots(b, s, set(r.get("pivot_props", []))))(r, wb),
    "style": _style,
    "freeze": _freeze,
    "zoom": _zoom,
    "data_validation": _data_validation,
    "row_props": lambda r, wb: _features(lambda b, s: features.dimensions(b, s, "row", r.get("props", [])))(r, wb),
    "col_props": lambda r, wb: _features(lambda b, s: features.dimensions(b, s, "column", r.get("props", [])))(r, wb),
    "check_cell": _check_cell,
}


@guarded("compare_table")
def compare_table(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    path = file_arg(result)
    if path is None:
        return 0.0, "no result file"
    if not os.path.exists(path):
        return 0.0, f"no result file {os.path.basename(path)}"
    rules = options.get("rules")
    wb = _Workbooks(path, file_arg(expected))
    try:
        if not isinstance(rules, list):
            raise NotScored("options.rules must be a list of rules")
        for rule in rules:
            kind = rule.get("type")
            if kind not in RULES:
                raise NotScored(f"unsupported rule type {kind!r} (supported: {', '.join(RULES)})")
            ok, detail = RULES[kind](rule, wb)
            if not ok:
                return 0.0, detail
    finally:
        wb.close()
    return 1.0, f"{len(rules)} rule(s) hold"


CITY_RANGE = "C2:C22"


@guarded("compare_conference_city_in_order")
def compare_conference_city_in_order(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    """Cities in C2:C22 of the active sheet, in order: each contains its expected name (or one of a list of
    names); a cell that is not text, or a list shorter than the column, scores 0."""
    import openpyxl

    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    wanted = expected["expected"]
    path = file_arg(result)
    if path is None:
        raise NotScored("no result file")
    ws = openpyxl.load_workbook(path).active
    cities = [cell.value for row in ws[CITY_RANGE] for cell in row]
    try:
        for i, city in enumerate(cities):
            names = wanted[i]
            if isinstance(names, str):
                names = [names]
            elif not isinstance(names, list):
                raise NotScored("an expected city must be a string or a list of strings")
            if not any(name in city for name in names):
                return 0.0, f"row {i + 2}: {short(city)} is not {short(wanted[i])}"
    except NotScored:
        raise
    except Exception as exc:  # noqa: BLE001  (OSWorld: a cell it cannot compare scores 0)
        return 0.0, f"cannot compare ({type(exc).__name__})"
    return 1.0, f"{len(cities)} cities in order"


METRICS = {"compare_table": compare_table, "compare_conference_city_in_order": compare_conference_city_in_order}
# Python modules each metric needs on the host, with the package that provides them (the ``office`` extra).
NEEDS = {
    "compare_table": tuple((m, m) for m in ("openpyxl", "pandas", "rapidfuzz", "formulas")),
    "compare_conference_city_in_order": (("openpyxl", "openpyxl"),),
}
