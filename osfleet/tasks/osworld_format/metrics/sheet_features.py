"""What ``compare_table`` reads of a sheet besides its values: charts, pivot tables, cell styles (with the
conditional formats that apply), row and column properties, and value rules (``{"method", "ref"}``).

Each reader returns a plain value that two sheets are compared by (``==``), with OSWorld's semantics:
- charts: keyed by their series (``values,categories`` references joined by ``;``), each with the asked
  properties (``title``, ``legend``, ``anchor``, ``width``, ``height``, ``type``, ``direction``,
  ``xtitle``/``ytitle``/``ztitle``; a title that cannot be read is None);
- pivot tables: keyed by their source range (trimmed of fields with no items), with ``name``, ``show_*``,
  ``location``, ``selection``/``filter`` (items per field, as sets unless ``ordered``), ``col_fields``,
  ``row_fields`` and ``data_fields`` (``field;name;subtotal;showDataAs``);
- styles: every cell from A1 to the sheet's last cell, then the cells a conditional format makes active,
  with the differential style of that format. A conditional format's formula is evaluated by the
  ``formulas`` package with the cell's own value as its first reference and the values of absolute ranges
  (``$A$1:$B$2``) after it (a lone absolute cell such as ``$A$1`` cannot be read and fails the rule); the
  first 50 empty cells of a format are skipped, then an empty cell ends each range;
- a sheet that does not exist has no charts, pivots, styles or dimensions.
Reading a sheet's style touches every cell of its used area, so a sheet over ``MAX_STYLED_CELLS`` is refused.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import operator
import re
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored
from osfleet.tasks.osworld_format.metrics.sheet_xml import RawCells

MAX_STYLED_CELLS = 2_000_000
_ABSOLUTE = re.compile(r"\$([A-Z]{1,3})\$(\d+)(?::\$([A-Z]{1,3})\$(\d+))?")
_COMPARE = {"eq", "ne", "le", "lt", "ge", "gt"}


def matches(value: Any, rule: dict[str, Any]) -> bool:
    """``value`` against ``{"method", "ref"}``: ``re[.FLAG...]``, ``eq``/``ne``/``lt``/``le``/``gt``/``ge``,
    ``approx:<tolerance>``, ``spreadsheet_range`` (``ref`` = [inner, outer]: value covers inner, lies in
    outer), ``range.<l><r>`` (``e`` or ``t`` at each end: ``range.te`` is ref[0] < v <= ref[1]),
    ``str_list_eq``/``str_set_eq`` (a comma-separated string against a list)."""
    method = rule["method"]
    if method.startswith("re"):
        flags = functools.reduce(operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0))
        return re.search(rule["ref"], value, flags) is not None
    if method in _COMPARE:
        return bool(getattr(operator, method)(value, rule["ref"]))
    if method.startswith("approx"):
        tolerance = float(method.split(":")[1])
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return abs(number - rule["ref"]) <= tolerance
    if method == "spreadsheet_range":
        from openpyxl.worksheet.cell_range import MultiCellRange

        inner, outer = MultiCellRange(rule["ref"][0]), MultiCellRange(rule["ref"][1])
        return all(r in value for r in inner) and all(r in outer for r in value)
    if method.startswith("range."):
        low, high = method[6], method[7]
        return bool(getattr(operator, "l" + low)(rule["ref"][0], value)) and bool(
            getattr(operator, "l" + high)(value, rule["ref"][1])
        )
    if method in ("str_list_eq", "str_set_eq"):
        container = getattr(builtins, method[4:-3])
        return bool(container(value.strip("\"'").split(",")) == container(rule["ref"]))
    raise NotScored(f"unknown value rule method {method!r}")


def _first_run_text(title: Any) -> Any:
    try:
        return title.tx.rich.p[0].r[0].t
    except Exception:  # noqa: BLE001  (OSWorld: a title it cannot read is None)
        return None


def _ref(source: Any, *kinds: str) -> str:
    for kind in kinds:
        ref = getattr(source, kind, None) if source is not None else None
        if ref is not None and hasattr(ref, "f"):
            return str(ref.f)
    return ""


def charts(book: Any, sheet: str, props: set[str]) -> dict[str, Any]:
    if sheet not in book:
        return {}
    out: dict[str, Any] = {}
    for chart in book[sheet]._charts:
        key = ";".join(f"{_ref(s.val, 'numRef', 'strRef')},{_ref(s.cat, 'numRef', 'strRef')}" for s in chart.series)
        info: dict[str, Any] = {}
        if "title" in props:
            info["title"] = _first_run_text(chart.title)
        if "legend" in props:
            info["legend"] = chart.legend.position if chart.legend is not None else None
        if "anchor" in props:
            a = chart.anchor
            info["anchor"] = [a.editAs, a._from.col, a.to.row, a.to.col, a.to.row]
        if "width" in props:
            info["width"] = chart.width
        if "height" in props:
            info["height"] = chart.height
        if "type" in props:
            info["type"] = chart.tagname
        if "direction" in props:
            info["direction"] = chart.barDir
        for axis in ("x", "y", "z"):
            if f"{axis}title" in props:
                try:
                    title = getattr(chart, f"{axis}_axis").title
                except AttributeError:
                    title = None
                info[f"{axis}title"] = _first_run_text(title)
        out[key] = info
    return out


def _trim_empty(fields: list[list[Any]]) -> tuple[list[list[Any]], int, int]:
    """Fields without items dropped at both ends, and how many were dropped on the left and right."""
    left = len(list(itertools.takewhile(lambda f: not f, fields)))
    kept = fields[left:]
    right = len(list(itertools.takewhile(lambda f: not f, reversed(kept))))
    return kept[: len(kept) - right], left, right


def pivots(book: Any, sheet: str, props: set[str]) -> dict[str, Any]:
    from openpyxl.utils import coordinate_to_tuple

    if sheet not in book:
        return {}
    out: dict[str, Any] = {}
    for pivot in book[sheet]._pivots:
        items = [[(i.h, i.x) for i in f.items if i.x is not None] for f in pivot.pivotFields]
        selection, left, right = _trim_empty(items)
        source = pivot.cache.cacheSource
        first, last = source.worksheetSource.ref.split(":")
        r1, c1 = coordinate_to_tuple(first)
        r2, c2 = coordinate_to_tuple(last)
        key = f"{source.type};{(r1, c1 + left)}:{(r2, c2 - right)};{source.worksheetSource.sheet}"
        info: dict[str, Any] = {}
        if "name" in props:
            info["name"] = pivot.name
        for prop, attr in (
            ("show_total", "visualTotals"),
            ("show_empty_row", "showEmptyRow"),
            ("show_empty_col", "showEmptyCol"),
            ("show_headers", "showHeaders"),
            ("location", "location"),
        ):
            if prop in props:
                info[prop] = getattr(pivot, attr)
        if "filter" in props or "selection" in props:
            info["selection"] = selection if "ordered" in props else [set(f) for f in selection]
        if "filter" in props:
            info["filter_fields"] = {f.fld for f in pivot.pageFields}
        if "col_fields" in props:
            info["col_fields"] = [f.x - left for f in pivot.colFields]
        if "row_fields" in props:
            info["row_fields"] = [f.x - left for f in pivot.rowFields]
        if "data_fields" in props:
            named = "data_fields_name" in props
            info["data_fields"] = [
                f"{f.fld - left:d};{f.name if named else ''};{f.subtotal};{f.showDataAs}" for f in pivot.dataFields
            ]
        out[key] = info
    return out


def cell_style(name: str, cell: Any, diff: Any = None) -> Any:
    """One style property of a cell (or of a conditional format's differential style applied to it); None
    for an empty cell. Colours are aRGB strings (``FFFF0000``)."""
    value = cell.value
    if name == "number_format":
        if value is None or cell.data_type != "n":
            return None
        return cell.number_format if diff is None else diff.numFmt.formatCode
    font_attr = {
        "font_name": "name",
        "font_family": "family",
        "font_bold": "bold",
        "font_italic": "italic",
        "font_underline": "underline",
        "font_size": "size",
    }
    if name in font_attr:
        return getattr((diff or cell).font, font_attr[name]) if value is not None else None
    if name == "font_color":
        return (diff or cell).font.color.rgb if value is not None else None
    if name == "fill_type":
        try:
            return (diff or cell).fill.tagname
        except Exception:  # noqa: BLE001  (OSWorld: unreadable is None)
            return None
    if name in ("bgcolor", "fgcolor"):
        try:
            return diff.fill.bgColor.rgb if diff is not None else cell.fill.fgColor.rgb
        except Exception:  # noqa: BLE001
            return None
    if name == "hyperlink":
        return cell.hyperlink or "" if value is not None else None
    if name == "merge":
        from openpyxl.cell.cell import MergedCell

        return isinstance(cell, MergedCell)
    raise NotScored(f"unsupported style {name!r}")


def _cf_arguments(text: str, raw: RawCells, sheet: str) -> list[Any]:
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import CellRange

    args: list[Any] = []
    for col1, row1, col2, row2 in _ABSOLUTE.findall(text):
        # OSWorld reads every match as a range, so a lone absolute cell ("$B$1") is "B1:", which raises.
        cells = CellRange(f"{col1}{row1}:{col2}{row2}").cells
        args.append([raw.value(sheet, f"{get_column_letter(c)}{r}") for r, c in cells])
    return args


def _cell_is(op: str, value: Any, refs: list[Any]) -> Any:
    """A ``cellIs`` condition, the cell's value on the left; a comparison of mismatched types is false."""
    try:
        if op == "between":
            return value >= min(refs) and value <= max(refs)
        if op == "notBetween":
            return value < min(refs) or value > max(refs)
        ops = {
            "lessThanOrEqual": operator.le,
            "lessThan": operator.lt,
            "equal": operator.eq,
            "greaterThanOrEqual": operator.ge,
            "notEqual": operator.ne,
            "greaterThan": operator.gt,
        }
        if op not in ops:
            raise NotScored(f"conditional format operator {op!r}")
        return ops[op](value, refs[0])
    except (TypeError, IndexError):
        return False


_EXPRESSION_TYPES = {
    "expression",
    "containsText",
    "notContainsText",
    "endsWith",
    "beginsWith",
    "containsErrors",
    "notContainsErrors",
}


def styles(book: Any, sheet: str, path: str, props: list[str]) -> dict[str, list[Any]]:
    if sheet not in book:
        return {}
    ws = book[sheet]
    if ws.max_row * ws.max_column > MAX_STYLED_CELLS:
        raise NotScored(f"sheet {sheet!r} spans {ws.max_row} x {ws.max_column} cells, too many to compare styles")
    out: dict[str, list[Any]] = {}
    for column in ws.iter_cols():
        for cell in column:
            out[cell.coordinate] = [cell_style(p, cell) for p in props]
    _conditional_styles(ws, sheet, RawCells(path), props, out)
    return out


def _conditional_styles(ws: Any, sheet: str, raw: RawCells, props: list[str], out: dict[str, list[Any]]) -> None:
    import formulas
    from openpyxl.utils import get_column_letter

    parser = formulas.Parser()
    # The condition in force carries over from one rule to the next, as in OSWorld: a rule of a type it does
    # not evaluate (top10, duplicates...) tests its cells with the previous rule's condition, if any.
    state: dict[str, Any] = {"kind": None}
    for fmt in ws.conditional_formatting:
        for rule in fmt.rules:
            compiled, arg_lists, broken = [], [], False
            for text in rule.formula:
                try:
                    func = parser.ast("=" + text)[1].compile()
                except Exception:  # noqa: BLE001  (OSWorld: a formula it cannot parse skips the rule)
                    broken = True
                    break
                state["arguments"] = _cf_arguments(text, raw, sheet)
                compiled.append(func)
                arg_lists.append(state["arguments"])
            if broken:
                continue
            if rule.type in _EXPRESSION_TYPES:
                state.update(kind="expression", condition=compiled[0], arguments=arg_lists[0])
            elif rule.type == "cellIs":
                try:
                    refs = [f() for f in compiled]
                except Exception:  # noqa: BLE001  (OSWorld: references it cannot compute skip the rule)
                    continue
                state.update(kind="cellIs", operator=rule.operator, references=refs)

            active = []
            empties = 0
            for cell_range in fmt.cells:
                for row, col in cell_range.cells:
                    cell = ws.cell(row=row, column=col)
                    value = raw.value(sheet, f"{get_column_letter(col)}{row}")
                    if value is None:
                        empties += 1
                        if empties > 50:
                            break
                        continue
                    try:
                        if state["kind"] == "expression":
                            hit = state["condition"](value, *state["arguments"])
                        elif state["kind"] == "cellIs":
                            hit = _cell_is(state["operator"], value, state["references"])
                        else:
                            hit = False  # no condition yet
                    except Exception:  # noqa: BLE001  (OSWorld: a condition that fails is not met)
                        hit = False
                    if hit:  # outside the guard, as in OSWorld: an ambiguous truth value fails the metric
                        active.append(cell)
            for cell in active:
                out[cell.coordinate] = [cell_style(p, cell, rule.dxf) for p in props]


def dimensions(book: Any, sheet: str, kind: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    """``row_dimensions`` or ``column_dimensions`` entries the file defines, with the asked properties."""
    if sheet not in book:
        return {}
    holder = getattr(book[sheet], f"{kind}_dimensions")
    wanted = set(props)
    return {key: {p: getattr(dims, p) for p in wanted} for key, dims in holder.items()}
