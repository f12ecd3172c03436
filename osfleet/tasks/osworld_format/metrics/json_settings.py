"""Metrics on JSON (and YAML) values and files: settings, keybindings, manifests, parsed web pages.

- ``check_json``: a JSON file (YAML with option ``is_yaml``) meets every ``rules.expect`` item and no
  ``rules.unexpect`` one; an item is ``{"key": [path...], "method", "ref"}`` matched by OSWorld's rule
  (``common.match_rule``). A key path that is missing fails an ``expect`` item; for an ``unexpect`` item
  the value is then ``null`` and the rule is still applied to it. An empty YAML file scores 0.
- ``check_json_settings``: every key of ``rules.expected`` is in the file's object with an equal value.
- ``check_json_keybindings``: ``rules.expected`` is one of the file's keybindings (a JSON list, read
  whole or after skipping a first comment line, as VS Code writes it).
- ``check_direct_json_object``: a getter's object (or a string of it, single quotes read as double ones)
  has, for each key of ``rules.expected``, an equal value; with ``rules.expect_in_result`` a string is
  contained in the result's, and a list means one of its items is in the result's list (or equals its
  string). An expected value ``__EVALUATION_FAILED__`` (a getter's failure) scores 0.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from osfleet.tasks.osworld_format.metrics.common import Metric, Score, match_rule, read_text, scored, short


def _walk(data: Any, keys: Any) -> Any:
    for key in keys:
        data = data[key]
    return data


@scored("is_yaml")
def check_json(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    kind = "YAML" if options.get("is_yaml", False) else "JSON"
    try:
        text = read_text(result)
        data = yaml.safe_load(text) if kind == "YAML" else json.loads(text)
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure to read)
        return 0.0, f"not {kind}: {type(exc).__name__}"
    if kind == "YAML" and data is None:
        return 0.0, "empty YAML file"
    met = True
    for item in expected.get("expect", {}):
        keys = list(item["key"])
        try:
            value = _walk(data, keys)
        except (KeyError, TypeError):
            return 0.0, f"no {short(item['key'])} in the file"
        met = met and match_rule(value, item)
        if not met:
            return 0.0, f"{short(item['key'])} = {short(value)} does not match {item['method']} {short(item['ref'])}"
    for item in expected.get("unexpect", {}):
        keys = list(item["key"])
        try:
            value = _walk(data, keys)
        except (KeyError, TypeError):
            value = None
        if match_rule(value, item):
            return 0.0, f"{short(item['key'])} = {short(value)} matches {item['method']} {short(item['ref'])}"
    return 1.0, "every expectation met"


@scored(any_options=True)
def check_json_settings(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no result file"
    try:
        data = json.loads(read_text(result))
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure to read)
        return 0.0, f"not JSON: {type(exc).__name__}"
    for key, value in expected["expected"].items():
        if key not in data or data[key] != value:
            return 0.0, f"{key}: {short(data[key]) if key in data else 'missing'}, expected {short(value)}"
    return 1.0, "every setting as expected"


def _keybindings(result: Any) -> list[Any] | None:
    """The file as a JSON list, whole or after its first line; None when it is neither."""
    try:
        text = read_text(result)
    except Exception:  # noqa: BLE001  (OSWorld's loaders give None on any failure)
        return None
    for candidate in (text, text.split("\n", 1)[1] if "\n" in text else ""):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if type(data) is list:
            return data
    return None


@scored(any_options=True)
def check_json_keybindings(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    data = _keybindings(result)
    if data is None:
        return 0.0, "no keybindings list in the file"
    want = expected["expected"]
    ok = want in data
    return float(ok), f"{short(want)} {'is' if ok else 'is not'} bound"


def _as_object(result: Any) -> Any:
    if isinstance(result, str):
        return json.loads(result.strip().replace("'", '"'))
    return result


def _equal_values(result: Any, want: dict[str, Any]) -> Score:
    for key in want.keys():  # noqa: SIM118  (a list of keys is no object: it cannot be scored, as in OSWorld)
        if want.get("ignore_list_order", False):
            if sorted(want[key]) != sorted(result.get(key)):
                return 0.0, f"{key}: {short(result.get(key))}, expected {short(want[key])} in any order"
        elif want[key] != result.get(key):
            return 0.0, f"{key}: {short(result.get(key))}, expected {short(want[key])}"
    return 1.0, "every value as expected"


def _values_in_result(result: Any, want: dict[str, Any]) -> Score:
    for key, value in want.items():  # a list of keys is no object: it cannot be scored, as in OSWorld
        got = result.get(key)
        if isinstance(value, list):
            if not any((isinstance(got, list) and v in got) or (isinstance(got, str) and v == got) for v in value):
                return 0.0, f"{key}: none of {short(value)} in {short(got)}"
        elif isinstance(value, str):
            if value not in got:
                return 0.0, f"{key}: {short(value)} not in {short(got)}"
        else:
            return 0.0, f"{key}: expected a string or a list, got {type(value).__name__}"
    return 1.0, "every expected value found"


@scored()
def check_direct_json_object(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    result = _as_object(result)
    if result is None:
        return 0.0, "no result"
    try:
        want = expected.get("expected", {})
        if want and any(v == "__EVALUATION_FAILED__" for v in want.values()):
            return 0.0, "the expected value could not be computed"
        if expected.get("expect_in_result", False):
            return _values_in_result(result, expected["expected"])
        return _equal_values(result, expected["expected"])
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure to compare)
        return 0.0, f"cannot compare: {type(exc).__name__}"


METRICS: dict[str, Metric] = {
    "check_json": check_json,
    "check_json_settings": check_json_settings,
    "check_json_keybindings": check_json_keybindings,
    "check_direct_json_object": check_direct_json_object,
}
NEEDS: dict[str, tuple[str, ...]] = {}
