"""Metrics on rows of records: a CSV file, an SQLite database, a spreadsheet column.

- ``check_csv``: each ``rules.expect`` record (``{column: value}``) matches some row of the CSV file and no
  ``rules.unexpect`` record matches any row.
- ``run_sqlite3``: ``rules.sql`` run on the database file; the score is the first column of its first row
  (a number; null counts 0). OSWorld returns that number as it is, so it may be above 1.
- ``compare_conference_city_in_order``: cells C2:C22 of the active sheet hold, in order, the cities of
  ``rules.expected`` (each a string contained in the cell, or a list of spellings one of which is).

The query is the task's, but the database is the guest's: it is opened read-only, only reading statements
are authorised (no ATTACH, no writes, no pragmas that change state), and it is interrupted after
``SQL_SECONDS``.
"""

from __future__ import annotations

import csv
import io
import sqlite3
import time
from typing import Any

from osfleet.tasks.evaluators.common import Metric, Score, file_path, match_record, read_bytes, read_text, scored, short

SQL_SECONDS = 30.0
_READ_ONLY_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


@scored()
def check_csv(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    want, unwanted = expected.get("expect", []), expected.get("unexpect", [])
    found = [False] * len(want)
    clean = True
    for row in csv.DictReader(io.StringIO(read_text(result))):
        found = [f or match_record(r, row) for f, r in zip(found, want, strict=True)]
        clean = clean and not any(match_record(r, row) for r in unwanted)
    missing = [r for f, r in zip(found, want, strict=True) if not f]
    if missing or not clean:
        return 0.0, f"no row matches {short(missing)}" if missing else "a row matches an unexpected record"
    return 1.0, "every expected record found, no unexpected one"


def _authorise(action: int, *args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ONLY_ACTIONS else sqlite3.SQLITE_DENY


@scored()
def run_sqlite3(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    path = file_path(result).resolve()
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        deadline = time.monotonic() + SQL_SECONDS
        connection.set_authorizer(_authorise)
        connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        row = connection.execute(expected["sql"]).fetchone()
        value = float(row[0] or 0)
    finally:
        connection.close()
    return value, f"the query gave {value}"


@scored()
def compare_conference_city_in_order(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from openpyxl import load_workbook

    want = expected["expected"]
    sheet = load_workbook(io.BytesIO(read_bytes(result))).active
    cells = [cell.value for row in sheet["C2:C22"] for cell in row]
    try:
        for i, got in enumerate(cells):
            city = want[i]
            if isinstance(city, str):
                ok = city in got
            elif isinstance(city, list):
                ok = any(spelling in got for spelling in city)
            else:
                return 0.0, f"expected city {i + 1} is neither a string nor a list"
            if not ok:
                return 0.0, f"row {i + 2}: {short(got)}, expected {short(city)}"
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure to compare)
        return 0.0, f"cannot compare the cities: {type(exc).__name__}"
    return 1.0, "every city in order"


METRICS: dict[str, Metric] = {
    "check_csv": check_csv,
    "run_sqlite3": run_sqlite3,
    "compare_conference_city_in_order": compare_conference_city_in_order,
}
NEEDS: dict[str, tuple[str, ...]] = {"compare_conference_city_in_order": ("openpyxl",)}
