"""OSWorld evaluator functions, written for osfleet from OSWorld's documented semantics, run on the host.

Each metric takes the ``result`` and ``expected`` values its getters produced (a local file path for
``vm_file``/``cloud_file``, a string for ``vm_command_line``, a dict for ``rule``) and the evaluator's
``options``, and returns a score in [0, 1]. A value a metric cannot use (a file that is missing, corrupt,
or of the wrong kind) scores 0 with a reason, as in OSWorld: the agent did not produce what was asked.
Only failures to reach the guest are infrastructure errors, and those are raised by the getters. Metrics run in
the evaluation sandbox (``run_metric``): a file built to hurt its parser costs its own episode a 0, never the host.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from osfleet.tasks.evaluators import documents, tables, text
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
    "compare_table": tables.compare_table,
    "compare_docx_files": documents.compare_docx_files,
    "compare_pptx_files": documents.compare_pptx_files,
}

# Python modules a metric needs on the host (the ``office`` extra of osfleet).
NEEDS: dict[str, tuple[str, str]] = {
    "compare_table": ("openpyxl", "openpyxl"),
    "compare_docx_files": ("docx", "python-docx"),
    "compare_pptx_files": ("pptx", "python-pptx"),
}


def require(func: str) -> None:
    """Refuse a task whose metric cannot run on this host, before a replica is touched."""
    if func not in METRICS:
        raise UnsupportedTaskError(f"unsupported OSWorld metric {func!r} (supported: {', '.join(METRICS)})")
    need = NEEDS.get(func)
    if need and importlib.util.find_spec(need[0]) is None:
        raise UnsupportedTaskError(
            f"OSWorld metric {func!r} needs {need[1]} on this host (pip install 'osfleet[office]')"
        )


def run_metric(func: str, result: Any, expected: Any, options: dict[str, Any], wall: float | None = None) -> Score:
    """Score one metric in the evaluation sandbox (``osfleet.tasks.sandbox``), never in this process: whatever
    goes wrong inside it (a value of the wrong kind, a corrupt or hostile file, a limit hit) scores 0 with the
    reason. ``wall``: at most this many seconds. Raises only when the sandbox itself fails (infrastructure)."""
    require(func)
    from osfleet.tasks import sandbox

    return sandbox.default().run(func, result, expected, options, wall)
