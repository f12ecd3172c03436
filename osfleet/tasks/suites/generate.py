"""Writes the ``osworld`` suite: OSWorld-format task files written for osfleet, their input and expected files.

The Calc, Writer and terminal tasks are here; Impress and PDF in ``documents``, Chrome, GIMP, VLC, VS Code,
Thunderbird and the accessibility tree in ``apps``, the system and multi-app tasks in ``system``.

Run ``python -m osfleet.tasks.suites.generate`` after changing a task here; the output (the bundle folder
``osfleet/tasks/suites/osworld/``: one JSON file per task and ``assets/`` with ``manifest.json``) is committed,
so hosts need none of this at run time. Inputs and expected files are made with openpyxl and python-docx, so each
expected file is exactly what the instruction asks for. The Calc tasks are a table of data (``CALC_TASKS``): a
workbook's rows, the rows an exact answer leaves and the oracle of each task side by side.

Each task carries its oracle under ``osfleet_oracle`` (a key OSWorld ignores): shell commands in the guest
(python3 with openpyxl/python-docx from the office image's Debian packages). They are CLI oracles because a
GUI oracle under TCG emulation would take minutes per task; agents are free to use the applications.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfleet.tasks.suites import apps, documents, system
from osfleet.tasks.suites.common import (
    BUNDLE,
    HOME,
    SHEET_DATA,
    URL_BASE,
    docx,
    download,
    python,
    shell,
    table,
    task,
    xlsx,
)

# "Shown as a whole percentage": the values, and the number format each share cell displays with. (OSWorld's
# own tasks check display with sheet_print, which reads CSV files LibreOffice exports in the guest after the
# task; that needs a multi-file vm_file getter, which osfleet does not run yet.)
PERCENT_SHARES: list[dict[str, Any]] = [
    {"type": "sheet_data", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"},
    *(
        {
            "type": "check_cell",
            "sheet_idx": "RNSheet1",
            "coordinate": cell,
            "props": {"number_format": {"method": "eq", "ref": "0%"}},
        }
        for cell in ("C2", "C3")
    ),
]


@dataclass(frozen=True)
class CalcTask:
    """One Calc task as a row of data. The rows of a workbook, the file an exact answer leaves and the oracle
    sit side by side, so a reader checks an instruction against its answer in one place and a new task is one
    more row; ``_calc_task`` makes every row's files, evaluator and oracle the same way."""

    task_id: str
    instruction: str
    book: str  # the workbook: asset ``<book>.xlsx``, downloaded to ``~/<book>.xlsx``
    rows: list[list[Any]]
    gold: str  # the expected file's asset name: a workbook, or a CSV export of ``expected`` (``.csv``)
    expected: list[list[Any]]
    oracle: str  # python3 in the guest; ``{doc!r}`` is the workbook's path there, ``{target!r}`` ``~/<book>.csv``
    rules: list[dict[str, Any]] = field(default_factory=lambda: SHEET_DATA)  # compare_table's, for a workbook
    title: str = "Sheet1"  # the expected workbook's sheet
    formats: dict[str, str] | None = None  # the expected workbook's number formats, by cell


