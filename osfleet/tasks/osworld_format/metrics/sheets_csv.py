"""CSV metrics: ``compare_csv`` (two CSV files, line by line) and ``check_csv`` (records a CSV must or must
not hold).

Semantics, as OSWorld's:
- a file is read as UTF-8, else as Latin-1 (which reads any bytes), split into lines on every line break
  Python knows (``str.splitlines``);
- ``compare_csv``: the result's lines equal an expected file's (``expected`` may be a list of files: any
  one matching is enough, missing ones are passed over); option ``strict`` (default true; false strips
  each line) and ``ignore_case``;
- ``check_csv``: ``rules.expect`` lists records (column → value) that some row must match, ``rules.unexpect``
  records no row may match; the file is read as UTF-8 with its first line as the header.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored, Score, file_arg, guarded, short

MAX_CSV_BYTES = 64 * 2**20


def read_lines(path: str) -> list[str]:
    """The file's lines (OSWorld's reading: UTF-8, else Latin-1). Raises ``OSError`` when it cannot be read."""
    if os.path.getsize(path) > MAX_CSV_BYTES:
        raise NotScored(f"{os.path.basename(path)} is over {MAX_CSV_BYTES // 2**20} MiB")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.splitlines()


def _paths(value: Any) -> list[str | None]:
    if isinstance(value, list):
        return [file_arg(v) for v in value]
    path = file_arg(value)
    if path is None:
        raise NotScored("no expected file")
    return [path]


@guarded("compare_csv")
def compare_csv(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    path = file_arg(result)
    if path is None:
        return 0.0, "no result file"
    try:
        got = read_lines(path)
    except OSError as exc:
        return 0.0, f"cannot read the result: {exc.strerror or exc}"
    for candidate in _paths(expected):
        if candidate is None:
            raise NotScored("an expected file is missing")
        try:
            want = read_lines(candidate)
        except OSError:
            continue
        a, b = got, want
        if not options.get("strict", True):
            a, b = [x.strip() for x in a], [x.strip() for x in b]
        if options.get("ignore_case", False):
            a, b = [x.lower() for x in a], [x.lower() for x in b]
        if a == b:
            return 1.0, f"{len(a)} lines equal {os.path.basename(candidate)}"
    return 0.0, f"{len(got)} lines match no expected file"


def _matches(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    return all(k in record and record[k] == v for k, v in pattern.items())


@guarded("check_csv")
def check_csv(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    path = file_arg(result)
    if path is None:
        return 0.0, "no result file"
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    expect, unexpect = expected.get("expect", []), expected.get("unexpect", [])
    if os.path.getsize(path) > MAX_CSV_BYTES:
        raise NotScored(f"the CSV is over {MAX_CSV_BYTES // 2**20} MiB")
    with open(path, "rb") as f:
        text = io.TextIOWrapper(io.BytesIO(f.read()), encoding="utf-8")  # as open(path) reads it
    found = [False] * len(expect)
    clean = True
    for record in csv.DictReader(text):
        found = [hit or _matches(p, record) for hit, p in zip(found, expect, strict=True)]
        clean = clean and not any(_matches(p, record) for p in unexpect)
    if not all(found):
        return 0.0, f"no row matches {short(expect[found.index(False)])}"
    if not clean:
        return 0.0, "a row matches an unexpected record"
    return 1.0, f"{len(expect)} expected record(s) found, none unexpected"


METRICS = {"compare_csv": compare_csv, "check_csv": check_csv}
