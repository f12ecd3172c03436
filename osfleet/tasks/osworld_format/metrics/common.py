"""What OSWorld's metric families share: reading a getter's value, OSWorld's rule matcher, and how a metric
that cannot score ends (``scored`` for metrics that check OSWorld's keyword options, ``guarded`` for the office
metrics that take ``**options``: the same wrapper underneath).

OSWorld's ``DesktopEnv.evaluate`` calls ``metric(result, expected, **options)`` and gives no score when the
metric raises: the task counts as failed. So in osfleet a metric that meets a value it cannot use (a missing
or corrupt file, a value of the wrong kind, a rule OSWorld does not know) scores 0 and says why, through
``scored``, instead of raising out of the metric. A getter's file is a ``Path`` (OSWorld's is a path
string; both are accepted); a file is read the way OSWorld's ``open(path).read()`` reads it (UTF-8, newlines
translated), up to a bound.
"""

from __future__ import annotations

import builtins
import functools
import operator
import re
import reprlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

Score = tuple[float, str]
Metric = Callable[[Any, Any, dict[str, Any]], Score]

MAX_FILE_BYTES = 64 * 2**20  # a text, JSON or config file from the guest; larger ones score 0


class CannotScore(ValueError):
    """The value cannot be scored; the metric scores 0 with this message."""


NotScored = CannotScore  # the office metrics' name for it


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 117, 117


def short(value: Any, limit: int = 120) -> str:
    """At most ``limit`` characters, whatever ``value`` is: a plain ``repr`` of a YAML alias bomb is exponential."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _never_raising(name: str, func: Callable[..., Score], accepts: frozenset[str] | None) -> Metric:
    """``func`` as a metric that scores 0 with the reason where OSWorld's function would raise (and so score
    nothing). Everything that reaches a metric came from a guest or a task file, so an exception of the libraries
    that parse it (PIL, zipfile, sqlite3, lxml, openpyxl, json, ...) is the value's fault, not the host's: it is
    turned into a 0 here, in one place. A missing package is not: ``ImportError`` is raised, as ``require``
    promised. Library warnings are silenced (a test run turns them into errors, which would change scores)."""

    @functools.wraps(func)
    def wrapper(result: Any, expected: Any, options: dict[str, Any]) -> Score:
        unknown = [] if accepts is None else sorted(set(options) - accepts)
        if unknown:
            return 0.0, f"{name}: OSWorld's function takes no option {', '.join(unknown)}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                score, reason = func(result, expected, options)
        except ImportError:
            raise
        except CannotScore as exc:
            return 0.0, f"{name}: {exc}"
        except RecursionError:
            return 0.0, f"{name}: value nested too deeply"
        except Exception as exc:  # noqa: BLE001  (see the docstring: OSWorld gives no score, counted 0)
            message = str(exc).splitlines()[0] if str(exc) else ""
            return 0.0, f"{name}: cannot compare ({type(exc).__name__}: {message[:200]})"
        return float(score), reason

    # The options OSWorld's function takes (None: any), for metrics that call this one.
    wrapper.osworld_options = accepts  # type: ignore[attr-defined]
    return wrapper


def scored(*accepts: str, any_options: bool = False) -> Callable[[Callable[..., Score]], Metric]:
    """Make ``func(result, expected, options)`` a metric that never raises (``_never_raising``).

    ``accepts`` names the options OSWorld's function takes as keyword arguments; any other option makes
    OSWorld's call fail (an unexpected keyword argument), so it scores 0 here too, unless ``any_options``
    (the function takes ``**options``).
    """

    def decorate(func: Callable[..., Score]) -> Metric:
        return _never_raising(func.__name__, func, None if any_options else frozenset(accepts))

    return decorate


def guarded(name: str) -> Callable[[Metric], Metric]:
    """``scored(any_options=True)`` under an explicit name (the office metrics read their options themselves)."""

    def decorate(func: Metric) -> Metric:
        return _never_raising(name, func, None)

    return decorate


def file_path(value: Any) -> Path:
    """A getter's file value as a path; OSWorld passes path strings, osfleet's getters ``Path``s."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str) and value:
        return Path(value)
    raise CannotScore(f"expected a file, got {short(value, 60)}")


def read_bytes(value: Any, limit: int = MAX_FILE_BYTES) -> bytes:
    path = file_path(value)
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CannotScore(f"{path.name} is larger than {limit // 2**20} MiB")
    return data


def read_text(value: Any, limit: int = MAX_FILE_BYTES) -> str:
    """The file as OSWorld's ``open(path).read()`` gives it: strict UTF-8, ``\\r\\n`` and ``\\r`` as ``\\n``."""
    text = read_bytes(value, limit).decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def text_lines(text: str) -> list[str]:
    """Lines as iterating over a text file yields them: split after each ``\n``, which each keeps."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


def match_record(pattern: dict[str, Any], item: dict[str, Any]) -> bool:
    """Every key of ``pattern`` is in ``item`` with an equal value."""
    return all(k in item and item[k] == v for k, v in pattern.items())


def _regex_flags(method: str) -> re.RegexFlag:
    flags = re.RegexFlag(0)
    for name in method.split(".")[1:]:
        flag = getattr(re, name)
        if not isinstance(flag, re.RegexFlag):
            raise CannotScore(f"unknown regular expression flag {name!r}")
        flags |= flag
    return flags


def match_rule(value: Any, rule: dict[str, Any]) -> bool:
    """OSWorld's value rule ``{"method", "ref"}``, used by check_json, Thunderbird prefs and MP3 tags:

    ``re`` (``re.S``, ``re.I.M``...: a search with those flags), ``eq``/``ne``/``lt``/``le``/``gt``/``ge``,
    ``approx:<tolerance>`` (a value not a number never matches), ``range.<l><r>`` (``l``/``r`` each ``t``
    for strict or ``e`` for inclusive: ``range.te`` is ref[0] < value <= ref[1]), ``str_list_eq`` and
    ``str_set_eq`` (the value is a comma-separated string, quotes around it dropped). Another method, or a
    comparison between values that cannot be compared, cannot be scored.
    """
    method = rule["method"]
    ref = rule["ref"]
    if method.startswith("re"):
        return re.search(ref, value, _regex_flags(method)) is not None
    if method in ("eq", "ne", "lt", "le", "gt", "ge"):
        return bool(getattr(operator, method)(value, ref))
    if method.startswith("approx"):
        tolerance = float(method.split(":")[1])
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return abs(number - ref) <= tolerance
    if method.startswith("range."):
        left, right = method[6], method[7]
        if left not in "te" or right not in "te":
            raise CannotScore(f"unknown range bounds {method!r}")
        return bool(getattr(operator, "l" + left)(ref[0], value) and getattr(operator, "l" + right)(value, ref[1]))
    if method in ("str_list_eq", "str_set_eq"):
        container = builtins.list if method == "str_list_eq" else builtins.set
        return bool(container(value.strip("\"'").split(",")) == container(ref))
    raise CannotScore(f"unknown rule method {method!r}")


def file_arg(value: Any) -> str | None:
    """A getter's file as OSWorld's functions see it: a path string, or None when the file was not there."""
    if value is None:
        return None
    if isinstance(value, Path | str):
        return str(value)
    raise CannotScore(f"needs a file, got {type(value).__name__}")


def fuzz_ratio(a: str, b: str) -> float:
    """Similarity of two strings in [0, 100] (rapidfuzz's ``ratio``: normalised Indel distance), as OSWorld."""
    from rapidfuzz import fuzz

    return float(fuzz.ratio(a, b))