CALC_TASKS = [
    CalcTask(
        "calc-total-row",
        instruction="In sales.xlsx, add a row under the items with 'Total' in column A and the sum of the "
        "quantities in column B, then save the file in its format.",
        book="sales",
        rows=[["Item", "Qty"], ["pens", 12], ["ink", 5], ["paper", 30]],
        gold="sales-total-gold.xlsx",
        expected=[["Item", "Qty"], ["pens", 12], ["ink", 5], ["paper", 30], ["Total", 47]],
        oracle="""
import openpyxl
wb = openpyxl.load_workbook({doc!r}); ws = wb.active
ws.append(["Total", sum(r[1].value for r in ws.iter_rows(min_row=2))]); wb.save({doc!r})""",
    ),
    CalcTask(
        "calc-sort-by-name",
        instruction="Sort the rows of people.xlsx by Name from A to Z (keep the header row on top) and save the file.",
        book="people",
        rows=[["Name", "Age"], ["Maria", 41], ["Ben", 29], ["Zoe", 35], ["Anil", 52]],
        gold="people-sorted-gold.xlsx",
        expected=[["Name", "Age"], ["Anil", 52], ["Ben", 29], ["Maria", 41], ["Zoe", 35]],
        oracle="""
import openpyxl
wb = openpyxl.load_workbook({doc!r}); ws = wb.active
rows = sorted(([c.value for c in r] for r in ws.iter_rows(min_row=2)), key=lambda r: str(r[0]))
ws.delete_rows(2, ws.max_row)
for r in rows: ws.append(r)
wb.save({doc!r})""",
    ),
    CalcTask(
        "calc-percent-share",
        instruction="In votes.xlsx, add a column C headed 'Share' with each team's share of all votes, shown as a "
        "whole percentage (like 75%), and save the file.",
        book="votes",
        rows=[["Team", "Votes"], ["North", 30], ["South", 10]],
        gold="votes-share-gold.xlsx",
        expected=[["Team", "Votes", "Share"], ["North", 30, 0.75], ["South", 10, 0.25]],
        oracle="""
import openpyxl
wb = openpyxl.load_workbook({doc!r}); ws = wb.active
total = sum(r[1].value for r in ws.iter_rows(min_row=2))
ws["C1"] = "Share"
for r in range(2, ws.max_row + 1):
    ws.cell(r, 3, ws.cell(r, 2).value / total).number_format = "0%"
wb.save({doc!r})""",
        rules=PERCENT_SHARES,
        formats={"C2": "0%", "C3": "0%"},
    ),
    CalcTask(
        "calc-rename-sheet",
        instruction="Rename the sheet of budget.xlsx from 'Sheet1' to 'Budget' and save the file.",
        book="budget",
        rows=[["Month", "Spent"], ["Jan", 120], ["Feb", 95]],
        gold="budget-renamed-gold.xlsx",
        expected=[["Month", "Spent"], ["Jan", 120], ["Feb", 95]],
        oracle="""
import openpyxl
wb = openpyxl.load_workbook({doc!r}); wb.active.title = "Budget"; wb.save({doc!r})""",
        rules=[{"type": "sheet_name"}, {"type": "sheet_data", "sheet_idx0": "RNBudget", "sheet_idx1": "ENBudget"}],
        title="Budget",
    ),
    CalcTask(
        "calc-uppercase-header",
        instruction="Change the column headings of contacts.xlsx to capital letters (NAME, CITY) and save the file.",
        book="contacts",
        rows=[["name", "city"], ["Ana", "Lisbon"], ["Kofi", "Accra"]],
        gold="contacts-upper-gold.xlsx",
        expected=[["NAME", "CITY"], ["Ana", "Lisbon"], ["Kofi", "Accra"]],
        oracle="""
import openpyxl
wb = openpyxl.load_workbook({doc!r}); ws = wb.active
for c in ws[1]: c.value = c.value.upper()
wb.save({doc!r})""",
    ),
    CalcTask(
        "calc-export-csv",
        instruction="Export the sheet of cities.xlsx as comma-separated text to ~/cities.csv (same rows, no quotes "
        "needed).",
        book="cities",
        rows=[["City", "Country"], ["Lagos", "Nigeria"], ["Lima", "Peru"], ["Oslo", "Norway"]],
        gold="cities-gold.csv",
        expected=[["City", "Country"], ["Lagos", "Nigeria"], ["Lima", "Peru"], ["Oslo", "Norway"]],
        oracle="""
import csv, openpyxl
ws = openpyxl.load_workbook({doc!r}).active
with open({target!r}, "w", newline="") as f:
    csv.writer(f, lineterminator="\\n").writerows([[c.value for c in r] for r in ws.iter_rows()])""",
    ),
]


