"""The differential check of osfleet's office metrics: every case of ``tests/osworld_reference/office_cases.py``
(generated and hand-made file pairs: matching, near misses, broken, missing; the shipped suite's own files) is
scored by osfleet's metric and by OSWorld's own function (desktop-env 1.0.2, in the reference environment that
``scripts/setup-osworld-reference`` installs), and the scores must be equal.

When OSWorld's function raises, ``DesktopEnv.evaluate`` raises and OSWorld's runner records no result, which its
success rate counts as not solved: 0 (``tests/osworld_reference/cases.py``). Metrics of the benchmark's task
files whose reference cannot run here are listed in ``office_cases.UNCHECKED`` (no case) or ``SHIMMED`` (a
working stand-in for an import), with the reason; ``python -m tests.osworld_reference.table`` prints the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.tasks.model import UnsupportedTaskError
from osfleet.tasks.osworld_format.metrics import METRICS, require
from tests.conftest import OSWORLD_TASKS
from tests.osworld_reference.cases import Case, References, compare, same
from tests.osworld_reference.office_cases import REGISTRY, SHIMMED, UNCHECKED
from tests.osworld_reference.reference import STAND_INS
from tests.osworld_reference.verified import VERIFIED

pytestmark = pytest.mark.system

EXAMPLES = OSWORLD_TASKS / "examples"  # scripts/fetch-osworld-tasks

# The OSWorld modules this check covers, and the office metrics the benchmark takes from other modules.
OFFICE_MODULES = ("table", "docs", "slides", "pdf", "libreoffice")
OFFICE_ELSEWHERE = {"check_csv": "general", "compare_pdfs": "chrome", "check_config_status": "gimp"}


@pytest.fixture(scope="module")
def references() -> Iterator[References]:
    refs = References()
    yield refs
    refs.close()


@pytest.mark.parametrize("case", REGISTRY.cases, ids=lambda c: c.id)
def test_osfleet_scores_as_osworld(case: Case, references: References, tmp_path: Path) -> None:
    ours, reason, theirs, how = compare(references, case, tmp_path)
    assert same(ours, theirs), f"osfleet {ours} ({reason}) vs OSWorld {theirs} ({how})"


def _office_metrics_of_the_benchmark() -> set[str]:
    """Every function of OSWorld's office modules (and the office ones elsewhere) that a task file names."""
    import ast

    from tests.osworld_reference import reference_python

    metrics_dir = reference_python().parent.parent / "lib"
    sources = {p.stem: p for p in metrics_dir.glob("python3*/site-packages/desktop_env/evaluators/metrics/*.py")}
    defined = {
        node.name
        for module in OFFICE_MODULES
        for node in ast.parse(sources[module].read_text()).body
        if isinstance(node, ast.FunctionDef)
    }
    used: set[str] = set()
    for path in EXAMPLES.glob("*/*.json"):
        evaluator = json.loads(path.read_text()).get("evaluator")
        funcs = evaluator.get("func") if isinstance(evaluator, dict) else None
        used.update(f for f in (funcs if isinstance(funcs, list) else [funcs]) if isinstance(f, str))
    return used & (defined | set(OFFICE_ELSEWHERE)) | (used & set(UNCHECKED))


def test_every_office_metric_of_the_benchmark_is_in_osfleet_and_checked(osworld_tasks: Path) -> None:
    used = _office_metrics_of_the_benchmark()
    checked = {c.metric for c in REGISTRY.cases}
    assert len(used) >= 35, sorted(used)  # 39 in the task files of desktop-env 1.0.2's time
    missing = sorted(m for m in used - set(UNCHECKED) if m not in METRICS)
    assert not missing, f"office metrics of the task files that osfleet lacks: {missing}"
    unchecked = sorted(used - checked - set(UNCHECKED) - VERIFIED)  # those: test_osworld_differential_verified.py
    assert not unchecked, f"office metrics with no differential case and no reason listed: {unchecked}"
    assert checked <= set(METRICS)


def test_metrics_without_a_case_are_refused_by_name() -> None:
    for metric in UNCHECKED:
        with pytest.raises(UnsupportedTaskError, match=metric):
            require(metric)


def test_shimmed_metrics_say_which_import_their_reference_lacks() -> None:
    for metric in SHIMMED:
        shims = {s for c in REGISTRY.cases if c.metric == metric for s in c.shims}
        assert shims and shims <= set(STAND_INS), (metric, shims)
        assert (Path(__file__).parent / "osworld_reference").joinpath(*[f"shim_{s}.py" for s in shims][:1]).exists()
