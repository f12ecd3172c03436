"""What the office metrics share: the score type, file arguments, and the guard that turns a failure into 0.

OSWorld's metric functions take local file paths as strings and often raise on a file they cannot use (a
corrupt document, a missing sheet, an empty slide deck). A raise inside ``DesktopEnv.evaluate`` leaves the
task without a result, which OSWorld's runner counts as not solved, so osfleet scores every such case 0 with
the reason; ``guarded`` does that once for every metric (and silences library warnings, which a test run
turns into errors and which would otherwise change what a metric does).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

Score = tuple[float, str]
Metric = Callable[[Any, Any, dict[str, Any]], Score]


class NotScored(Exception):
    """A case OSWorld's function does not score (it raises, or returns no number): osfleet scores it 0."""


def file_arg(value: Any) -> str | None:
    """A getter's file as OSWorld's functions see it: a path string, or None when the file was not there."""
    if value is None:
        return None
    if isinstance(value, Path | str):
        return str(value)
    raise NotScored(f"needs a file, got {type(value).__name__}")


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guarded(name: str) -> Callable[[Metric], Metric]:
    """Run a metric so that it never raises: anything it cannot score is 0 with the reason."""

    def wrap(metric: Metric) -> Metric:
        @functools.wraps(metric)
        def run(result: Any, expected: Any, options: dict[str, Any]) -> Score:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    score, reason = metric(result, expected, options)
            except NotScored as exc:
                return 0.0, f"{name}: {exc}"
            except RecursionError:
                return 0.0, f"{name}: the file nests too deeply to read"
            except Exception as exc:  # noqa: BLE001  (a file from the guest is hostile input: never raise)
                return 0.0, f"{name}: cannot score ({type(exc).__name__}: {str(exc)[:200]})"
            return float(score), reason

        return run

    return wrap


def fuzz_ratio(a: str, b: str) -> float:
    """Similarity of two strings in [0, 100] (rapidfuzz's ``ratio``: normalised Indel distance), as OSWorld."""
    from rapidfuzz import fuzz

    return float(fuzz.ratio(a, b))
