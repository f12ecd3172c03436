"""Tasks on the host: where they come from (built-in files, inline, OSWorld's format) and the reward arithmetic.

The task format itself is part of the contract (``osfleet.protocol.tasks``, re-exported here). A verifier is a
list of criteria, each a check run in the guest (code, not a model) with a weight and a required flag: reward =
weighted share of criteria met, success = every required criterion met. A check that cannot run (the guest
agent is gone, a timeout) is an infrastructure failure and raises: it is never scored as an unmet criterion.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from osfleet.errors import first_problem
from osfleet.protocol.tasks import (
    Check,
    CommandOutput,
    Criterion,
    CriterionResult,
    DeclaredInfeasible,
    Evaluation,
    FileContent,
    GuestQuery,
    Launch,
    Match,
    OsworldCheck,
    OsworldScoring,
    PutFile,
    Run,
    SetupStep,
    Sleep,
    Task,
)
from osfleet.tasks.errors import TaskError, UnsupportedTaskError
from osfleet.tasks.osworld_format.convert import from_osworld


def score(results: list[CriterionResult]) -> Evaluation:
    """The weighted share of criteria met. Weights are finite and positive (``Criterion``); each is taken relative
    to the largest, so no sum overflows (two weights of 1e308) and the share stays in [0, 1]."""
    top = max((r.weight for r in results), default=0.0)
    total = sum(r.weight / top for r in results) if top else 0.0
    met = sum(r.weight / top for r in results if r.met) if top else 0.0
    return Evaluation(
        reward=min(met / total, 1.0) if total else 0.0,
        success=all(r.met for r in results if r.required),
        criteria=results,
    )


def parse_task(data: object, origin: str = "task") -> Task:
    """A task from osfleet's own format or OSWorld's (recognised by its ``config``/``evaluator`` keys)."""
    if isinstance(data, dict) and ("evaluator" in data or "config" in data):
        return from_osworld(data)
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"bad task {origin}: {first_problem(exc, 'task')}") from None


def load_task_file(path: Path) -> Task:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise TaskError(f"cannot read task {path}: {str(exc).splitlines()[0]}") from None
    return parse_task(data, str(path))


BUILTIN_DIR = Path(__file__).parent / "builtin"


def builtin_tasks() -> list[Task]:
    """Copies (a caller may change its own): the files are parsed once per version of each, not at every
    reset that names a task (parsing all of them took ~20 ms of each reset request)."""
    tasks = []
    for p in sorted(BUILTIN_DIR.glob("*.yaml")):
        try:
            version = p.stat().st_mtime_ns
        except OSError as exc:
            raise TaskError(f"cannot read task {p}: {exc.strerror}") from None
        tasks.append(_parsed(p, version).model_copy(deep=True))
    return tasks


@functools.lru_cache(maxsize=256)
def _parsed(path: Path, version: int) -> Task:
    return load_task_file(path)


def find_task(task_id: str) -> Task:
    for task in builtin_tasks():
        if task.id == task_id:
            return task
    raise TaskError(f"no built-in task {task_id!r} (see 'osfleet tasks ls')")


__all__ = [
    "BUILTIN_DIR",
    "Check",
    "CommandOutput",
    "Criterion",
    "CriterionResult",
    "DeclaredInfeasible",
    "Evaluation",
    "FileContent",
    "GuestQuery",
    "Launch",
    "Match",
    "OsworldCheck",
    "OsworldScoring",
    "PutFile",
    "Run",
    "SetupStep",
    "Sleep",
    "Task",
    "TaskError",
    "UnsupportedTaskError",
    "builtin_tasks",
    "find_task",
    "load_task_file",
    "parse_task",
    "score",
]