def _calc_evaluator(assets: Path, row: CalcTask, doc: str, target: str) -> dict[str, Any]:
    """The evaluator of ``row``, its expected file written: a CSV has no sheets for compare_table's rules, so an
    export is compared as text (compare_text_file); a workbook is compared with compare_table under the rules."""
    if not row.gold.endswith(".csv"):
        xlsx(assets / row.gold, row.expected, title=row.title, formats=row.formats)
        return table(doc, row.gold, row.rules)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(row.expected)
    (assets / row.gold).write_text(out.getvalue())
    return {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": target, "dest": Path(target).name},
        "expected": {"type": "cloud_file", "path": URL_BASE + row.gold, "dest": "gold.csv"},
        "options": {"ignore_blanks": True},
    }


def _calc_task(assets: Path, row: CalcTask) -> dict[str, Any]:
    xlsx(assets / f"{row.book}.xlsx", row.rows)
    doc, target = f"{HOME}/{row.book}.xlsx", f"{HOME}/{row.book}.csv"
    return task(
        row.task_id,
        "libreoffice_calc",
        row.instruction,
        [download(f"{row.book}.xlsx", doc)],
        _calc_evaluator(assets, row, doc, target),
        [python(row.oracle.format(doc=doc, target=target))],
    )


def _docx_eval(doc: str, gold: str) -> dict[str, Any]:
    return {
        "func": "compare_docx_files",
        "result": {"type": "vm_file", "path": doc, "dest": Path(doc).name},
        "expected": {"type": "cloud_file", "path": URL_BASE + gold, "dest": gold},
        "options": {},
    }


def _writer_tasks(assets: Path) -> list[dict[str, Any]]:
    tasks = []
    letter = ["Dear Sam,", "Thank you for the quick reply.", "The parcel arrived on Monday."]
    docx(assets / "letter.docx", letter)
    docx(assets / "letter-closing-gold.docx", [*letter, "Kind regards, Ana"])
    doc = f"{HOME}/letter.docx"
    tasks.append(
        task(
            "writer-closing-line",
            "libreoffice_writer",
            "Add a last paragraph 'Kind regards, Ana' to letter.docx and save it as Word.",
            [download("letter.docx", doc)],
            _docx_eval(doc, "letter-closing-gold.docx"),
            [
                python(f"""
import docx
d = docx.Document({doc!r}); d.add_paragraph("Kind regards, Ana"); d.save({doc!r})""")
            ],
        )
    )
    notes = ["The colour of the logo is blue.", "Pick a colour for the cover.", "Fonts stay as they are."]
    docx(assets / "style.docx", notes)
    docx(assets / "style-spelling-gold.docx", [p.replace("colour", "color") for p in notes])
    doc = f"{HOME}/style.docx"
    tasks.append(
        task(
            "writer-us-spelling",
            "libreoffice_writer",
            "Replace every 'colour' with 'color' in style.docx and save it as Word.",
            [download("style.docx", doc)],
            _docx_eval(doc, "style-spelling-gold.docx"),
            [
                python(f"""
import docx
d = docx.Document({doc!r})
for p in d.paragraphs:
    if "colour" in p.text: p.text = p.text.replace("colour", "color")
d.save({doc!r})""")
            ],
        )
    )
    minutes = ["Present: Ana, Bo, Kofi.", "Decision: ship on Friday."]
    docx(assets / "minutes.docx", minutes)
    docx(assets / "minutes-title-gold.docx", ["Meeting notes", *minutes])
    doc = f"{HOME}/minutes.docx"
    tasks.append(
        task(
            "writer-title-line",
            "libreoffice_writer",
            "Insert 'Meeting notes' as a new first paragraph of minutes.docx and save it as Word.",
            [download("minutes.docx", doc)],
            _docx_eval(doc, "minutes-title-gold.docx"),
            [
                python(f"""
import docx
d = docx.Document({doc!r}); d.paragraphs[0].insert_paragraph_before("Meeting notes"); d.save({doc!r})""")
            ],
        )
    )
    return tasks


