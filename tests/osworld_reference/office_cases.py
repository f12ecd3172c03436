"""Differential cases of OSWorld's office metrics (``table.py``, ``docs.py``, ``slides.py``, ``pdf.py`` and the
office ones of ``general.py``, ``chrome.py``, ``gimp.py``): matching files, near misses (one cell, one style,
one run, one slide), broken and missing files, and the shapes of the benchmark's own task files.

``UNCHECKED`` lists the office metrics of the benchmark's task files that have no case here, with the reason;
``SHIMMED`` those whose reference runs with a working stand-in for an import this machine cannot install.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.osworld_reference.cases import NO_EXPECTED, Inputs, Registry
from tests.osworld_reference.office_files import (
    BROKEN,
    deck,
    document,
    exported_csv,
    odt,
    paragraphs,
    pdf,
    png,
    text,
    xcu,
    xlsx,
)

REGISTRY = Registry()
add = REGISTRY.add

UNCHECKED = {
    "contains_mp4_video": "named by one task file (f0a334af, not in test_all.json) but not defined in desktop-env "
    "1.0.2: OSWorld itself cannot score that task; osfleet refuses it",
}
SHIMMED = {
    "compare_pdfs": "OSWorld extracts text with PyMuPDF (fitz), not on this machine's package index: the reference "
    "runs with shim_fitz.py (pypdf's text), so the cases check OSWorld's pairing, averaging and failure handling, "
    "not PyMuPDF's text extraction",
}


def _broken_cases(metric: str, module: str, suffix: str, good: Callable[[Path], Path], expected: Any = None) -> None:
    """Missing, empty, non-zip and truncated results (and a broken expected file when ``expected`` is None)."""

    def missing(d: Path) -> Inputs:
        return None, good(d / f"gold{suffix}") if expected is None else expected, {}

    add(metric, module, "missing-result", missing)
    for kind, data in BROKEN.items():

        def broken(d: Path, data: bytes = data) -> Inputs:
            exp = good(d / f"gold{suffix}") if expected is None else expected
            return text(d / f"result{suffix}", data), exp, {}

        add(metric, module, f"{kind}-result", broken)
        if expected is None:

            def broken_expected(d: Path, data: bytes = data) -> Inputs:
                return good(d / f"result{suffix}"), text(d / f"gold{suffix}", data), {}

            add(metric, module, f"{kind}-expected", broken_expected)


# --------------------------------------------------------------------------------------------- compare_table
SALES: list[list[Any]] = [["Item", "Qty", "Price"], ["pen", 3, 1.5], ["ink", 2, 4.25], ["pad", 10, 0.99]]


def _table(name: str, result: Any, expected: Any, rules: list[dict[str, Any]] | None, **kw: Any) -> None:
    """A compare_table case: ``result``/``expected`` are rows, {sheet: rows}, or callables making the file."""

    def build(d: Path) -> Inputs:
        paths = []
        for side, spec in (("result", result), ("gold", expected)):
            if spec is None:
                paths.append(None)
            elif callable(spec):
                paths.append(spec(d / f"{side}.xlsx"))
            else:
                paths.append(xlsx(d / f"{side}.xlsx", spec, kw.get(f"{side}_edit")))
        for side, sheet, lines in kw.get("csvs", []):
            exported_csv(d / f"{side}.xlsx", sheet, lines)
        return paths[0], NO_EXPECTED if expected is None else paths[1], {} if rules is None else {"rules": rules}

    add("compare_table", "table", name, build)


def _cells(rows: list[list[Any]], row: int, col: int, value: Any) -> list[list[Any]]:
    out = [list(r) for r in rows]
    out[row][col] = value
    return out


DATA0 = [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
_table("data-equal-int-index", SALES, SALES, DATA0)
_table("data-equal-RI", SALES, SALES, [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}])
_table("data-one-cell-differs", _cells(SALES, 2, 1, 3), SALES, DATA0)
_table("data-float-noise-under-precision", _cells(SALES, 1, 2, 1.50001), SALES, DATA0)
_table("data-float-noise-over-precision", _cells(SALES, 1, 2, 1.5001), SALES, DATA0)
_table(
    "data-precision-2",
    _cells(SALES, 1, 2, 1.501),
    SALES,
    [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0", "precision": 2}],
)
_table("data-number-as-text", _cells(SALES, 1, 1, "3"), SALES, DATA0)
_table("data-int-vs-float-column", _cells(SALES, 1, 1, 3.5), SALES, DATA0)
_table("data-header-differs", _cells(SALES, 0, 0, "item"), SALES, DATA0)
_table("data-extra-row", [*SALES, ["cap", 1, 2.0]], SALES, DATA0)
_table("data-extra-empty-trailing-row", [*SALES, [None, None, None]], SALES, DATA0)
_table("data-extra-column", [[*r, "x"] for r in SALES], SALES, DATA0)
_table("data-rows-reordered", [SALES[0], SALES[2], SALES[1], SALES[3]], SALES, DATA0)
_table("data-empty-vs-full", [], SALES, DATA0)
_table("data-both-empty", [], [], DATA0)
_table("data-dates", [["d"], [dt.datetime(2024, 1, 5)]], [["d"], [dt.datetime(2024, 1, 5)]], DATA0)
_table("data-date-vs-text", [["d"], ["2024-01-05"]], [["d"], [dt.datetime(2024, 1, 5)]], DATA0)
_table("data-formula-without-cached-value", _cells(SALES, 3, 1, "=B2+B3"), _cells(SALES, 3, 1, 5), DATA0)
TWO = {"Sheet1": SALES, "Sheet2": [["Total"], [15]]}
_table("data-by-name", TWO, TWO, [{"type": "sheet_data", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2"}])
_table(
    "data-by-name-missing-in-result",
    {"Sheet1": SALES},
    TWO,
    [{"type": "sheet_data", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2"}],
)
_table(
    "data-by-name-missing-in-expected",
    TWO,
    {"Sheet1": SALES},
    [{"type": "sheet_data", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2"}],
)
_table(
    "data-second-sheet-by-int",
    TWO,
    {"Sheet1": SALES, "Other": [["Total"], [15]]},
    [{"type": "sheet_data", "sheet_idx0": 1, "sheet_idx1": "EI1"}],
)
_table(
    "data-int-idx1-means-result-sheet",
    {"Sheet1": SALES, "Copy": SALES},
    {"Sheet1": [["x"]]},
    [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": 1}],
)
_table("data-int-index-out-of-range", SALES, SALES, [{"type": "sheet_data", "sheet_idx0": 3, "sheet_idx1": "EI0"}])
_table("data-EI-out-of-range", SALES, SALES, [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI4"}])
_table("data-negative-int-index", TWO, TWO, [{"type": "sheet_data", "sheet_idx0": -1, "sheet_idx1": "EI1"}])
_table("data-bad-reference", SALES, SALES, [{"type": "sheet_data", "sheet_idx0": "XX0", "sheet_idx1": "EI0"}])
_table("data-ignore-case-key-is-not-an-option", _cells(SALES, 1, 0, "PEN"), SALES, [{**DATA0[0], "ignore_case": True}])
_table("data-no-expected-file", SALES, None, DATA0)
_table("no-rules-key", SALES, SALES, None)
_table("empty-rules", SALES, _cells(SALES, 1, 1, 99), [])
_table("unknown-rule-type", SALES, SALES, [{"type": "sparkle"}])
_table("second-rule-fails", SALES, _cells(SALES, 1, 1, 99), [{"type": "sheet_name"}, *DATA0])
_table("sheet-name-equal", TWO, TWO, [{"type": "sheet_name"}])
_table("sheet-name-renamed", {"Budget": SALES}, {"Sheet1": SALES}, [{"type": "sheet_name"}])
_table("sheet-name-order", {"Sheet2": [[1]], "Sheet1": SALES}, TWO, [{"type": "sheet_name"}])
_table(
    "copy-sheet-task-shape",
    {"Sheet1": SALES, "Sheet1 (2)": SALES, "Sheet2": [["Total"], [15]]},
    {"Sheet1": SALES, "Sheet1 (2)": SALES, "Sheet2": [["Total"], [15]]},
    [
        {"type": "sheet_name"},
        {"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": 1},
        {"type": "sheet_data", "sheet_idx0": 1, "sheet_idx1": "EI1"},
        {"type": "sheet_data", "sheet_idx0": 2, "sheet_idx1": "EI2"},
    ],
)

PRINT_NAMED = [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]
PRINT_INT = [{"type": "sheet_print", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
SHOWN = ["Item,Qty,Share", "pen,3,20%", "ink,2,13%"]
_table("print-equal", SALES, SALES, PRINT_NAMED, csvs=[("result", "Sheet1", SHOWN), ("gold", "Sheet1", SHOWN)])
_table("print-int-index", SALES, SALES, PRINT_INT, csvs=[("result", "Sheet1", SHOWN), ("gold", "Sheet1", SHOWN)])
_table(
    "print-differs-though-data-equal",
    SALES,
    SALES,
    PRINT_NAMED,
    csvs=[("result", "Sheet1", [*SHOWN[:2], "ink,2,0.13"]), ("gold", "Sheet1", SHOWN)],
)
_table("print-no-result-csv", SALES, SALES, PRINT_NAMED, csvs=[("gold", "Sheet1", SHOWN)])
_table("print-no-expected-csv", SALES, SALES, PRINT_NAMED, csvs=[("result", "Sheet1", SHOWN)])
_table(
    "print-no-expected-csv-ignore-case",
    SALES,
    SALES,
    [{**PRINT_NAMED[0], "ignore_case": True}],
    csvs=[("result", "Sheet1", SHOWN)],
)
_table(
    "print-ignore-case",
    SALES,
    SALES,
    [{**PRINT_NAMED[0], "ignore_case": True}],
    csvs=[("result", "Sheet1", [s.upper() for s in SHOWN]), ("gold", "Sheet1", SHOWN)],
)
_table(
    "print-case-differs",
    SALES,
    SALES,
    PRINT_NAMED,
    csvs=[("result", "Sheet1", [s.upper() for s in SHOWN]), ("gold", "Sheet1", SHOWN)],
)
_table(
    "print-trailing-blank-lines-and-spaces",
    SALES,
    SALES,
    PRINT_NAMED,
    csvs=[("result", "Sheet1", [*[f"  {s} " for s in SHOWN], "", "  "]), ("gold", "Sheet1", SHOWN)],
)
_table(
    "print-inner-blank-line",
    SALES,
    SALES,
    PRINT_NAMED,
    csvs=[("result", "Sheet1", [SHOWN[0], "", *SHOWN[1:]]), ("gold", "Sheet1", SHOWN)],
)
_table(
    "print-csv-of-another-sheet",
    {"Data": SALES},
    SALES,
    PRINT_INT,
    csvs=[("result", "Sheet1", SHOWN), ("gold", "Sheet1", SHOWN)],
)

FUZZY = [
    ["Name", "Address", "Phone"],
    ["Ana Lima", "12 Oak Rd", "+1 (555) 010-2030"],
    ["Bo Chen", "3 Elm St", "555-0101"],
]


def _fuzzy(name: str, result_rows: list[list[Any]], rules: list[dict[str, Any]]) -> None:
    _table(
        f"fuzzy-{name}",
        result_rows,
        FUZZY,
        [{"type": "sheet_fuzzy", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1", "rules": rules}],
    )


_fuzzy("exact", FUZZY, [{"range": ["A1:C3"], "type": "exact_match"}])
_fuzzy("exact-one-cell", _cells(FUZZY, 2, 0, "Bo Chan"), [{"range": ["A1:A3", "B1:B3"], "type": "exact_match"}])
_fuzzy(
    "exact-ignore-case",
    _cells(FUZZY, 1, 0, "ANA LIMA"),
    [{"range": ["A2"], "type": "exact_match", "ignore_case": True}],
)
_fuzzy(
    "task-d1acdb87",
    _cells(_cells(FUZZY, 1, 1, "12 oak road"), 1, 2, "15550102030"),
    [
        {"range": ["A1:A3"], "type": "exact_match"},
        {
            "range": ["B1:B3"],
            "type": "fuzzy_match",
            "threshold": 85,
            "normalization": [["Rd", "Road"], ["St", "Street"]],
            "ignore_case": True,
        },
        {"range": ["C2:C3"], "type": "includes", "trim_leadings": "+ ", "ignore_chars": " ()-"},
    ],
)
_fuzzy(
    "fuzzy-below-threshold",
    _cells(FUZZY, 1, 1, "98 Pine Avenue"),
    [{"range": ["B2"], "type": "fuzzy_match", "threshold": 90}],
)
_fuzzy("includes", _cells(FUZZY, 1, 0, "Dr Ana Lima PhD"), [{"range": ["A2"], "type": "includes"}])
_fuzzy("included-by", _cells(FUZZY, 1, 0, "Ana"), [{"range": ["A2"], "type": "included_by"}])
_fuzzy(
    "trim",
    _cells(FUZZY, 2, 1, "  3 Elm St  "),
    [{"range": ["B3"], "type": "exact_match", "trim_leadings": " ", "trim_trailings": " "}],
)
_fuzzy("number-cells", [["n"], [3]], [{"range": ["A1:A2"], "type": "exact_match"}])
_fuzzy("empty-vs-text", [["Name"]], [{"range": ["A1:A2"], "type": "exact_match"}])
_fuzzy("boolean-cell", [["Name"], [True]], [{"range": ["A2"], "type": "exact_match"}])


def _chart_book(kind: str = "bar", title: str | None = "Sales", legend: str | None = "r", xt: str | None = None):
    from openpyxl.chart import BarChart, LineChart, Reference

    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            ws = wb["Sheet1"]
            chart = BarChart() if kind in ("bar", "col") else LineChart()
            if kind == "bar":
                chart.type = "bar"
            elif kind == "col":
                chart.type = "col"
            chart.add_data(Reference(ws, min_col=2, min_row=1, max_row=4), titles_from_data=True)
            chart.set_categories(Reference(ws, min_col=1, min_row=2, max_row=4))
            if title:
                chart.title = title
            if xt:
                chart.x_axis.title = xt
            if legend is None:
                chart.legend = None
            else:
                chart.legend.position = legend
            ws.add_chart(chart, "E2")

        return xlsx(path, SALES, edit)

    return make


def _chart(name: str, result: Any, expected: Any, props: list[str]) -> None:
    _table(
        f"chart-{name}",
        result,
        expected,
        [{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": props}],
    )


_chart("equal", _chart_book(), _chart_book(), ["type", "title", "legend"])
_chart("title-differs", _chart_book(title="Sold"), _chart_book(), ["type", "title"])
_chart("type-differs", _chart_book("line"), _chart_book(), ["type"])
_chart("direction-bar-vs-col", _chart_book("col"), _chart_book("bar"), ["type", "direction"])
_chart("direction-of-a-line-chart", _chart_book("line"), _chart_book("line"), ["direction"])
_chart("legend-differs", _chart_book(legend="b"), _chart_book(), ["legend"])
_chart("no-legend", _chart_book(legend=None), _chart_book(legend=None), ["legend"])
_chart("axis-titles", _chart_book(xt="Item"), _chart_book(xt="Item"), ["xtitle", "ytitle", "type"])
_chart("axis-title-differs", _chart_book(xt="Thing"), _chart_book(xt="Item"), ["xtitle"])
_chart("missing-chart", SALES, _chart_book(), ["type"])
_chart("no-charts-either", SALES, SALES, ["type"])
_table(
    "pivot-none-either",
    SALES,
    SALES,
    [
        {
            "type": "pivot_table",
            "sheet_idx0": 0,
            "sheet_idx1": "EI0",
            "pivot_props": ["col_fields", "filter", "row_fields", "data_fields"],
        }
    ],
)


def _styled(
    bold_cell: str | None = "A1", color: str = "FFFF0000", fill: str | None = "FFFFFF00", cf: str | None = None
):
    from openpyxl.formatting.rule import CellIsRule, FormulaRule
    from openpyxl.styles import Font, PatternFill

    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            ws = wb["Sheet1"]
            if bold_cell:
                ws[bold_cell].font = Font(bold=True, color=color, name="Arial")
            if fill:
                ws["B2"].fill = PatternFill("solid", fgColor=fill)
            red = PatternFill("solid", bgColor="FFFF0000", fgColor="FFFF0000")
            if cf == "expression":
                ws.conditional_formatting.add(
                    "B2:B4", FormulaRule(formula=["B2>2"], fill=red, font=Font(color="FF0000FF"))
                )
            elif cf == "expression-absolute":
                ws.conditional_formatting.add(
                    "B2:B4", FormulaRule(formula=["B2>$B$3"], fill=red, font=Font(color="FF0000FF"))
                )
            elif cf == "expression-range":
                ws.conditional_formatting.add(
                    "B2:B4", FormulaRule(formula=["B2>=MAX($B$2:$B$4)"], fill=red, font=Font(color="FF0000FF"))
                )
            elif cf == "cellis":
                ws.conditional_formatting.add(
                    "C2:C4", CellIsRule(operator="greaterThan", formula=["1"], fill=red, font=Font(color="FF0000FF"))
                )
            elif cf == "cellis-between":
                ws.conditional_formatting.add(
                    "C2:C4", CellIsRule(operator="between", formula=["1", "2"], fill=red, font=Font(color="FF0000FF"))
                )

        return xlsx(path, SALES, edit)

    return make


def _style(name: str, result: Any, expected: Any, props: list[str]) -> None:
    _table(f"style-{name}", result, expected, [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": props}])


ALL_STYLES = ["font_bold", "font_color", "bgcolor", "font_name", "font_italic", "font_underline"]
_style("equal", _styled(), _styled(), ALL_STYLES)
_style("bold-elsewhere", _styled("A2"), _styled(), ["font_bold"])
_style("color-differs", _styled(color="FF00FF00"), _styled(), ["font_color"])
_style("fill-differs", _styled(fill="FF00FFFF"), _styled(), ["bgcolor"])
_style("no-fill", _styled(fill=None), _styled(), ["bgcolor"])
_style("unstyled-both", SALES, SALES, ["font_bold", "bgcolor", "number_format", "font_size", "fill_type"])
_style("cf-expression-equal", _styled(cf="expression"), _styled(cf="expression"), ["bgcolor", "font_color"])
_style("cf-expression-vs-direct-fill", _styled(cf="expression"), _styled(fill="FFFF0000"), ["bgcolor"])
_style("cf-missing", _styled(), _styled(cf="expression"), ["bgcolor"])
_style("cf-absolute-cell-fails", _styled(cf="expression-absolute"), _styled(cf="expression-absolute"), ["bgcolor"])
_style("cf-absolute-range", _styled(cf="expression-range"), _styled(cf="expression-range"), ["bgcolor"])
_style("cf-cellis", _styled(cf="cellis"), _styled(cf="cellis"), ["bgcolor", "font_color"])
_style("cf-cellis-vs-between", _styled(cf="cellis"), _styled(cf="cellis-between"), ["bgcolor"])
_style("unknown-style", SALES, SALES, ["glitter"])


def _frozen(cell: str | None):
    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            wb["Sheet1"].freeze_panes = cell

        return xlsx(path, SALES, edit)

    return make


FREEZE = [{"type": "freeze", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
_table("freeze-equal", _frozen("B2"), _frozen("B2"), FREEZE)
_table("freeze-differs", _frozen("A2"), _frozen("B2"), FREEZE)
_table("freeze-none", _frozen(None), _frozen("B2"), FREEZE)


def _zoomed(scale: int | None):
    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            wb["Sheet1"].sheet_view.zoomScale = scale

        return xlsx(path, SALES, edit)

    return make


_table("zoom-under", _zoomed(150), None, [{"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 260}])
_table("zoom-over", _zoomed(300), None, [{"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 260}])
_table("zoom-unset-is-100", _zoomed(None), None, [{"type": "zoom", "sheet_idx": 0, "method": "eq", "ref": 100}])
_table("zoom-missing-sheet", _zoomed(150), None, [{"type": "zoom", "sheet_idx": "RNNope", "method": "lt", "ref": 260}])


def _validated(formula: str | None, sqref: str = "D2:D29"):
    from openpyxl.worksheet.datavalidation import DataValidation

    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            if formula:
                dv = DataValidation(type="list", formula1=formula)
                dv.add(sqref)
                wb["Sheet1"].add_data_validation(dv)

        return xlsx(path, SALES, edit)

    return make


DV = [
    {
        "type": "data_validation",
        "sheet_idx": 0,
        "dv_props": [
            {
                "ranges": {"method": "spreadsheet_range", "ref": ["D2:D29", "D2:D1048576"]},
                "type": {"method": "eq", "ref": "list"},
                "formula1": {"method": "str_set_eq", "ref": ["Pass", "Fail", "Held"]},
            }
        ],
    }
]
_table("validation-task-ecb0df7a", _validated('"Pass,Fail,Held"'), SALES, [*DATA0, *DV])
_table("validation-other-order", _validated('"Held,Pass,Fail"', "D2:D100"), None, DV)
_table("validation-wrong-list", _validated('"Pass,Fail"'), None, DV)
_table("validation-too-small-range", _validated('"Pass,Fail,Held"', "D2:D10"), None, DV)
_table("validation-none", _validated(None), None, DV)


def _hidden(rows: list[int]):
    def make(path: Path) -> Path:
        def edit(wb: Any) -> None:
            for r in rows:
                wb["Sheet1"].row_dimensions[r].hidden = True

        return xlsx(path, SALES, edit)

    return make


ROWS = [{"type": "row_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden"]}]
_table("rows-hidden-equal", _hidden([3]), _hidden([3]), [*DATA0, *ROWS])
_table("rows-hidden-differs", _hidden([2]), _hidden([3]), ROWS)
_table("rows-none-hidden", _hidden([]), _hidden([3]), ROWS)
_table(
    "cols-props",
    SALES,
    SALES,
    [{"type": "col_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden", "width"]}],
)


def _cell(name: str, rows: Any, coordinate: str, props: dict[str, Any], sheet: Any = 0) -> None:
    _table(
        f"cell-{name}",
        rows,
        None,
        [{"type": "check_cell", "sheet_idx": sheet, "coordinate": coordinate, "props": props}],
    )


_cell("approx", [["a", 191.6667]], "B1", {"value": {"method": "approx:0.001", "ref": 191.6667}})
_cell("approx-off", [["a", 191.7]], "B1", {"value": {"method": "approx:0.001", "ref": 191.6667}})
_cell("approx-text", [["a", "191.6667"]], "B1", {"value": {"method": "approx:0.001", "ref": 191.6667}})
_cell("eq-text", [["Demographic Profile"]], "A1", {"value": {"method": "eq", "ref": "Demographic Profile"}})
_cell("empty-cell", [["x"]], "C9", {"value": {"method": "eq", "ref": "x"}})
_cell("regex", [["Total: 42"]], "A1", {"value": {"method": "re.I", "ref": r"total:\s+\d+"}})
_cell("by-name", {"Data": [["ok"]]}, "A1", {"value": {"method": "eq", "ref": "ok"}}, "RNData")
_cell("missing-sheet", [["ok"]], "A1", {"value": {"method": "eq", "ref": "ok"}}, "RNData")
_cell("bad-coordinate", [["ok"]], "A0", {"value": {"method": "eq", "ref": "ok"}})
_cell("unknown-method", [["ok"]], "A1", {"value": {"method": "soundex", "ref": "ok"}})
_cell(
    "task-30e3e107-style",
    _styled(color="FFFFFFFF"),
    "A1",
    {
        "font_color": {"method": "eq", "ref": "FFFFFFFF"},
        "font_bold": {"method": "eq", "ref": True},
        "value": {"method": "eq", "ref": "Item"},
    },
)
_cell("bold-wrong", _styled(), "A1", {"font_bold": {"method": "eq", "ref": False}})
_cell("fill", _styled(), "B2", {"bgcolor": {"method": "eq", "ref": "FFFFFF00"}})

_broken_cases("compare_table", "table", ".xlsx", lambda p: xlsx(p, SALES))


def _wrong_kind(d: Path) -> Inputs:
    return paragraphs(d / "result.docx", ["not a sheet"]), xlsx(d / "gold.xlsx", SALES), {"rules": DATA0}


add("compare_table", "table", "docx-as-result", _wrong_kind)


def _xlsx_named_csv(d: Path) -> Inputs:
    # the right bytes under a name openpyxl refuses (it goes by the extension)
    good = xlsx(d / "result.xlsx", SALES)
    other = d / "result.csv"
    other.write_bytes(good.read_bytes())
    return other, xlsx(d / "gold.xlsx", SALES), {"rules": DATA0}


add("compare_table", "table", "workbook-named-csv", _xlsx_named_csv)


# ------------------------------------------------------------------------------ compare_conference_city_in_order
CITIES: list[Any] = ["Scottsdale", "Atlanta", ["Montreal", "Montréal"], ["New York", "NYC"]] + [
    f"City{i}" for i in range(17)
]
COLUMN = ["Scottsdale, AZ", "Atlanta", "Montréal", "New York City"] + [f"City{i}" for i in range(17)]


def _cities(name: str, column: list[Any], wanted: list[Any]) -> None:
    def build(d: Path) -> Inputs:
        rows = [["Conf", "Year", "City"]] + [["c", 2000 + i, city] for i, city in enumerate(column)]
        return xlsx(d / "result.xlsx", rows), {"expected": wanted}, {}

    add("compare_conference_city_in_order", "table", name, build)


_cities("in-order", COLUMN, CITIES)
_cities("wrong-city", _cells([COLUMN], 0, 1, "Boston")[0], CITIES)
_cities("alternative-name", _cells([COLUMN], 0, 3, "NYC")[0], CITIES)
_cities("empty-cell", _cells([COLUMN], 0, 1, None)[0], CITIES)
_cities("number-cell", _cells([COLUMN], 0, 1, 1996)[0], CITIES)
_cities("expected-list-too-short", COLUMN, CITIES[:10])
_cities("short-column", COLUMN[:4], CITIES)
_cities("number-expected", COLUMN, [7, *CITIES[1:]])
add("compare_conference_city_in_order", "table", "missing-file", lambda d: (None, {"expected": CITIES}, {}))
add(
    "compare_conference_city_in_order",
    "table",
    "broken-file",
    lambda d: (text(d / "r.xlsx", BROKEN["not-a-zip"]), {"expected": CITIES}, {}),
)


# ------------------------------------------------------------------------------------------------------ CSV
LINES = "name,city\nAna,Lisbon\nKofi,Accra\n"


def _csv(name: str, result: str | bytes | None, expected: Any, options: dict[str, Any] | None = None) -> None:
    def build(d: Path) -> Inputs:
        r = None if result is None else text(d / "result.csv", result)
        if isinstance(expected, list):
            exp: Any = [
                d / f"missing-{i}.csv" if e is None else text(d / f"gold{i}.csv", e) for i, e in enumerate(expected)
            ]
        else:
            exp = d / "missing.csv" if expected is None else text(d / "gold.csv", expected)
        return r, exp, options or {}

    add("compare_csv", "table", name, build)


_csv("equal", LINES, LINES)
_csv("one-line-differs", LINES.replace("Accra", "Kumasi"), LINES)
_csv("crlf-vs-lf", LINES.replace("\n", "\r\n"), LINES)
_csv("trailing-newline", LINES.rstrip("\n"), LINES)
_csv("extra-blank-line", LINES + "\n", LINES)
_csv("spaces-strict", LINES.replace("Ana", "Ana "), LINES)
_csv("spaces-not-strict", LINES.replace("Accra", "Accra  "), LINES, {"strict": False})
_csv("inner-spaces-not-strict", LINES.replace("Ana", "Ana "), LINES, {"strict": False})
_csv("ignore-case", LINES.upper(), LINES, {"ignore_case": True})
_csv("case-differs", LINES.upper(), LINES)
_csv("latin1-bytes", "name\nJosé\n".encode("latin-1"), "name\nJosé\n".encode("latin-1"))
_csv("latin1-vs-utf8", "name\nJosé\n".encode("latin-1"), "name\nJosé\n")
_csv("bom", "\ufeff" + LINES, LINES)
_csv("missing-result", None, LINES)
_csv("missing-expected", LINES, None)
_csv("expected-list-second-matches", LINES, ["other\n", LINES])
_csv("expected-list-missing-first", LINES, [None, LINES])
_csv("expected-list-none-match", LINES, ["other\n", "more\n"])
_csv("empty-both", "", "")

ACCOUNTS = "url,user,password\nimap://outlook.office365.com,anonym-x2024@outlook.com,pw1\nsmtp://smtp.office365.com,anonym-x2024@outlook.com,pw1\n"


def _check_csv(name: str, body: str | bytes | None, rules: dict[str, Any]) -> None:
    add("check_csv", "general", name, lambda d: (None if body is None else text(d / "a.csv", body), rules, {}))


IMAP = {"url": "imap://outlook.office365.com", "user": "anonym-x2024@outlook.com"}
_check_csv("expect-found", ACCOUNTS, {"expect": [{**IMAP, "password": "pw1"}, {"url": "smtp://smtp.office365.com"}]})
_check_csv("expect-wrong-password", ACCOUNTS, {"expect": [{**IMAP, "password": "pw2"}]})
_check_csv("unexpect-present", ACCOUNTS, {"unexpect": [IMAP]})
_check_csv("unexpect-absent", ACCOUNTS.replace("imap:", "pop:"), {"unexpect": [IMAP]})
_check_csv("unknown-column", ACCOUNTS, {"expect": [{"host": "x"}]})
_check_csv("header-only", "url,user\n", {"expect": [IMAP]})
_check_csv("empty-rules", ACCOUNTS, {})
_check_csv("missing-file", None, {"expect": [IMAP]})
_check_csv("not-utf8", "url,user\nimap://x,Jos\xe9\n".encode("latin-1"), {"unexpect": [IMAP]})


# ------------------------------------------------------------------------------------------------- Writer
BODY = ["Water Facts", "H2O is water.", "It covers  most of the Earth.", "", "The end."]


def _doc(texts: list[str] = BODY, **edits: Any) -> Callable[[Path], Path]:
    """A .docx of these paragraphs; ``edits`` names what to change (see ``_style_doc``)."""

    def make(path: Path) -> Path:
        return document(path, lambda d: _style_doc(d, texts, edits))

    return make


def _style_doc(d: Any, texts: list[str], edits: dict[str, Any]) -> None:
    from docx.enum.text import WD_ALIGN_PARAGRAPH, WD_BREAK, WD_COLOR_INDEX
    from docx.oxml import OxmlElement
    from docx.shared import Inches, Pt, RGBColor

    for i, t in enumerate(texts):
        p = d.add_paragraph()
        head, _, tail = t.partition(" ")
        first = p.add_run(head)
        if tail:
            p.add_run(" " + tail)
        if i == 0 and edits.get("center"):
            p.alignment = WD_ALIGN_PARAGRAPH.CENTER
        if i in edits.get("spacing", {}):
            p.paragraph_format.line_spacing = edits["spacing"][i]
        if i == edits.get("subscript"):
            first.font.subscript = True
        if i == edits.get("equation"):
            first._r.append(OxmlElement("w:object"))
        if i == edits.get("highlight"):
            first.font.highlight_color = WD_COLOR_INDEX.YELLOW
        if i == edits.get("page_break"):
            first.add_break(WD_BREAK.PAGE)
        if "font" in edits:
            for run in p.runs:
                run.font.name = edits["font"]
        if i in edits.get("italic", {}):
            first.italic = True
            if edits["italic"][i]:
                first.font.size = Pt(edits["italic"][i])
        if i == len(texts) - 1 and "strike" in edits:
            for run in p.runs[: edits["strike"]]:
                run.font.strike = True
        if i in edits.get("tabs", {}):
            p.paragraph_format.tab_stops.add_tab_stop(Inches(edits["tabs"][i]))
    if "picture" in edits:
        d.add_picture(png(edits["picture"]))
    if "table" in edits:
        rows = edits["table"]
        table = d.add_table(rows=len(rows), cols=len(rows[0]))
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                cell = table.cell(r, c)
                if isinstance(value, tuple):
                    word, colour = value
                    run = cell.paragraphs[0].add_run(word)
                    if colour is not None:
                        run.font.color.rgb = RGBColor(*colour)
                else:
                    cell.text = value
    for k, footer in enumerate(edits.get("footers", [])):
        if k:
            d.add_section()
            d.sections[k].footer.is_linked_to_previous = False
        d.sections[k].footer.paragraphs[0].text = footer


def _docs(metric: str, name: str, result: Any, expected: Any, options: dict[str, Any] | None = None) -> None:
    """A docs.py case; ``result``/``expected`` make a file from a path (None: missing; NO_EXPECTED: no getter)."""

    def build(d: Path) -> Inputs:
        def made(spec: Any, stem: str) -> Any:
            if spec is None or spec is NO_EXPECTED or isinstance(spec, dict):
                return spec
            suffix = getattr(spec, "suffix", ".docx")
            return spec(d / f"{stem}{suffix}")

        return made(result, "result"), made(expected, "gold"), options or {}

    add(metric, "docs", name, build)


def _odt(parts: list[list[tuple[str, str | None]]], highlight: str | None = "#ffff00") -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        return odt(path, parts, highlight)

    make.suffix = ".odt"  # type: ignore[attr-defined]
    return make


def _raw(data: bytes, suffix: str = ".docx") -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        return text(path, data)

    make.suffix = suffix  # type: ignore[attr-defined]
    return make


D = _doc()
CHANGED = _doc([*BODY[:2], "It covers most of the Moon.", *BODY[3:]])
_docs("compare_docx_files", "equal", D, D)
_docs("compare_docx_files", "one-word", CHANGED, D)
_docs("compare_docx_files", "blanks-folded", _doc([*BODY[:2], "It covers most of the Earth.", "The end."]), D)
_docs(
    "compare_docx_files",
    "blanks-kept",
    _doc([*BODY[:2], "It covers most of the Earth.", "The end."]),
    D,
    {"ignore_blanks": False},
)
_docs("compare_docx_files", "blanks-kept-equal", D, D, {"ignore_blanks": False})
_docs("compare_docx_files", "case", _doc([t.upper() for t in BODY]), D, {"ignore_case": True, "ignore_blanks": True})
_docs("compare_docx_files", "case-differs", _doc([t.upper() for t in BODY]), D)
_docs("compare_docx_files", "order", _doc(list(reversed(BODY))), D, {"ignore_order": True, "ignore_case": True})
_docs("compare_docx_files", "order-matters", _doc(list(reversed(BODY))), D)
_docs("compare_docx_files", "content-only", CHANGED, D, {"content_only": True})
_docs(
    "compare_docx_files",
    "content-only-case",
    _doc([t.upper() for t in BODY]),
    D,
    {"content_only": True, "ignore_case": True},
)
_docs("compare_docx_files", "fuzzy", CHANGED, D, {"fuzzy_match": True})
_docs("compare_docx_files", "fuzzy-paragraphs", CHANGED, D, {"fuzzy_match": True, "ignore_blanks": False})
_docs("compare_docx_files", "fuzzy-no-paragraphs", _doc([]), _doc([]), {"fuzzy_match": True, "ignore_blanks": False})
_docs(
    "compare_docx_files",
    "delete-empty-lines",
    _doc([t for t in BODY if t]),
    D,
    {"ignore_blanks": False, "delete_empty_lines": True},
)
_docs("compare_docx_files", "table-text-not-compared", _doc(table=[["a", "b"]]), _doc(table=[["x", "y"]]))
ODT = [[("Water ", None), ("facts", "plain")], [("H2O is water.", None)]]
_docs("compare_docx_files", "odt-equal", _odt(ODT), _odt(ODT))
_docs("compare_docx_files", "odt-differs", _odt([[("Water ", None), ("fact", "plain")], *ODT[1:]]), _odt(ODT))
_docs("compare_docx_files", "docx-vs-odt", D, _odt(ODT))
_docs("compare_docx_files", "missing-result", None, D)
_docs("compare_docx_files", "broken-result", _raw(BROKEN["not-a-zip"]), D)
_docs("compare_docx_files", "empty-expected", D, _raw(b""))
_docs("compare_docx_files", "pdf-named", _raw(b"%PDF-1.4", ".pdf"), D)

_docs("compare_docx_files_and_ignore_new_lines", "equal-without-empty-lines", _doc([t for t in BODY if t]), D)
_docs(
    "compare_docx_files_and_ignore_new_lines",
    "blanks-kept",
    _doc([t for t in BODY if t]),
    D,
    {"ignore_blanks": False},
)
_docs(
    "compare_docx_files_and_ignore_new_lines",
    "blanks-kept-spaces",
    _doc(["It covers most of the Earth."]),
    _doc([BODY[2]]),
    {"ignore_blanks": False},
)
_docs("compare_docx_files_and_ignore_new_lines", "differs", CHANGED, D)
_docs("compare_docx_files_and_ignore_new_lines", "odt", _odt(ODT), _odt(ODT))

_docs("compare_docx_lines", "reordered", _doc(list(reversed(BODY))), D)
_docs("compare_docx_lines", "differs", CHANGED, D)
_docs("compare_docx_lines", "missing", None, D)

TABLE = [["Task", "Hours"], ["Plan", "3"], ["Build", "10"]]
_docs("compare_docx_tables", "equal", _doc(table=TABLE), _doc(table=TABLE))
_docs("compare_docx_tables", "cell-differs", _doc(table=_cells(TABLE, 2, 1, "11")), _doc(table=TABLE))
_docs("compare_docx_tables", "cell-spaces", _doc(table=_cells(TABLE, 2, 1, " 10 ")), _doc(table=TABLE))
_docs("compare_docx_tables", "extra-row", _doc(table=[*TABLE, ["Test", "2"]]), _doc(table=TABLE))
_docs("compare_docx_tables", "no-table", D, _doc(table=TABLE))
_docs("compare_docx_tables", "no-tables-either", D, D)
_docs("compare_docx_tables", "broken", _raw(b""), _doc(table=TABLE))

_docs("compare_docx_images", "same", _doc(picture=(10, 20, 30)), _doc(picture=(10, 20, 30)))
_docs("compare_docx_images", "other-colour", _doc(picture=(10, 20, 31)), _doc(picture=(10, 20, 30)))
_docs("compare_docx_images", "missing-image", D, _doc(picture=(10, 20, 30)))
_docs("compare_docx_images", "no-images", D, D)

_docs("compare_line_spacing", "equal", _doc(spacing={1: 1.5}), _doc(spacing={1: 1.5}))
_docs("compare_line_spacing", "differs", _doc(spacing={1: 2.0}), _doc(spacing={1: 1.5}))
_docs("compare_line_spacing", "unset-vs-set", D, _doc(spacing={2: 1.0}))
_docs("compare_line_spacing", "text-differs-first", _doc([*BODY[:4], "Fin."], spacing={1: 1.5}), _doc(spacing={1: 1.5}))

_docs("compare_insert_equation", "both", _doc(equation=1), _doc(equation=1))
_docs("compare_insert_equation", "missing", D, _doc(equation=1))
_docs("compare_insert_equation", "elsewhere", _doc(equation=2), _doc(equation=1))

_docs("compare_subscript_contains", "both", _doc(subscript=1), _doc(subscript=1))
_docs("compare_subscript_contains", "none", D, _doc(subscript=1))
_docs("compare_subscript_contains", "elsewhere", _doc(subscript=2), _doc(subscript=1))

_docs("compare_contains_image", "both", _doc(picture=(1, 2, 3)), _doc(picture=(4, 5, 6)))
_docs("compare_contains_image", "only-expected", D, _doc(picture=(1, 2, 3)))
_docs("compare_contains_image", "none", D, D)
_docs("compare_contains_image", "broken", _raw(b"PK"), D)

_docs("compare_font_names", "all-times", _doc(font="Times New Roman"), {"font_name": "Times New Roman"})
_docs("compare_font_names", "arial", _doc(font="Arial"), {"font_name": "Times New Roman"})
_docs("compare_font_names", "unset", D, {"font_name": "Times New Roman"})
_docs("compare_font_names", "missing", None, {"font_name": "Times New Roman"})

_docs("contains_page_break", "task-shape-no-rules", _doc(page_break=1), NO_EXPECTED)
_docs("contains_page_break", "with-rules", _doc(page_break=1), {})
_docs("contains_page_break", "count-matches", _doc(page_break=1), {"page_break_count": 1})
_docs("contains_page_break", "count-differs", _doc(page_break=1), {"page_break_count": 2})
_docs("contains_page_break", "none", D, {})
_docs("contains_page_break", "missing", None, {})

_docs("has_page_numbers_in_footers", "numbered", _doc(footers=["Page 1"]), NO_EXPECTED)
_docs("has_page_numbers_in_footers", "no-number", _doc(footers=["Confidential"]), NO_EXPECTED)
_docs("has_page_numbers_in_footers", "no-footer", D, NO_EXPECTED)
_docs("has_page_numbers_in_footers", "second-section-unnumbered", _doc(footers=["1", "Appendix"]), NO_EXPECTED)
_docs("has_page_numbers_in_footers", "both-sections", _doc(footers=["1", "2"]), NO_EXPECTED)
_docs("has_page_numbers_in_footers", "missing", None, NO_EXPECTED)

_docs("is_first_line_centered", "centred", _doc(center=True), NO_EXPECTED)
_docs("is_first_line_centered", "left", D, NO_EXPECTED)
_docs("is_first_line_centered", "empty-document", _doc([]), NO_EXPECTED)
_docs("is_first_line_centered", "broken", _raw(b"x"), NO_EXPECTED)

TABS = ["Book Title Here\tPrice", "Another Good Book\t12", "A Third Book\t9"]
_docs("check_tabstops", "equal", _doc(TABS, tabs={0: 4, 1: 4, 2: 4}), _doc(TABS, tabs={0: 4, 1: 4, 2: 4}))
_docs("check_tabstops", "shifted", _doc(TABS, tabs={0: 4, 1: 3.5, 2: 4}), _doc(TABS, tabs={0: 4, 1: 4, 2: 4}))
_docs("check_tabstops", "missing-stop", _doc(TABS, tabs={0: 4, 2: 4}), _doc(TABS, tabs={0: 4, 1: 4, 2: 4}))
_docs(
    "check_tabstops",
    "task-0a0faba3-words",
    _doc(TABS, tabs={0: 4, 1: 4, 2: 4}),
    _doc(TABS, tabs={0: 4, 1: 4, 2: 4}),
    {"word_number_split_by_tabstop": 3, "index": 0},
)
_docs(
    "check_tabstops",
    "words-wrong",
    _doc(["Two Words\tx", *TABS[1:]], tabs={0: 4}),
    _doc(TABS, tabs={0: 4}),
    {"word_number_split_by_tabstop": 3, "index": 0},
)
_docs("check_tabstops", "no-paragraphs", _doc([]), _doc([]))
_docs("check_tabstops", "paragraph-count", _doc(TABS[:2]), _doc(TABS))

RED, BLUE = (255, 0, 0), (0, 0, 255)
WORDS = [[("apple", RED), ("book", BLUE)], [("egg", RED), ("cat", BLUE)]]
_docs("evaluate_colored_words_in_tables", "coloured", _doc(table=WORDS), _doc(table=WORDS))
_docs(
    "evaluate_colored_words_in_tables",
    "near-red",
    _doc(table=_cells(WORDS, 0, 0, ("apple", (250, 5, 5)))),
    _doc(table=WORDS),
)
_docs(
    "evaluate_colored_words_in_tables", "wrong-colour", _doc(table=_cells(WORDS, 1, 1, ("cat", RED))), _doc(table=WORDS)
)
_docs(
    "evaluate_colored_words_in_tables",
    "uncoloured-word",
    _doc(table=_cells(WORDS, 1, 1, ("cat", None))),
    _doc(table=WORDS),
)
_docs(
    "evaluate_colored_words_in_tables",
    "threshold",
    _doc(table=_cells(WORDS, 0, 0, ("apple", (230, 20, 20)))),
    _doc(table=WORDS),
    {"threshold": 10},
)
_docs("evaluate_colored_words_in_tables", "text-differs", _doc(["x"], table=WORDS), _doc(table=WORDS))

_docs("evaluate_strike_through_last_paragraph", "struck", _doc(strike=2), _doc(strike=2))
_docs("evaluate_strike_through_last_paragraph", "half-struck", _doc(strike=1), _doc(strike=2))
_docs("evaluate_strike_through_last_paragraph", "not-struck", D, D)
_docs("evaluate_strike_through_last_paragraph", "empty", _doc([]), _doc([]))

_docs("check_italic_font_size_14", "fourteen", _doc(italic={1: 14, 2: 14}), D)
_docs("check_italic_font_size_14", "twelve", _doc(italic={1: 14, 2: 12}), D)
_docs("check_italic_font_size_14", "italic-unsized", _doc(italic={1: None}), D)
_docs("check_italic_font_size_14", "no-italics", D, D)

HL = [[("Call ", None), ("the candidate", "hl")], [("Ask questions.", None)]]
_docs("check_highlighted_words", "still-highlighted", _odt(HL), _odt(HL))
_docs("check_highlighted_words", "highlight-removed", _odt(HL, highlight=None), _odt(HL, highlight=None))
_docs("check_highlighted_words", "green-highlight", _odt(HL, highlight="#00ff00"), _odt(HL, highlight="#00ff00"))
_docs("check_highlighted_words", "docx-files", D, D)
_docs("check_highlighted_words", "text-differs", _odt(HL[:1]), _odt(HL))

_docs("compare_highlighted_text", "same", _doc(highlight=1), _doc(highlight=1))
_docs("compare_highlighted_text", "differs", _doc(highlight=2), _doc(highlight=1))
_docs("compare_highlighted_text", "none", D, D)
_docs("compare_highlighted_text", "broken", _raw(b"PK\x03\x04"), D)

REFS = [
    "Essay",
    "Body text.",
    "References",
    "Smith, J. (2020). Water. Nature 1, 2-3.",
    "",
    "Lee, K. (2019). Ice. Science 4, 5.",
]
REFS_OPTIONS = {"content_only": True, "reference_base_result": 0.92}
_docs("compare_references", "same", _doc(REFS), _doc(REFS), REFS_OPTIONS)
_docs(
    "compare_references",
    "close",
    _doc([*REFS[:3], "Smith, J (2020) Water, Nature 1, 2-3", *REFS[4:]]),
    _doc(REFS),
    REFS_OPTIONS,
)
_docs("compare_references", "close-default-base", _doc([*REFS[:3], "Smith J 2020 Water", *REFS[4:]]), _doc(REFS))
_docs("compare_references", "far", _doc([*REFS[:3], "Other, A. Thing.", *REFS[4:]]), _doc(REFS), REFS_OPTIONS)
_docs("compare_references", "one-missing", _doc(REFS[:4]), _doc(REFS), REFS_OPTIONS)
_docs("compare_references", "no-section-either", D, D)
_docs("compare_references", "section-in-one", D, _doc(REFS))
_docs("compare_references", "empty-section", _doc(REFS[:3]), _doc(REFS[:3]))
_docs(
    "compare_references",
    "other-indicator",
    _doc(["Bibliography", "A"]),
    _doc(["Bibliography", "A"]),
    {"reference_indicator": "Bibliography"},
)


# -------------------------------------------------------------------------------------------------- Impress
def _slides(**edits: Any) -> Callable[[Path], Path]:
    """A two-slide deck (a title slide, a bullet slide with a table) with ``edits`` applied (see ``_edit_deck``)."""

    def make(path: Path) -> Path:
        return deck(path, lambda prs: _edit_deck(prs, edits))

    return make


def _edit_deck(prs: Any, edits: dict[str, Any]) -> None:
    from lxml import etree
    from pptx.dml.color import RGBColor
    from pptx.enum.text import PP_ALIGN
    from pptx.oxml.ns import qn
    from pptx.util import Emu, Inches, Pt

    if edits.get("portrait"):
        prs.slide_width, prs.slide_height = Inches(7.5), Inches(10)
    for n in range(edits.get("slides", 2)):
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        box = slide.shapes.add_textbox(
            Inches(1) + Emu(edits.get("move", 0) if n == 0 else 0), Inches(1), Inches(6), Inches(1)
        )
        tf = box.text_frame
        tf.text = edits.get("title", "Quarterly Review") if n == 0 else "Agenda"
        run = tf.paragraphs[0].runs[0]
        run.font.size = Pt(edits.get("size", 32))
        run.font.bold = edits.get("bold", True)
        run.font.name = edits.get("font", "Arial")
        if "colour" in edits:
            run.font.color.rgb = RGBColor(*edits["colour"])
        if edits.get("underline") is not None:
            run.font.underline = edits["underline"]
        if edits.get("strike"):
            run.font._element.set("strike", "sngStrike")
        if n == 1:
            for k, line in enumerate(edits.get("bullets", ["Results", "Plans"])):
                p = tf.add_paragraph()
                p.text = line
                p.level = edits.get("level", 1) if k == 0 else 1
                if edits.get("align") and k == 0:
                    p.alignment = PP_ALIGN.CENTER
            rows = edits.get("table", [["Q1", "10"], ["Q2", "12"]])
            table = slide.shapes.add_table(len(rows), 2, Inches(1), Inches(3), Inches(4), Inches(1)).table
            for r, row in enumerate(rows):
                for c, value in enumerate(row):
                    table.cell(r, c).text = value
        if n == 0 and "background" in edits:
            slide.background.fill.solid()
            slide.background.fill.fore_color.rgb = RGBColor(*edits["background"])
        if n == 0 and "notes" in edits:
            slide.notes_slide.notes_text_frame.text = edits["notes"]
        if n == 0 and "picture" in edits:
            left, top, width, height = edits["picture"]
            slide.shapes.add_picture(png((20, 120, 220)), left, top, width, height)
        if n == 0 and "transition" in edits:
            transition = etree.SubElement(slide._element, qn("p:transition"))
            etree.SubElement(transition, qn(f"p:{edits['transition']}"))
    if "master_colours" in edits:
        master = prs.slide_master.element
        for value in edits["master_colours"]:
            fill = etree.SubElement(master, qn("a:solidFill"))
            etree.SubElement(fill, qn("a:srgbClr")).set("val", value)


def _pptx(metric: str, name: str, result: Any, expected: Any, options: dict[str, Any] | None = None) -> None:
    def build(d: Path) -> Inputs:
        def made(spec: Any, stem: str) -> Any:
            if spec is None or spec is NO_EXPECTED or isinstance(spec, dict):
                return spec
            return spec(d / f"{stem}{getattr(spec, 'suffix', '.pptx')}")

        return made(result, "result"), made(expected, "gold"), options or {}

    add(metric, "slides", name, build)


S = _slides()
_pptx("compare_pptx_files", "equal", S, S)
_pptx("compare_pptx_files", "title-text", _slides(title="Quarterly Reviews"), S)
_pptx("compare_pptx_files", "title-text-not-examined", _slides(title="Quarterly Reviews"), S, {"examine_text": False})
_pptx("compare_pptx_files", "font-size", _slides(size=28), S)
_pptx("compare_pptx_files", "font-size-not-examined", _slides(size=28), S, {"examine_font_size": False})
_pptx("compare_pptx_files", "font-name", _slides(font="Calibri"), S)
_pptx("compare_pptx_files", "bold-none-vs-false", _slides(bold=None), _slides(bold=False))
_pptx("compare_pptx_files", "bold-vs-not", _slides(bold=False), S)
_pptx("compare_pptx_files", "colour", _slides(colour=(255, 0, 0)), _slides(colour=(0, 0, 255)))
_pptx("compare_pptx_files", "colour-only-one", _slides(colour=(255, 0, 0)), S)
_pptx("compare_pptx_files", "underline", _slides(underline=True), S)
_pptx("compare_pptx_files", "underline-false-vs-none", _slides(underline=False), S)
_pptx("compare_pptx_files", "strike", _slides(strike=True), S)
_pptx("compare_pptx_files", "moved", _slides(move=300000), S)
_pptx("compare_pptx_files", "moved-a-little", _slides(move=20000), S)
_pptx("compare_pptx_files", "moved-shape-not-examined", _slides(move=300000), S, {"examine_shape": False})
_pptx("compare_pptx_files", "slide-count", _slides(slides=3), S)
_pptx("compare_pptx_files", "slide-count-not-examined", _slides(slides=3), S, {"examine_number_of_slides": False})
_pptx("compare_pptx_files", "notes", _slides(notes="Say hello"), _slides(notes="Say hi"))
_pptx("compare_pptx_files", "notes-equal", _slides(notes="Say hello"), _slides(notes="Say hello"))
_pptx("compare_pptx_files", "background", _slides(background=(0, 0, 255)), _slides(background=(0, 0, 200)))
_pptx("compare_pptx_files", "background-equal", _slides(background=(0, 0, 255)), _slides(background=(0, 0, 255)))
_pptx("compare_pptx_files", "background-missing", S, _slides(background=(0, 0, 255)))
_pptx("compare_pptx_files", "table-cell", _slides(table=[["Q1", "10"], ["Q2", "13"]]), S)
_pptx("compare_pptx_files", "bullet-level", _slides(level=0), S)
_pptx("compare_pptx_files", "bullet-level-not-examined", _slides(level=0), S, {"examine_indent": False})
_pptx("compare_pptx_files", "bullet-text", _slides(bullets=["Results", "Plan"]), S)
_pptx("compare_pptx_files", "alignment", _slides(align=True), S)
_pptx(
    "compare_pptx_files",
    "alignment-not-examined",
    _slides(align=True),
    S,
    {"examine_aligment": False, "examine_alignment": False},
)
_pptx("compare_pptx_files", "task-af2d657a-typo-option", _slides(align=True), S, {"examine_aligment": False})
_pptx(
    "compare_pptx_files",
    "title-bottom-option",
    _slides(move=300000),
    S,
    {"examine_shape": False, "examine_title_bottom_position": True},
)
_pptx(
    "compare_pptx_files", "table-bottom-option", S, S, {"examine_table_bottom_position": True, "examine_shape": False}
)
_pptx("compare_pptx_files", "right-position-option", S, S, {"examine_shape": False, "examine_right_position": True})
_pptx("compare_pptx_files", "top-position-option", S, S, {"examine_shape": False, "examine_top_position": True})
_pptx(
    "compare_pptx_files",
    "shift-size-option",
    _slides(move=300000),
    S,
    {"examine_shape": False, "examine_shape_for_shift_size": True},
)
_pptx("compare_pptx_files", "image-size-option", S, S, {"examine_shape": False, "examine_image_size": True})
_pptx(
    "compare_pptx_files",
    "modify-height-option",
    _slides(move=300000),
    S,
    {"examine_shape": False, "examine_modify_height": True},
)
_pptx(
    "compare_pptx_files",
    "bullets-not-examined",
    _slides(bullets=["Results", "Plan"]),
    S,
    {"examine_shape": False, "examine_bullets": False},
)
_pptx("compare_pptx_files", "missing-result", None, S)
_pptx("compare_pptx_files", "both-missing", None, None)
_pptx("compare_pptx_files", "broken-result", _raw(BROKEN["not-a-zip"], ".pptx"), S)
_pptx("compare_pptx_files", "empty-expected", S, _raw(b"", ".pptx"))
_pptx("compare_pptx_files", "docx-as-result", _doc(), S)

PRS_W, PRS_H = 9144000, 6858000  # python-pptx's default 10 x 7.5 in
_pptx(
    "check_image_stretch_and_center",
    "stretched",
    _slides(picture=(0, 0, PRS_W, PRS_H)),
    _slides(picture=(914400, 914400, 914400, 914400)),
)
_pptx(
    "check_image_stretch_and_center",
    "nearly-stretched",
    _slides(picture=(100000, 100000, PRS_W - 200000, PRS_H - 200000)),
    _slides(picture=(914400, 914400, 914400, 914400)),
)
_pptx(
    "check_image_stretch_and_center",
    "not-stretched",
    _slides(picture=(914400, 914400, 914400, 914400)),
    _slides(picture=(914400, 914400, 914400, 914400)),
)
_pptx("check_image_stretch_and_center", "picture-gone", S, _slides(picture=(914400, 914400, 914400, 914400)))
_pptx("check_image_stretch_and_center", "no-picture-expected", S, S)
_pptx("check_image_stretch_and_center", "missing-result", None, _slides(picture=(0, 0, 10, 10)))

_pptx("check_slide_orientation_Portrait", "portrait", _slides(portrait=True), NO_EXPECTED)
_pptx("check_slide_orientation_Portrait", "landscape", S, NO_EXPECTED)
_pptx("check_slide_orientation_Portrait", "missing", None, NO_EXPECTED)
_pptx("check_slide_orientation_Portrait", "broken", _raw(b"PK", ".pptx"), NO_EXPECTED)

_pptx("evaluate_presentation_fill_to_rgb_distance", "blue", _slides(background=(0, 0, 255)), {"rgb": [0, 0, 255]})
_pptx("evaluate_presentation_fill_to_rgb_distance", "dark-blue", _slides(background=(0, 0, 139)), {"rgb": [0, 0, 255]})
_pptx("evaluate_presentation_fill_to_rgb_distance", "no-background", S, {"rgb": [0, 0, 255]})
_pptx(
    "evaluate_presentation_fill_to_rgb_distance",
    "still-original",
    _slides(background=(255, 255, 255)),
    {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]},
)
_pptx("evaluate_presentation_fill_to_rgb_distance", "no-slides", _slides(slides=0), {"rgb": [0, 0, 255]})

_pptx("check_transition", "dissolve", _slides(transition="dissolve"), {"slide_idx": 0, "transition_type": "dissolve"})
_pptx("check_transition", "fade", _slides(transition="fade"), {"slide_idx": 0, "transition_type": "dissolve"})
_pptx("check_transition", "none", S, {"slide_idx": 0, "transition_type": "dissolve"})
_pptx("check_transition", "no-such-slide", S, {"slide_idx": 5, "transition_type": "dissolve"})
_pptx("check_transition", "broken", _raw(b"x", ".pptx"), {"slide_idx": 0, "transition_type": "dissolve"})

_pptx("check_page_number_colors", "red", _slides(master_colours=["#FF0000", "#FF0000", "#000000"]), {"color": "red"})
_pptx(
    "check_page_number_colors",
    "blue-wanted-red",
    _slides(master_colours=["#0000FF", "#0000FF", "#000000"]),
    {"color": "red"},
)
_pptx("check_page_number_colors", "blue", _slides(master_colours=["#0000FF", "#0000FF", "#000000"]), {"color": "blue"})
_pptx("check_page_number_colors", "plain-hex", _slides(master_colours=["FF0000", "FF0000", "000000"]), {"color": "red"})
_pptx("check_page_number_colors", "default-master", S, {"color": "red"})
_pptx(
    "check_page_number_colors",
    "other-colour-name",
    _slides(master_colours=["#123456", "#123456", "#000000"]),
    {"color": "purple"},
)


def _tree(name: str, xml: Any) -> None:
    add("check_left_panel", "slides", name, lambda d: (xml, NO_EXPECTED, {}))


FRAME = '<desktop><application name="soffice"><document-frame name="{}"/></application></desktop>'
_tree("open", FRAME.format("Slides View"))
_tree("closed", FRAME.format("Outline View"))
_tree("nothing", "<desktop/>")
_tree("not-xml", "<desktop")
_tree("no-tree", None)


# ------------------------------------------------------------------------------------------------------ PDF
class _Files(list):  # type: ignore[type-arg]
    """Several PDFs handed to a metric as a list (a multi-file getter's value)."""


def _pdf(metric: str, module: str, name: str, result: Any, expected: Any, shims: tuple[str, ...] = ()) -> None:
    """``result``/``expected``: pages (lists of lines), raw bytes, None (missing), a dict (rules) or _Files."""

    def build(d: Path) -> Inputs:
        def made(spec: Any, stem: str) -> Any:
            if isinstance(spec, _Files):
                return [made(s, f"{stem}{i}") for i, s in enumerate(spec)]
            if spec is None or isinstance(spec, dict):
                return spec
            if isinstance(spec, bytes):
                return text(d / f"{stem}.pdf", spec)
            return pdf(d / f"{stem}.pdf", spec)

        return made(result, "result"), made(expected, "gold"), {}

    add(metric, module, name, build, shims)


ONE = [["Invoice 243729", "Total: 120.00 EUR"]]
TWO_PAGES = [["Agenda", "1. Welcome"], ["2. Budget", "3. Close"]]
_pdf("check_pdf_pages", "pdf", "one-page", ONE, {"relation": "eq", "ref_value": 1})
_pdf("check_pdf_pages", "pdf", "two-pages", TWO_PAGES, {"relation": "eq", "ref_value": 1})
_pdf("check_pdf_pages", "pdf", "le", TWO_PAGES, {"relation": "le", "ref_value": 2})
_pdf("check_pdf_pages", "pdf", "missing", None, {"relation": "eq", "ref_value": 1})
_pdf("check_pdf_pages", "pdf", "broken", b"%PDF-1.4 nothing else", {"relation": "eq", "ref_value": 1})
_pdf("check_pdf_pages", "pdf", "unknown-relation", ONE, {"relation": "near", "ref_value": 1})

FITZ = ("fitz",)
_pdf("compare_pdfs", "chrome", "same", ONE, ONE, FITZ)
_pdf("compare_pdfs", "chrome", "one-digit", [["Invoice 243729", "Total: 121.00 EUR"]], ONE, FITZ)
_pdf("compare_pdfs", "chrome", "other-text", TWO_PAGES, ONE, FITZ)
_pdf("compare_pdfs", "chrome", "missing-result", None, ONE, FITZ)
_pdf("compare_pdfs", "chrome", "both-missing", None, None, FITZ)
_pdf("compare_pdfs", "chrome", "broken-result", b"not a pdf", ONE, FITZ)
_pdf(
    "compare_pdfs",
    "chrome",
    "lists",
    _Files([ONE, TWO_PAGES]),
    _Files([ONE, [["Agenda", "1. Welcome"], ["2. Budget"]]]),
    FITZ,
)
_pdf("compare_pdfs", "chrome", "lists-one-missing", _Files([ONE, None]), _Files([ONE, TWO_PAGES]), FITZ)
_pdf("compare_pdfs", "chrome", "list-expected-single-result", ONE, _Files([ONE, ONE]), FITZ)
_pdf("compare_pdfs", "chrome", "list-expected-no-result", None, _Files([ONE]), FITZ)


# ------------------------------------------------------------------------------------------------- settings
WRITER_FONT = "/org.openoffice.Office.Writer/DefaultFont"


def _conf(metric: str, module: str, name: str, body: str | bytes | None, rules: Any) -> None:
    def build(d: Path) -> Inputs:
        return None if body is None else text(d / "registrymodifications.xcu", body), rules, {}

    add(metric, module, name, build)


def _xcu_text(items: list[tuple[str, str, str]]) -> Callable[[Path], Path]:
    return lambda p: xcu(p, items)


def _xcu(metric: str, module: str, name: str, items: list[tuple[str, str, str]] | None, rules: Any) -> None:
    def build(d: Path) -> Inputs:
        return None if items is None else xcu(d / "registrymodifications.xcu", items), rules, {}

    add(metric, module, name, build)


TNR = {"font_name": "Times New Roman"}
_xcu("find_default_font", "docs", "set", [(WRITER_FONT, "Standard", "Times New Roman")], TNR)
_xcu("find_default_font", "docs", "other-font", [(WRITER_FONT, "Standard", "Liberation Serif")], TNR)
_xcu("find_default_font", "docs", "heading-font-only", [(WRITER_FONT, "Heading", "Times New Roman")], TNR)
_xcu(
    "find_default_font",
    "docs",
    "last-wins",
    [(WRITER_FONT, "Standard", "Times New Roman"), (WRITER_FONT, "Standard", "Arial")],
    TNR,
)
_xcu("find_default_font", "docs", "missing", None, TNR)
_conf("find_default_font", "docs", "not-xml", "<oor:items", TNR)

PRESENTER = "/org.openoffice.Office.Impress/Misc/Start"
_xcu(
    "check_presenter_console_disable",
    "slides",
    "disabled",
    [(PRESENTER, "EnablePresenterScreen", "false")],
    NO_EXPECTED,
)
_xcu(
    "check_presenter_console_disable", "slides", "enabled", [(PRESENTER, "EnablePresenterScreen", "true")], NO_EXPECTED
)
_xcu("check_presenter_console_disable", "slides", "unset", [(PRESENTER, "Other", "false")], NO_EXPECTED)
_xcu("check_presenter_console_disable", "slides", "missing", None, NO_EXPECTED)
_conf("check_presenter_console_disable", "slides", "not-xml", "garbage", NO_EXPECTED)

SAVE = "/org.openoffice.Office.Common/Save/Document"
_xcu("check_auto_saving_time", "slides", "three", [(SAVE, "AutoSaveTimeIntervall", "3")], {"minutes": 3})
_xcu("check_auto_saving_time", "slides", "ten", [(SAVE, "AutoSaveTimeIntervall", "10")], {"minutes": 3})
_xcu("check_auto_saving_time", "slides", "unset", [(SAVE, "AutoSave", "true")], {"minutes": 3})
_xcu("check_auto_saving_time", "slides", "not-a-number", [(SAVE, "AutoSaveTimeIntervall", "soon")], {"minutes": 3})
_xcu("check_auto_saving_time", "slides", "missing", None, {"minutes": 3})
_conf("check_auto_saving_time", "slides", "not-xml", "<x", {"minutes": 3})

GIMPRC = '# GIMP gimprc\n\n(theme "Light")\n(undo-levels 100)\n(layer-new-name "Square")\n(show-tips no)\n'


def _gimp(name: str, body: str | bytes | None, rules: dict[str, Any]) -> None:
    add("check_config_status", "gimp", name, lambda d: (None if body is None else text(d / "gimprc", body), rules, {}))


_gimp("theme", GIMPRC, {"type:": "key-value", "key": "theme", "value": '"Light"'})
_gimp("theme-dark", GIMPRC.replace("Light", "Dark"), {"type:": "key-value", "key": "theme", "value": '"Light"'})
_gimp("undo-levels", GIMPRC, {"type:": "key-value", "key": "undo-levels", "value": "100"})
_gimp(
    "history-item",
    '(history-item "filters-vignette" 1)\n',
    {"key": ["history-item", '"filters-vignette"'], "value": "1"},
)
_gimp(
    "history-item-other",
    '(history-item "filters-blur" 1)\n',
    {"key": ["history-item", '"filters-vignette"'], "value": "1"},
)
_gimp("one-word-line-before", "(single)\n" + GIMPRC, {"key": ["history-item", '"x"'], "value": "1"})
_gimp("blank-line-with-spaces", "   \n" + GIMPRC, {"key": "theme", "value": '"Light"'})
_gimp("missing", None, {"key": "theme", "value": '"Light"'})
_gimp(
    "sessionrc",
    '(session-info "toplevel"\n    (factory-entry "gimp-single-image-window"))\n(hide-docks yes)\n',
    {"key": "hide-docks", "value": "yes"},
)


# -------------------------------------------------------------------------- the shipped suite's own files
def _suite_cases() -> None:
    """Each task of osfleet's ``osworld`` suite that uses these metrics, scored on its committed files: the input
    the agent starts from against the expected file (must fail) and the expected file against itself."""
    import json

    import osfleet.tasks.suites as suites

    bundle = Path(suites.__file__).parent / "osworld"
    names = {u["url"]: u["file"] for u in json.loads((bundle / "assets" / "manifest.json").read_text())["files"]}
    modules = {"compare_table": "table", "compare_docx_files": "docs"}
    for task_file in sorted(bundle.glob("*.json")):
        task = json.loads(task_file.read_text())
        ev = task["evaluator"]
        if ev.get("func") not in modules:
            continue
        downloads = [
            f["url"] for step in task["config"] if step["type"] == "download" for f in step["parameters"]["files"]
        ]
        start = downloads[0]
        for label, first in (("start", names[start]), ("gold", names[ev["expected"]["path"]])):

            def build(d: Path, first: str = first, gold: str = names[ev["expected"]["path"]], ev: Any = ev) -> Inputs:
                # the getters name files after the task's ``dest``, whose extension the metrics go by
                result = d / f"result{Path(first).suffix}"
                result.write_bytes((bundle / "assets" / first).read_bytes())
                expected = d / ev["expected"]["dest"]
                expected.write_bytes((bundle / "assets" / gold).read_bytes())
                return result, expected, ev.get("options") or {}

            add(ev["func"], modules[ev["func"]], f"suite-{task['id']}-{label}", build)


_suite_cases()
