"""Metrics on records in a database (``check_csv`` and the spreadsheet column check live with the sheets).

- ``run_sqlite3``: ``rules.sql`` run on the database file; the score is the first column of its first row
  (a number; null counts 0). OSWorld returns that number as it is, so it may be above 1; the sandbox then scores
  it 0 with the number named (``osfleet.tasks.rewards``: a reward is in [0, 1]).

The query is the task's, but the database is the guest's: it is opened read-only, only reading statements
are authorised (no ATTACH, no writes, no pragmas that change state), and it is interrupted after
``SQL_SECONDS``.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import Metric, Score, file_path, scored

SQL_SECONDS = 30.0
_READ_ONLY_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


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


METRICS: dict[str, Metric] = {
    "run_sqlite3": run_sqlite3,
}
NEEDS: dict[str, tuple[str, ...]] = {}
