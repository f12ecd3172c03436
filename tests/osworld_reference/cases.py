"""Differential cases: one metric, one set of inputs, scored by osfleet and by OSWorld's own function.

A case builds its files in a folder it is given and returns ``(result, expected, options)`` as osfleet's
getters would hand them to a metric (``Path`` for a file, ``None`` for a file that is not there, a dict for a
rule getter, ``NO_EXPECTED`` when the task has no ``expected``).

``osworld_score`` calls OSWorld's function as ``DesktopEnv.evaluate`` does (``metric(result, expected,
**options)``, or ``metric(result, **options)`` when the task has no ``expected``). When OSWorld's function
raises (or returns no number), ``evaluate`` raises and OSWorld's runner records no result for the task, which
its success rate counts as not solved: such a case scores 0, and osfleet must score it 0 too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.osworld_reference import Reference, ReferenceError

NO_EXPECTED = object()
Inputs = tuple[Any, Any, dict[str, Any]]


@dataclass(frozen=True)
class Case:
    metric: str  # the name in a task file: osfleet's METRICS key and OSWorld's function
    module: str  # OSWorld's metrics module holding the function
    name: str
    build: Callable[[Path], Inputs]
    shims: tuple[str, ...] = ()  # imports the reference satisfies with tests/osworld_reference/shim_<name>.py

    @property
    def id(self) -> str:
        return f"{self.metric}-{self.name}"


class Registry:
    """The cases of one family of metrics, added by their builders."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def add(self, metric: str, module: str, name: str, build: Callable[[Path], Inputs], shims: tuple[str, ...] = ()):
        if any(c.metric == metric and c.name == name for c in self.cases):
            raise ValueError(f"two cases named {metric}-{name}")
        self.cases.append(Case(metric, module, name, build, shims))


def _paths_as_str(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_paths_as_str(v) for v in value]
    return value


def osworld_score(ref: Reference, case: Case, inputs: Inputs) -> tuple[float, str]:
    result, expected, options = inputs
    args = [_paths_as_str(result)] if expected is NO_EXPECTED else [_paths_as_str(result), _paths_as_str(expected)]
    try:
        return ref.score(case.module, case.metric, *args, **options), "scored"
    except ReferenceError as exc:
        return 0.0, f"OSWorld raised ({exc}): no result, not solved"


def osfleet_score(case: Case, inputs: Inputs) -> tuple[float, str]:
    from osfleet.tasks.osworld_format.metrics import run_metric

    result, expected, options = inputs
    return run_metric(case.metric, result, None if expected is NO_EXPECTED else expected, options)


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)


class References:
    """One reference process per set of shims, started on first use."""

    def __init__(self) -> None:
        self._refs: dict[tuple[str, ...], Reference] = {}

    def __call__(self, shims: tuple[str, ...]) -> Reference:
        if shims not in self._refs:
            self._refs[shims] = Reference(shims=shims)
        return self._refs[shims]

    def close(self) -> None:
        for ref in self._refs.values():
            ref.close()
        self._refs.clear()


def compare(refs: References, case: Case, folder: Path) -> tuple[float, str, float, str]:
    """``(osfleet score, its reason, OSWorld score, what OSWorld did)`` for one case."""
    folder.mkdir(parents=True, exist_ok=True)
    inputs = case.build(folder)
    ours, reason = osfleet_score(case, inputs)
    theirs, how = osworld_score(refs(case.shims), case, inputs)
    return ours, reason, theirs, how
