"""OSWorld metrics on real files made in the test (openpyxl, python-docx, python-pptx): no VM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pytest
from pptx import Presentation
from pptx.util import Inches

from osfleet.tasks.model import UnsupportedTaskError
from osfleet.tasks.osworld_format.metrics import run_metric

pytestmark = pytest.mark.system


def xlsx(path: Path, rows: list[list[Any]], formats: dict[str, str] | None = None, title: str = "Sheet1") -> Path:
    wb = openpyxl.Workbook()
    ws = wb.active
    assert ws is not None
    ws.title = title
    for row in rows:
        ws.append(row)
    for cell, fmt in (formats or {}).items():
        ws[cell].number_format = fmt
    wb.save(path)
    return path


def test_sheet_data_equal_and_different(tmp_path: Path) -> None:
    a = xlsx(tmp_path / "a.xlsx", [["name", "qty"], ["pen", 3], ["ink", 2.5]])
    b = xlsx(tmp_path / "b.xlsx", [["name", "qty"], ["pen", 3.0], ["ink", 2.5], [None, None]])
    c = xlsx(tmp_path / "c.xlsx", [["name", "qty"], ["pen", 4], ["ink", 2.5]])
    rules = {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]}
    assert run_metric("compare_table", a, b, rules)[0] == 1.0  # 3 == 3.0, trailing empty row ignored
    score, detail = run_metric("compare_table", a, c, rules)
    assert score == 0.0 and "differ" in detail


def test_an_integer_sheet_index_is_the_results_nth_sheet(tmp_path: Path) -> None:
    """OSWorld's task files write ``"sheet_idx0": 0`` (61 of them): the result's first sheet, as in OSWorld."""
    a = xlsx(tmp_path / "a.xlsx", [["name", "qty"], ["pen", 3]])
    b = xlsx(tmp_path / "b.xlsx", [["name", "qty"], ["pen", 3]], title="Gold")
    rules = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    assert run_metric("compare_table", a, b, rules) == (1.0, "1 rule(s) hold")


def test_sheet_print_compares_the_csv_libreoffice_exported_beside_each_workbook(tmp_path: Path) -> None:
    """OSWorld's sheet_print reads ``<workbook>-<sheet>.csv`` (exported in the guest by a post-config
    ``libreoffice --convert-to csv``), not the workbook: osfleet used to format cells itself (a task's expected
    file then scored 1 in osfleet and 0 in OSWorld); now a workbook without its CSV scores 0, as in OSWorld."""
    a = xlsx(tmp_path / "a.xlsx", [["share", 0.5]], {"B1": "0%"})
    b = xlsx(tmp_path / "b.xlsx", [["share", "50%"]])
    printed = {"rules": [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}
    score, detail = run_metric("compare_table", a, b, printed)
    assert score == 0.0 and "no exported CSV" in detail
    (tmp_path / "a-Sheet1.csv").write_text("share,50%\n")
    (tmp_path / "b-Sheet1.csv").write_text("share,50%\n\n")
    assert run_metric("compare_table", a, b, printed)[0] == 1.0
    (tmp_path / "b-Sheet1.csv").write_text("share,0.5\n")
    assert run_metric("compare_table", a, b, printed)[0] == 0.0


def test_sheet_references_by_name_and_rules_required(tmp_path: Path) -> None:
    a = xlsx(tmp_path / "a.xlsx", [[1, 2]], title="Data")
    b = xlsx(tmp_path / "b.xlsx", [[1, 2]], title="Data")
    by_name = {"rules": [{"type": "sheet_data", "sheet_idx0": "RNData", "sheet_idx1": "ENData"}]}
    assert run_metric("compare_table", a, b, by_name)[0] == 1.0
    score, detail = run_metric("compare_table", a, b, {})  # OSWorld's function needs rules (it raises)
    assert score == 0.0 and "rules" in detail


def test_compare_table_scores_missing_or_corrupt_files_zero(tmp_path: Path) -> None:
    good = xlsx(tmp_path / "a.xlsx", [[1]])
    junk = tmp_path / "junk.xlsx"
    junk.write_text("not a zip")
    rules = {"rules": [{"type": "sheet_name"}]}
    assert run_metric("compare_table", None, good, rules)[0] == 0.0
    assert run_metric("compare_table", junk, good, rules)[0] == 0.0
    score, detail = run_metric("compare_table", good, junk, rules)
    assert score == 0.0 and "expected file cannot be opened" in detail
    score, detail = run_metric("compare_table", good, good, {"rules": [{"type": "sheet_fuzzy"}]})
    assert score == 0.0 and "compare_table" in detail


def docx_file(path: Path, paragraphs: list[str]) -> Path:
    d = docx.Document()
    for text in paragraphs:
        d.add_paragraph(text)
    d.save(str(path))
    return path


def test_compare_docx_files(tmp_path: Path) -> None:
    a = docx_file(tmp_path / "a.docx", ["Title", "", "Body  text"])
    b = docx_file(tmp_path / "b.docx", ["Title", "Body text"])
    c = docx_file(tmp_path / "c.docx", ["Body text", "Title"])
    assert run_metric("compare_docx_files", a, b, {})[0] == 1.0  # blanks ignored by default
    assert run_metric("compare_docx_files", a, b, {"ignore_blanks": False})[0] == 0.0
    assert run_metric("compare_docx_files", b, c, {})[0] == 0.0
    assert run_metric("compare_docx_files", b, c, {"ignore_order": True})[0] == 1.0
    assert run_metric("compare_docx_files", b, docx_file(tmp_path / "d.docx", ["title", "body text"]), {})[0] == 0.0
    assert run_metric("compare_docx_files", b, tmp_path / "d.docx", {"ignore_case": True})[0] == 1.0


def pptx_file(path: Path, slides: list[str], left: float = 1.0) -> Path:
    prs = Presentation()
    for text in slides:
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        box = slide.shapes.add_textbox(Inches(left), Inches(1), Inches(4), Inches(1))
        box.text_frame.text = text
    prs.save(str(path))
    return path


def test_compare_pptx_files(tmp_path: Path) -> None:
    a = pptx_file(tmp_path / "a.pptx", ["one", "two"])
    assert run_metric("compare_pptx_files", a, pptx_file(tmp_path / "b.pptx", ["one", "two"]), {})[0] == 1.0
    assert run_metric("compare_pptx_files", a, pptx_file(tmp_path / "c.pptx", ["one"]), {})[0] == 0.0
    assert run_metric("compare_pptx_files", a, pptx_file(tmp_path / "d.pptx", ["one", "2"]), {})[0] == 0.0
    moved = pptx_file(tmp_path / "e.pptx", ["one", "two"], left=2.0)
    assert run_metric("compare_pptx_files", a, moved, {})[0] == 0.0
    assert run_metric("compare_pptx_files", a, moved, {"examine_shape": False})[0] == 1.0


def test_compare_text_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("Hello  World\n\n")
    b.write_text("hello world")
    assert run_metric("compare_text_file", a, b, {})[0] == 0.0
    assert run_metric("compare_text_file", a, b, {"ignore_blanks": True, "ignore_case": True})[0] == 1.0
    assert run_metric("compare_text_file", None, b, {})[0] == 0.0


def test_check_json(tmp_path: Path) -> None:
    f = tmp_path / "settings.json"
    f.write_text(json.dumps({"editor": {"fontSize": 14, "theme": "dark"}, "tabs": [2, 4]}))
    rules = {
        "expect": [
            {"key": ["editor", "fontSize"], "method": "eq", "ref": 14},
            {"key": ["tabs", 1], "method": "ge", "ref": 4},
            {"key": ["editor", "theme"], "method": "re", "ref": "^da"},
        ],
        "unexpect": [{"key": ["editor", "wordWrap"], "method": "eq", "ref": "on"}],
    }
    assert run_metric("check_json", f, rules, {})[0] == 1.0
    bad = {"expect": [{"key": ["editor", "fontSize"], "method": "eq", "ref": 12}]}
    assert run_metric("check_json", f, bad, {})[0] == 0.0
    assert run_metric("check_json", f, {"unexpect": [{"key": "tabs", "method": "has", "ref": 2}]}, {})[0] == 0.0
    y = tmp_path / "c.yaml"
    y.write_text("a: {b: 1}\n")
    assert (
        run_metric("check_json", y, {"expect": [{"key": ["a", "b"], "method": "eq", "ref": 1}]}, {"is_yaml": True})[0]
        == 1.0
    )
    assert (
        run_metric("check_json", y, {"expect": [{"key": ["a", "b"], "ref": 1}]}, {"is_yaml": True})[0] == 0.0
    )  # no method
    assert run_metric("check_json", y, {"expect": []}, {})[0] == 0.0  # not JSON


def test_literal_is_in_list_exact_include() -> None:
    assert run_metric("literal_match", "Done", "done", {"ignore_case": True})[0] == 1.0
    assert run_metric("literal_match", "Done", "done", {})[0] == 0.0
    assert run_metric("literal_match", ["A", "b"], ["a", "B"], {"type": "list", "ignore_case": True})[0] == 1.0
    assert run_metric("is_in_list", ["x", "y"], {"expected": "y"}, {})[0] == 1.0
    assert run_metric("is_in_list", ["x"], {"expected": "y"}, {})[0] == 0.0
    assert run_metric("exact_match", "ok", {"expected": "ok"}, {})[0] == 1.0
    assert run_metric("check_include_exclude", "a b", {"include": ["a"], "exclude": ["c"]}, {})[0] == 1.0
    assert run_metric("check_include_exclude", "a c", {"include": ["a"], "exclude": ["c"]}, {})[0] == 0.0


def test_a_metric_given_the_wrong_kind_of_value_scores_zero() -> None:
    score, detail = run_metric("exact_match", "x", "not rules", {})
    assert score == 0.0 and "cannot compare" in detail


def test_unknown_metric_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedTaskError, match="compare_no_such_thing"):
        run_metric("compare_no_such_thing", None, None, {})
    with pytest.raises(UnsupportedTaskError, match="compare_audios_by_dl_model"):
        run_metric("compare_audios_by_dl_model", None, None, {})
