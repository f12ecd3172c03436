"""OSWorld evaluator functions, written for osfleet from OSWorld's documented semantics, run on the host.

Each metric takes the ``result`` and ``expected`` values its getters produced (a local file path for
``vm_file``/``cloud_file``, a string for ``vm_command_line``, a dict for ``rule``) and the evaluator's
``options``, and returns a score in [0, 1]. A value a metric cannot use (a file that is missing, corrupt,
or of the wrong kind) scores 0 with a reason, as in OSWorld: the agent did not produce what was asked.
Only failures to reach the guest are infrastructure errors, and those are raised by the getters.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from osfleet.tasks.evaluators import documents, office_config, pdfs, sheets_csv, slides, tables, text
from osfleet.tasks.model import UnsupportedTaskError

Metric = Callable[[Any, Any, dict[str, Any]], "Score"]
Score = tuple[float, str]

METRICS: dict[str, Metric] = {
    "exact_match": text.exact_match,
    "check_include_exclude": text.check_include_exclude,
    "literal_match": text.literal_match,
    "is_in_list": text.is_in_list,
    "compare_text_file": text.compare_text_file,
    "check_json": text.check_json,
    **tables.METRICS,
    **sheets_csv.METRICS,
    **documents.METRICS,
    **slides.METRICS,
    **pdfs.METRICS,
    **office_config.METRICS,
}

# Python modules a metric needs on the host (the ``office`` extra of osfleet): one (module, package) pair, or
# a tuple of them.
NEEDS: dict[str, Any] = {
    **tables.NEEDS,
    **documents.NEEDS,
    **slides.NEEDS,
    **pdfs.NEEDS,
}


def require(func: str) -> None:
    """Refuse a task whose metric cannot run on this host, before a replica is touched."""
    if func not in METRICS:
        raise UnsupportedTaskError(f"unsupported OSWorld metric {func!r} (supported: {', '.join(METRICS)})")
    needs = NEEDS.get(func, ())
    for module, package in [needs] if needs and isinstance(needs[0], str) else needs:
        if importlib.util.find_spec(module) is None:
            raise UnsupportedTaskError(
                f"OSWorld metric {func!r} needs {package} on this host (pip install 'osfleet[office]')"
            )


def run_metric(func: str, result: Any, expected: Any, options: dict[str, Any]) -> Score:
    """Score one metric; a value of the wrong kind scores 0 with the reason instead of raising."""
    require(func)
    try:
        return METRICS[func](result, expected, options)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        return 0.0, f"{func}: cannot compare ({type(exc).__name__}: {exc})"