def _terminal_tasks(assets: Path) -> list[dict[str, Any]]:
    tasks = []
    settings = f"{HOME}/.config/notes/settings.json"
    (assets / "notes-settings.json").write_text(json.dumps({"fontSize": 11, "theme": "light"}, indent=2) + "\n")
    tasks.append(
        task(
            "term-json-font-size",
            "terminal",
            "Set fontSize to 14 in ~/.config/notes/settings.json, keeping the other settings.",
            [download("notes-settings.json", settings)],
            {
                "func": "check_json",
                "result": {"type": "vm_file", "path": settings, "dest": "settings.json"},
                "expected": {
                    "type": "rule",
                    "rules": {
                        "expect": [
                            {"key": ["fontSize"], "method": "eq", "ref": 14},
                            {"key": ["theme"], "method": "eq", "ref": "light"},
                        ]
                    },
                },
            },
            [shell(f'sed -i \'s/"fontSize": 11/"fontSize": 14/\' {settings}')],
        )
    )
    config = f"{HOME}/app/config.yaml"
    (assets / "app-config.yaml").write_text("server:\n  host: 127.0.0.1\n  port: 8000\ndebug: false\n")
    tasks.append(
        task(
            "term-yaml-port",
            "terminal",
            "Change the server port in ~/app/config.yaml from 8000 to 8080; leave everything else as it is.",
            [download("app-config.yaml", config)],
            {
                "func": "check_json",
                "result": {"type": "vm_file", "path": config, "dest": "config.yaml"},
                "expected": {
                    "type": "rule",
                    "rules": {
                        "expect": [
                            {"key": ["server", "port"], "method": "eq", "ref": 8080},
                            {"key": ["server", "host"], "method": "eq", "ref": "127.0.0.1"},
                            {"key": ["debug"], "method": "eq", "ref": False},
                        ]
                    },
                },
                "options": {"is_yaml": True},
            },
            [shell(f"sed -i 's/port: 8000/port: 8080/' {config}")],
        )
    )
    (assets / "todo-gold.txt").write_text("buy milk\ncall Bo\nwater the plants\n")
    todo = f"{HOME}/todo.txt"
    tasks.append(
        task(
            "editor-todo-list",
            "text_editor",
            "Write a to-do list to ~/todo.txt with three lines: 'buy milk', 'call Bo', 'water the plants'.",
            [{"type": "execute", "parameters": {"command": ["rm", "-f", todo]}}],
            {
                "func": "compare_text_file",
                "result": {"type": "vm_file", "path": todo, "dest": "todo.txt"},
                "expected": {"type": "cloud_file", "path": URL_BASE + "todo-gold.txt", "dest": "todo-gold.txt"},
                "options": {"ignore_blanks": True},
            },
            [shell(f"printf 'buy milk\\ncall Bo\\nwater the plants\\n' > {todo}")],
        )
    )
    tasks.append(
        task(
            "term-reports-folder",
            "terminal",
            "Make a folder ~/reports holding two empty files, q1.txt and q2.txt, and nothing else.",
            [{"type": "execute", "parameters": {"command": ["rm", "-rf", f"{HOME}/reports"]}}],
            {
                "func": "exact_match",
                "result": {"type": "vm_command_line", "command": f"ls -A {HOME}/reports 2>/dev/null", "shell": True},
                "expected": {"type": "rule", "rules": {"expected": "q1.txt\nq2.txt\n"}},
            },
            [shell("mkdir -p ~/reports && touch ~/reports/q1.txt ~/reports/q2.txt")],
        )
    )
    return tasks


def generate(bundle: Path = BUNDLE) -> list[dict[str, Any]]:
    """Write the suite into ``bundle`` (replacing what is there) and return its tasks."""
    if bundle.exists():
        shutil.rmtree(bundle)
    assets = bundle / "assets"
    assets.mkdir(parents=True)
    tasks = [_calc_task(assets, row) for row in CALC_TASKS] + _writer_tasks(assets) + _terminal_tasks(assets)
    tasks += documents.tasks(assets) + apps.tasks(assets) + system.tasks(assets)
    for t in tasks:
        (bundle / f"{t['id']}.json").write_text(json.dumps(t, indent=2) + "\n")
    files = sorted(p.name for p in assets.iterdir())
    manifest = {"files": [{"url": URL_BASE + name, "file": name} for name in files]}
    (assets / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return tasks


if __name__ == "__main__":
    written = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else BUNDLE)
    print(f"{len(written)} tasks written to {BUNDLE if len(sys.argv) < 2 else sys.argv[1]}")
