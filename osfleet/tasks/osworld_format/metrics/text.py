"""Metrics on strings (a command's output, a browser setting) and text files, as OSWorld scores them.

- ``exact_match``: the result equals ``rules.expected``; ``is_in_list``: ``rules.expected`` is in the
  result (an item of a list, a substring of a string); ``check_include_exclude``: every ``rules.include``
  string is in the result and no ``rules.exclude`` one.
- ``literal_match``: ``str(result) == str(expected)`` (option ``ignore_case``), or with ``type: list`` two
  lists (or tuples) of the same length whose items compare equal as strings. The expected value is taken
  as it is: a rule getter's object is not unwrapped, as in OSWorld (where it then never matches).
- ``is_extension_installed``: ``rules.expected`` is (``type: contain``) or is not (``not_contain``) in the
  result; ``is_in_vm_clickboard``: the rule (the result here) names a string, or a list of strings, all in
  the clipboard text (the expected value).
- ``compare_text_file``: two files are equal, optionally with blanks (tabs and newlines as spaces, runs of
  whitespace as one, ends stripped: ``ignore_blanks``) and case (``ignore_case``) ignored.
- ``diff_text_file``: the similarity ratio of the two files' lists of lines (difflib), between 0 and 1.
- ``compare_config``: the file's text equals ``rules.expected``; ``file_contains``: it holds every string
  of ``rules.expected``; ``check_list``: each ``rules.expect`` regular expression matches some line and no
  ``rules.unexpect`` one matches any; ``check_line_number``: as many lines hold a time (``HH:MM:SS``) as
  ``rules.expected`` says.
- ``compare_python_pure_text``: two Python files are equal but for a shebang or coding line among the
  first three, blank lines, trailing blanks and tabs (as 4 spaces).
- ``compare_result_files``: two answers are equal as text, or as numbers (within 1e-4), or the expected
  number's text appears in the result's.
- ``compare_time_in_speedtest_results``: the time (``HH:MM``, the end of the second field of the second
  line) of a speed-test CSV is within ``expected`` minutes of the clock now.
- ``fuzzy_place_math``: a .docx with exactly three words, each scored by its best fuzzy ratio against
  ``rules.expected``; the score is their mean.

Where OSWorld's function takes a string but osfleet's getter gives a file (a ``vm_file`` result for a string
metric, which no OSWorld task uses), the file's text is used; OSWorld would compare its path.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from pathlib import Path
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import (
    CannotScore,
    Metric,
    Score,
    file_path,
    read_text,
    scored,
    short,
    text_lines,
)


def _value(value: Any) -> Any:
    """A getter's value where OSWorld's metric takes it as it is; a file is read (see the module's docstring)."""
    return read_text(value) if isinstance(value, Path) else value


@scored()
def exact_match(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = expected["expected"]
    got = _value(result)
    ok = got == want
    return float(ok), f"result {short(got)} {'==' if ok else '!='} expected {short(want)}"


@scored()
def check_include_exclude(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    got = _value(result)
    if got is None:
        return 0.0, "no result"
    missing = [s for s in expected.get("include", []) if s not in got]
    present = [s for s in expected.get("exclude", []) if s in got]
    if missing or present:
        return 0.0, f"missing {short(missing)}, unwanted {short(present)}"
    return 1.0, "all included, none excluded"


@scored(any_options=True)
def literal_match(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    kind = options.get("type", "str")
    fold = bool(options.get("ignore_case", False))
    result = _value(result)

    def text(x: Any) -> str:
        return str(x).lower() if fold else str(x)

    if kind == "str":
        ok = text(result) == text(expected)
    elif kind == "list":
        sequences = (list, tuple)
        if type(result) not in sequences or type(expected) not in sequences or len(result) != len(expected):
            return 0.0, "literal_match type list needs two lists of the same length"
        ok = [text(x) for x in result] == [text(x) for x in expected]
    else:
        raise CannotScore(f"literal_match has no type {kind!r} (str, list)")
    return float(ok), f"{short(result)} {'==' if ok else '!='} {short(expected)}"


@scored()
def is_in_list(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = expected["expected"]
    items = _value(result)
    ok = want in items
    return float(ok), f"{short(want)} {'in' if ok else 'not in'} {short(items)}"


@scored()
def match_in_list(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    """The result is one of the expected values (``in``: a substring when ``expected`` is a string, as OSWorld)."""
    choices = expected["expected"]
    got = _value(result)
    ok = got in choices
    return float(ok), f"result {short(got)} {'in' if ok else 'not in'} {short(choices)}"


@scored(any_options=True)
def is_extension_installed(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    kind, want = expected["type"], None
    got = _value(result)
    if kind == "contain":
        want = expected["expected"]
        ok = want in got
    elif kind == "not_contain":
        want = expected["expected"]
        ok = want not in got
    else:
        raise CannotScore(f"is_extension_installed has no type {kind!r} (contain, not_contain)")
    return float(ok), f"{short(want)} {kind}ed: {'yes' if ok else 'no'}"


@scored()
def is_in_vm_clickboard(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = result["expected"]  # OSWorld's task gives the rule as the result and the clipboard as the expected
    clipboard = _value(expected)
    ok = all(w in clipboard for w in want) if isinstance(want, list) else want in clipboard
    return float(ok), f"{short(want)} {'in' if ok else 'not in'} the clipboard {short(clipboard)}"


def _blanks(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", text).strip())


@scored(any_options=True)
def compare_text_file(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no result file"
    got, want = read_text(result), read_text(expected)
    if options.get("ignore_blanks", False):
        got, want = _blanks(got), _blanks(want)
    if options.get("ignore_case", False):
        got, want = got.lower(), want.lower()
    ok = got == want
    return float(ok), "text files equal" if ok else f"text differs: {short(got[:80])} vs {short(want[:80])}"


@scored()
def diff_text_file(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    got, want = read_text(result).splitlines(), read_text(expected).splitlines()
    ratio = difflib.SequenceMatcher(a=got, b=want).ratio()
    return ratio, f"{ratio:.3f} of the lines match"


@scored(any_options=True)
def compare_config(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no result file"
    got, want = read_text(result), expected["expected"]
    ok = got == want
    return float(ok), f"{short(got)} {'==' if ok else '!='} {short(want)}"


@scored()
def file_contains(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no result file"
    try:
        text = read_text(result)
        missing = [s for s in expected["expected"] if s not in text]
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot read: {type(exc).__name__}"
    return float(not missing), f"missing {short(missing)}" if missing else "every string present"


@scored()
def check_list(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    want = [re.compile(p) for p in expected.get("expect", [])]
    unwanted = [re.compile(p) for p in expected.get("unexpect", [])]
    lines = text_lines(read_text(result))
    missing = [p.pattern for p in want if not any(p.search(line) for line in lines)]
    present = [p.pattern for p in unwanted if any(p.search(line) for line in lines)]
    if missing or present:
        return 0.0, f"no line matches {short(missing)}; some line matches {short(present)}"
    return 1.0, "every expected pattern matches, no unexpected one"


TIME_OF_DAY = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")


@scored()
def check_line_number(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or not file_path(result).is_file():
        return 0.0, "no result file"
    try:
        count = sum(1 for line in text_lines(read_text(result)) if TIME_OF_DAY.search(line))
        want = int(expected["expected"])
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot count: {type(exc).__name__}"
    return float(count == want), f"{count} lines with a time, expected {want}"


_CODING = ("#!", "# -*- coding:", "# coding:", "# coding=")


def _python_lines(text: str) -> str:
    lines = text.splitlines()
    start = 0
    while start < min(len(lines), 3) and lines[start].strip().startswith(_CODING):
        start += 1
    return "\n".join(line.expandtabs(4).rstrip() for line in lines[start:] if line.strip())


@scored()
def compare_python_pure_text(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result or not expected:
        return 0.0, "no file"
    try:
        ok = _python_lines(read_text(result)) == _python_lines(read_text(expected))
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"cannot read: {type(exc).__name__}"
    return float(ok), "same code" if ok else "the code differs"


@scored()
def compare_result_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result or not expected:
        return 0.0, "no file"
    got, want = read_text(result).strip(), read_text(expected).strip()
    try:
        want_number = float(want)
        if want in got:
            return 1.0, f"{short(want)} appears in the result"
        ok = abs(float(got) - want_number) < 1e-4
        return float(ok), f"{short(got)} vs {short(want)} as numbers"
    except ValueError:
        ok = got == want
        return float(ok), f"{short(got)} {'==' if ok else '!='} {short(want)}"


@scored()
def compare_time_in_speedtest_results(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no result file"
    try:
        second = text_lines(read_text(result))[1]
        clock = second.split(",")[1][-5:]
        now = dt.datetime.now().strftime("%H:%M")
        minutes = abs((dt.datetime.strptime(clock, "%H:%M") - dt.datetime.strptime(now, "%H:%M")).total_seconds()) / 60
        ok = minutes < int(expected)
    except Exception as exc:  # noqa: BLE001  (OSWorld's function scores 0 on any failure)
        return 0.0, f"no time in the results: {type(exc).__name__}"
    return float(ok), f"measured at {clock}, {minutes:.0f} min from now (limit {expected})"


@scored()
def fuzzy_place_math(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no result file"
    import docx
    from rapidfuzz import fuzz

    answers = expected["expected"]
    words = [w for p in docx.Document(str(file_path(result))).paragraphs for w in p.text.split()]
    scores = [max([0.0, *(fuzz.ratio(w, a) / 100 for a in answers)]) for w in words]
    if len(scores) != 3:
        return 0.0, f"{len(scores)} words, expected 3"
    return sum(scores) / 3, f"fuzzy scores {[round(s, 3) for s in scores]}"


METRICS: dict[str, Metric] = {
    "exact_match": exact_match,
    "match_in_list": match_in_list,
    "check_include_exclude": check_include_exclude,
    "literal_match": literal_match,
    "is_in_list": is_in_list,
    "is_extension_installed": is_extension_installed,
    "is_in_vm_clickboard": is_in_vm_clickboard,
    "compare_text_file": compare_text_file,
    "diff_text_file": diff_text_file,
    "compare_config": compare_config,
    "file_contains": file_contains,
    "check_list": check_list,
    "check_line_number": check_line_number,
    "compare_python_pure_text": compare_python_pure_text,
    "compare_result_files": compare_result_files,
    "compare_time_in_speedtest_results": compare_time_in_speedtest_results,
    "fuzzy_place_math": fuzzy_place_math,
}
NEEDS: dict[str, tuple[str, ...]] = {"fuzzy_place_math": ("docx", "rapidfuzz")}
