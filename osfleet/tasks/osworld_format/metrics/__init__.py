"""OSWorld evaluator functions, written for osfleet from OSWorld's documented semantics, run on the host.

Each metric takes the ``result`` and ``expected`` values its getters produced (a local file path for
``vm_file``/``cloud_file``, a string for ``vm_command_line``, a dict for ``rule``) and the evaluator's
``options``, and returns a score with a reason: a number in [0, 1], or it scores 0 saying why
(``osfleet.tasks.rewards``: ``run_sqlite3`` returns its query's number as OSWorld does, and a number above 1 is
such a 0, never clamped). A value a metric cannot use (a file that is missing, corrupt, or of the wrong
kind) scores 0 with a reason, as in OSWorld, where the metric raises and the task gets no score: the agent
did not produce what was asked. Only failures to reach the guest are infrastructure errors, and those are
raised by the getters. Metrics run in the evaluation sandbox (``run_metric``): a file built to hurt its parser
costs its own episode a 0, never the host.

Metrics live in one module per family, each exporting ``METRICS`` and ``NEEDS`` (the Python modules a metric
imports beyond osfleet's own dependencies); the differential check (``tests/test_osworld_differential_*``)
scores each against OSWorld's own function.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from typing import Any

from osfleet.tasks.errors import UnsupportedTaskError
from osfleet.tasks.jail import sandbox
from osfleet.tasks.osworld_format.metrics import (
    archives,
    browser,
    desktop,
    documents,
    images,
    json_settings,
    mail,
    media,
    ocr,
    office_config,
    pdfs,
    programs,
    records,
    sheets_csv,
    slides,
    tables,
    text,
)
from osfleet.tasks.osworld_format.metrics.registry import METRICS  # filled below, from the families

Metric = Callable[[Any, Any, dict[str, Any]], "Score"]
Score = tuple[float, str]

FAMILIES = (
    tables, sheets_csv, documents, slides, office_config, pdfs,  # office files
    text, json_settings, records, desktop, browser, archives, images, ocr, media, mail, programs,
)  # fmt: skip
# Python modules a metric needs on the host, beyond osfleet's own dependencies.
NEEDS: dict[str, tuple[str, ...]] = {}
# Programs a metric runs on the host (in its sandbox), with the Debian package that has them.
TOOLS: dict[str, tuple[str, ...]] = {}
TOOL_PACKAGES = {"tesseract": "tesseract-ocr"}
for _family in FAMILIES:
    _clash = set(METRICS) & set(_family.METRICS)
    if _clash:  # one implementation per metric: a second would silently replace the first
        raise RuntimeError(f"{_family.__name__} defines {sorted(_clash)} again")
    METRICS.update(_family.METRICS)
    for _name, _needs in getattr(_family, "NEEDS", {}).items():
        # a module name, or (module, package) pairs as the office families write them
        NEEDS[_name] = tuple(n if isinstance(n, str) else n[0] for n in _needs)
    TOOLS.update(getattr(_family, "TOOLS", {}))

# Where a needed module comes from: (pip requirement, the osfleet extra that pins it).
PACKAGES: dict[str, tuple[str, str]] = {
    "openpyxl": ("openpyxl", "office"),
    "pandas": ("pandas", "office"),
    "formulas": ("formulas", "office"),
    "odf": ("odfpy", "office"),
    "docx": ("python-docx", "office"),
    "pptx": ("python-pptx", "office"),
    "numpy": ("numpy", "osworld"),
    "scipy": ("scipy", "osworld"),
    "skimage": ("scikit-image", "osworld"),
    "cv2": ("opencv-python-headless", "osworld"),
    "imagehash": ("imagehash", "osworld"),
    "rapidfuzz": ("rapidfuzz", "osworld"),
    "bs4": ("beautifulsoup4", "osworld"),
    "lxml": ("lxml", "osworld"),
    "cssselect": ("cssselect", "osworld"),
    "tldextract": ("tldextract", "osworld"),
    "mutagen": ("mutagen", "osworld"),
    "pdfplumber": ("pdfplumber", "osworld"),
    "pypdf": ("pypdf", "osworld"),
    "librosa": ("librosa", "osworld"),
    "fastdtw": ("fastdtw", "osworld"),
}


def require(func: str) -> None:
    """Refuse a task whose metric cannot run on this host, before a replica is touched."""
    if func not in METRICS:
        raise UnsupportedTaskError(f"unsupported OSWorld metric {func!r} (supported: {', '.join(METRICS)})")
    for module in NEEDS.get(func, ()):
        if importlib.util.find_spec(module) is None:
            pip, extra = PACKAGES[module]
            raise UnsupportedTaskError(
                f"OSWorld metric {func!r} needs {pip} on this host (pip install 'osfleet[{extra}]')"
            )
    for tool in TOOLS.get(func, ()):
        if shutil.which(tool) is None:
            package = TOOL_PACKAGES.get(tool, tool)
            raise UnsupportedTaskError(f"OSWorld metric {func!r} needs {tool} on this host (apt-get install {package})")


def run_metric(func: str, result: Any, expected: Any, options: dict[str, Any], wall: float | None = None) -> Score:
    """Score one metric in the evaluation sandbox (``osfleet.tasks.jail.sandbox``), never in this process: whatever
    goes wrong inside it (a value of the wrong kind, a corrupt or hostile file, a limit hit) scores 0 with the
    reason. ``wall``: at most this many seconds. Raises only when the sandbox itself fails (infrastructure)."""
    require(func)
    return sandbox.default().run(func, result, expected, options, wall)
