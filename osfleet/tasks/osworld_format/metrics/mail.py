"""Metrics on Thunderbird's files: preferences, message filters, mail folders.

- ``check_thunderbird_prefs``: ``prefs.js`` (``user_pref("key", value);`` lines, values read as JSON: a
  value that is not JSON cannot be scored, as in OSWorld) has, for each key of ``rules.expect``, a value
  matching its rule (the last line of a key decides; a key never set fails), and no ``rules.unexpect`` key
  with a matching value.
- ``check_thunderbird_filter``: among the filters of ``msgFilterRules.dat`` (``name``, ``enabled``,
  ``type``, ``action``, ``actionValue``, ``condition``: the list of ``AND (...)``/``OR (...)``/``ALL``
  conditions), each ``rules.expect`` record matches one and no ``rules.unexpect`` record any.
- ``check_thunderbird_folder``: each mbox file "contains the same messages" as its gold one, as OSWorld's
  function decides it. OSWorld skips every message that has any text (``if mail.strip(): continue``): only
  empty pieces between ``FROM - `` separators count, so two folders are the same when both start with a
  separator (or both do not), however their messages differ. osfleet keeps that behaviour so that scores
  stay comparable; options ``remove_deleted``, ``remove_duplicate`` (both true by default), ``ignore_status``
  and ``ignore_keys`` are accepted and applied as OSWorld applies them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import (
    CannotScore,
    Metric,
    Score,
    match_record,
    match_rule,
    read_text,
    scored,
    short,
    text_lines,
)

_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)\", (?P<val>.+)\);$')


@scored()
def check_thunderbird_prefs(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no prefs.js"
    want, unwanted = expected.get("expect", {}), expected.get("unexpect", {})
    met = {key: False for key in want}
    clean = True
    for line in text_lines(read_text(result)):
        m = _PREF.match(line.strip())
        if m is None:
            continue
        key, value = m.group("key"), json.loads(m.group("val"))
        if key in want:
            met[key] = match_rule(value, want[key])
        elif key in unwanted:
            clean = clean and not match_rule(value, unwanted[key])
    failed = [key for key, ok in met.items() if not ok]
    if failed or not clean:
        return 0.0, f"not as expected: {short(failed)}" if failed else "an unexpected preference is set"
    return 1.0, "every preference as expected"


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\\\", "\\")


_CONDITION = re.compile(r"\b(?:AND|OR) \((?:[\w ]+),(?:[\w ']+),(?:\"(?:(?:[^\"]|\")+)\"|(?:[^)]+))\)|\bALL\b")
_FIELDS: tuple[tuple[str, str], ...] = (("enabled=", "enabled"), ("type=", "type"), ("action=", "action"))
_FIELDS += (("actionValue=", "actionValue"),)


def _filters(text: str) -> list[dict[str, Any]]:
    """The filters of msgFilterRules.dat as OSWorld reads them: a filter starts at ``name=`` and is recorded
    at each ``condition=`` line; values lose their first character after ``=`` and the last two of the line
    (the quotes and the newline)."""
    filters: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text_lines(text):
        if line.startswith("name="):
            current = {"name": _unescape(line[6:-2])}
            continue
        field = next((f for prefix, f in _FIELDS if line.startswith(prefix)), None)
        if field is None and not line.startswith("condition="):
            continue
        if current is None:
            raise CannotScore(f"a filter's {short(line.split('=')[0])} comes before any filter name")
        if field is not None:
            current[field] = _unescape(line[len(field) + 2 : -2])
        else:
            current["condition"] = _CONDITION.findall(_unescape(line[11:-2]))
            filters.append(current)
    return filters


@scored()
def check_thunderbird_filter(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no filter file"
    filters = _filters(read_text(result))
    want, unwanted = expected.get("expect", []), expected.get("unexpect", [])
    found = [any(match_record(r, f) for f in filters) for r in want]
    clean = not any(match_record(r, f) for f in filters for r in unwanted)
    missing = [r for r, ok in zip(want, found, strict=True) if not ok]
    if missing or not clean:
        return 0.0, f"no filter matches {short(missing)}" if missing else "a filter matches an unexpected record"
    return 1.0, f"{len(filters)} filters, every expected one present"


def _message(piece: str, options: dict[str, Any]) -> str:
    if options.get("ignore_status", False):
        piece = re.sub(r"X-Mozilla-Status\d?:[\s\d]+", "", piece)
    if options.get("ignore_keys", False):
        piece = re.sub(r"(X-Mozilla-Keys:[^\n]*?)\n(MIME-Version)", r"\2", piece)
    return piece.strip()


def _folder(value: Any, options: dict[str, Any]) -> str:
    messages = []
    for piece in read_text(value).strip().split("FROM - "):
        if piece.strip():
            continue  # OSWorld's own test, kept as it is (see the module's docstring)
        if options.get("remove_deleted", True) and re.search(r"X-Mozilla-Status: 000[89]", piece):
            continue
        messages.append("FROM - " + _message(piece, options))
    kept = set(messages) if options.get("remove_duplicate", True) else messages
    return "\n".join(sorted(kept))


@scored(any_options=True)
def check_thunderbird_folder(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if type(expected) is not list:
        result, expected = [result], [expected]
    if not isinstance(result, list | tuple | str):
        raise CannotScore(f"expected a list of folder files, got {type(result).__name__}")
    for got, want in zip(result, expected, strict=False):
        if got is None:
            return 0.0, "a folder file is missing"
        if _folder(got, options) != _folder(want, options):
            return 0.0, f"{short(got)} differs from its gold folder"
    return 1.0, "the folders match"


METRICS: dict[str, Metric] = {
    "check_thunderbird_prefs": check_thunderbird_prefs,
    "check_thunderbird_filter": check_thunderbird_filter,
    "check_thunderbird_folder": check_thunderbird_folder,
}
NEEDS: dict[str, tuple[str, ...]] = {}
