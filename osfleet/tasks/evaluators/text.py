"""Metrics on strings, lists, text files and JSON/YAML files.

Semantics, as OSWorld documents them:
- ``exact_match``: the result equals ``rules.expected``.
- ``check_include_exclude``: every ``rules.include`` string is in the result and no ``rules.exclude`` one.
- ``literal_match``: the result equals the expected value (a constant, or a rule's ``rules.expected``);
  options ``type`` (``str``, default, or ``list``) and ``ignore_case``.
- ``is_in_list``: ``rules.expected`` is one of the result's items (or a substring of a string result).
- ``compare_text_file``: two text files are equal; options ``ignore_blanks`` (runs of whitespace count as
  one space, ends stripped) and ``ignore_case``.
- ``check_json``: a JSON (or, with option ``is_yaml``, YAML) file meets every ``rules.expect`` item and no
  ``rules.unexpect`` item; an item is ``{"key": [path...], "method": ..., "ref": value}``.
"""

from __future__ import annotations

import json
import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

Score = tuple[float, str]
MAX_TEXT_BYTES = 8 * 2**20


def _rules(expected: Any) -> dict[str, Any]:
    if isinstance(expected, dict):
        return expected
    raise TypeError(f"expected rules (a dict), got {type(expected).__name__}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 117, 117


def _short(value: Any) -> str:
    """At most ~120 characters, whatever ``value`` is: a plain ``repr`` of a YAML alias bomb is exponential."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _as_text(value: Any) -> str | None:
    """A getter's value as text: strings as they are, a file path's contents, None when there is nothing."""
    if value is None:
        return None
    if isinstance(value, Path):
        if value.stat().st_size > MAX_TEXT_BYTES:
            raise ValueError(f"file over {MAX_TEXT_BYTES >> 20} MiB")
        return value.read_bytes().decode(errors="replace")
    return str(value)


def exact_match(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = _rules(expected).get("expected")
    got = _as_text(result)
    ok = got is not None and got == want
    return float(ok), f"result {_short(got)} {'==' if ok else '!='} expected {_short(want)}"


def check_include_exclude(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    rules = _rules(expected)
    got = _as_text(result)
    if got is None:
        return 0.0, "no result"
    missing = [s for s in rules.get("include", []) if s not in got]
    present = [s for s in rules.get("exclude", []) if s in got]
    if missing or present:
        return 0.0, f"missing {missing}, unwanted {present}"
    return 1.0, "all included, none excluded"


def literal_match(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if isinstance(expected, dict) and "expected" in expected:  # given by a rule getter: its rules.expected
        expected = expected["expected"]
    kind = options.get("type", "str")
    fold = bool(options.get("ignore_case", False))
    if kind == "list":
        if not isinstance(result, list) or not isinstance(expected, list):
            return 0.0, "literal_match type list needs two lists"
        a = [str(x).lower() if fold else x for x in result]
        b = [str(x).lower() if fold else x for x in expected]
        return float(a == b), f"{_short(result)} vs {_short(expected)}"
    got, want = _as_text(result), _as_text(expected)
    if got is None or want is None:
        return 0.0, "no result" if got is None else "no expected value"
    if fold:
        got, want = got.lower(), want.lower()
    return float(got == want), f"{_short(got)} vs {_short(want)}"


def is_in_list(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = _rules(expected).get("expected")
    if result is None:
        return 0.0, "no result"
    items = result if isinstance(result, list | str) else _as_text(result) or ""
    ok = want in items
    return float(ok), f"{_short(want)} {'in' if ok else 'not in'} {_short(items)}"


def _normalise(text: str, ignore_blanks: bool, ignore_case: bool) -> str:
    if ignore_blanks:
        text = re.sub(r"\s+", " ", text).strip()
    return text.lower() if ignore_case else text


def compare_text_file(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    got, want = _as_text(result), _as_text(expected)
    if got is None or want is None:
        return 0.0, "no result file" if got is None else "no expected file"
    blanks, case = bool(options.get("ignore_blanks", False)), bool(options.get("ignore_case", False))
    ok = _normalise(got, blanks, case) == _normalise(want, blanks, case)
    return float(ok), "text files equal" if ok else f"text differs: {_short(got[:80])} vs {_short(want[:80])}"


_MISSING = object()


def _lookup(data: Any, key: Any) -> Any:
    path = key if isinstance(key, list) else [key]
    for part in path:
        in_dict = isinstance(data, dict) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and -len(data) <= part < len(data)
        if not (in_dict or in_list):
            return _MISSING
        data = data[part]
    return data


def _holds(value: Any, method: str, ref: Any) -> bool:
    if value is _MISSING:
        return False
    if method == "eq":
        return bool(value == ref)
    if method in ("ne", "neq"):
        return bool(value != ref)
    if method == "re":
        return isinstance(value, str) and re.search(str(ref), value) is not None
    if method in ("gt", "lt", "ge", "le"):
        ops = {"gt": value > ref, "lt": value < ref, "ge": value >= ref, "le": value <= ref}
        return bool(ops[method])
    if method == "in":
        return bool(value in ref)
    if method == "not_in":
        return bool(value not in ref)
    if method in ("has", "contains"):
        return bool(ref in value)
    raise ValueError(f"unknown check_json method {method!r}")


def check_json(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    rules = _rules(expected)
    text = _as_text(result)
    if text is None:
        return 0.0, "no result file"
    try:
        data = yaml.safe_load(text) if options.get("is_yaml") else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        return 0.0, f"not {'YAML' if options.get('is_yaml') else 'JSON'}: {str(exc).splitlines()[0]}"
    for item in rules.get("expect", []):
        value = _lookup(data, item["key"])
        if not _holds(value, item.get("method", "eq"), item.get("ref")):
            shown = "missing" if value is _MISSING else _short(value)
            return 0.0, f"expected {item['key']} {item.get('method', 'eq')} {_short(item.get('ref'))}, got {shown}"
    for item in rules.get("unexpect", []):
        if _holds(_lookup(data, item["key"]), item.get("method", "eq"), item.get("ref")):
            return 0.0, f"unexpected {item['key']} {item.get('method', 'eq')} {_short(item.get('ref'))}"
    return 1.0, "every expectation met"
