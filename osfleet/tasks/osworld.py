"""OSWorld-style task JSON, for the subset that works offline on an osfleet desktop.

Set-up types: execute, command, launch, sleep, open. Evaluator result getters: vm_command_line, vm_file.
Metrics: exact_match, check_include_exclude (several joined with conj "and"). Anything else is refused
with an error naming it, before a replica is touched.

``OsworldTask`` is both the parser and the published request schema (OSGym's ``task_config``): what its
JSON schema allows, the server runs, and the other way round. Constraints that span fields (one result and
one expected per metric; exact_match needs a string to compare with) are spelled out in the schema too.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from osfleet.errors import first_problem
from osfleet.tasks.model import (
    CommandOutput,
    Criterion,
    FileContent,
    Launch,
    Match,
    Run,
    SetupStep,
    Sleep,
    Task,
    TaskError,
    UnsupportedTaskError,
)

SETUP_TYPES = ("execute", "command", "launch", "sleep", "open")
RESULT_TYPES = ("vm_command_line", "vm_file")
METRICS = ("exact_match", "check_include_exclude")
EXPECTED_TYPES = ("rule", "constant")
MAX_CRITERIA = 3  # more makes the published schema too complex for schemathesis to generate from
GUEST_PATH = r"^/[^\x00]*$"

Command = Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)]


class _Open(BaseModel):
    """OSWorld objects often carry keys osfleet does not use; they are allowed and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


class CommandParams(_Open):
    command: Command


class SleepParams(_Open):
    seconds: float = Field(1.0, ge=0, le=120)


class OpenParams(_Open):
    path: str = Field(pattern=GUEST_PATH)


class ExecuteStep(_Open):
    type: Literal["execute", "command"]
    parameters: CommandParams


class LaunchStep(_Open):
    type: Literal["launch"]
    parameters: CommandParams


class SleepStep(_Open):
    type: Literal["sleep"]
    parameters: SleepParams = SleepParams()


class OpenStep(_Open):
    type: Literal["open"]
    parameters: OpenParams


OsworldStep = Annotated[ExecuteStep | LaunchStep | SleepStep | OpenStep, Field(discriminator="type")]


class VmCommandLine(_Open):
    type: Literal["vm_command_line"]
    command: Command


class VmFile(_Open):
    type: Literal["vm_file"]
    path: str = Field(pattern=GUEST_PATH)


Result = Annotated[VmCommandLine | VmFile, Field(discriminator="type")]


class Rules(_Open):
    expected: str | None = None
    include: list[str] = []
    exclude: list[str] = []


class RuleExpected(_Open):
    type: Literal["rule"]
    rules: Rules = Rules()


class ConstantExpected(_Open):
    type: Literal["constant"]
    value: Any = None


Expected = Annotated[RuleExpected | ConstantExpected, Field(discriminator="type")]
Metric = Literal["exact_match", "check_include_exclude"]

# exact_match compares with a string: rules.expected, or a constant's value.
_EXACT = {
    "anyOf": [
        {
            "properties": {
                "type": {"const": "rule"},
                "rules": {"required": ["expected"], "properties": {"expected": {"type": "string"}}},
            },
            "required": ["rules"],
        },
        {"properties": {"type": {"const": "constant"}, "value": {"type": "string"}}, "required": ["value"]},
    ]
}


def _evaluator_schema(schema: dict[str, Any]) -> None:
    rules: list[dict[str, Any]] = [
        {
            "if": {"properties": {"func": {"type": "string"}}},
            "then": {"properties": {"result": {"type": "object"}, "expected": {"type": "object"}}},
        }
    ]
    for k in range(1, MAX_CRITERIA + 1):
        n = {"type": "array", "minItems": k, "maxItems": k}
        rules.append({"if": {"properties": {"func": n}}, "then": {"properties": {"result": n, "expected": n}}})
    rules.append(
        {"if": {"properties": {"func": {"const": "exact_match"}}}, "then": {"properties": {"expected": _EXACT}}}
    )
    for i in range(MAX_CRITERIA):
        func_i = {"type": "array", "prefixItems": [{}] * i + [{"const": "exact_match"}]}
        expected_i = {"type": "array", "prefixItems": [{}] * i + [_EXACT]}
        rules.append({"if": {"properties": {"func": func_i}}, "then": {"properties": {"expected": expected_i}}})
    schema["allOf"] = rules


class Evaluator(_Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_evaluator_schema)

    func: Metric | Annotated[list[Metric], Field(min_length=1, max_length=MAX_CRITERIA)]
    result: Result | Annotated[list[Result], Field(min_length=1, max_length=MAX_CRITERIA)]
    expected: Expected | Annotated[list[Expected], Field(min_length=1, max_length=MAX_CRITERIA)]
    conj: Literal["and"] = "and"
    postconfig: Annotated[list[dict[str, Any]], Field(max_length=0)] = []

    @model_validator(mode="after")
    def _paired(self) -> Evaluator:
        funcs, results, expecteds = _as_list(self.func), _as_list(self.result), _as_list(self.expected)
        forms = {isinstance(x, list) for x in (self.func, self.result, self.expected)}
        if len(forms) != 1 or len(results) != len(funcs) or len(expecteds) != len(funcs):
            raise ValueError("OSWorld evaluator needs one result and one expected per func (all lists, or none)")
        for f, e in zip(funcs, expecteds, strict=True):
            if f == "exact_match" and not isinstance(_expected_text(e), str):
                raise ValueError("exact_match needs rules.expected (or a constant value) as a string")
        return self


class OsworldTask(_Open):
    """An OSWorld task in the subset osfleet runs."""

    id: str = Field("osworld-task", max_length=200)
    instruction: str = Field(min_length=1)
    config: list[OsworldStep] = []
    evaluator: Evaluator


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _expected_text(expected: RuleExpected | ConstantExpected) -> Any:
    return expected.value if isinstance(expected, ConstantExpected) else expected.rules.expected


def _command(cmd: str | list[str]) -> str:
    return shlex.join(cmd) if isinstance(cmd, list) else cmd


def _setup(step: ExecuteStep | LaunchStep | SleepStep | OpenStep) -> SetupStep:
    if isinstance(step, ExecuteStep):
        return Run(type="run", command=_command(step.parameters.command))
    if isinstance(step, LaunchStep):
        return Launch(type="launch", command=_command(step.parameters.command))
    if isinstance(step, SleepStep):
        return Sleep(type="sleep", seconds=step.parameters.seconds)
    path = shlex.quote(step.parameters.path)
    return Launch(type="launch", command=f"xdg-open {path} 2>/dev/null || xedit {path}")


def _match(func: str, expected: RuleExpected | ConstantExpected) -> Match:
    if func == "exact_match":
        return Match(equals=_expected_text(expected))
    rules = expected.rules if isinstance(expected, RuleExpected) else Rules()
    if not rules.include and not rules.exclude:
        return Match(regex="")  # nothing to include or exclude: always met, as in OSWorld
    return Match(include=rules.include, exclude=rules.exclude)


def _refuse_unsupported(data: dict[str, Any]) -> None:
    """Name the first feature osfleet does not run, before the schema's more generic complaint."""
    for step in data.get("config") or []:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind not in SETUP_TYPES:
            raise UnsupportedTaskError(
                f"unsupported OSWorld set-up type {kind!r} (supported: {', '.join(SETUP_TYPES)})"
            )
    evaluator = data.get("evaluator")
    if not isinstance(evaluator, dict):
        return
    for f in _as_list(evaluator.get("func")):
        if f not in METRICS:
            raise UnsupportedTaskError(f"unsupported OSWorld metric {f!r} (supported: {', '.join(METRICS)})")
    if evaluator.get("conj", "and") != "and":
        raise UnsupportedTaskError(f"unsupported OSWorld conj {evaluator.get('conj')!r} (supported: and)")
    for step in evaluator.get("postconfig") or []:
        kind = step.get("type") if isinstance(step, dict) else step
        raise UnsupportedTaskError(f"unsupported OSWorld postconfig type {kind!r}")
    for result in _as_list(evaluator.get("result")):
        rtype = result.get("type") if isinstance(result, dict) else None
        if rtype not in RESULT_TYPES:
            raise UnsupportedTaskError(
                f"unsupported OSWorld result type {rtype!r} (supported: {', '.join(RESULT_TYPES)})"
            )
    for expected in _as_list(evaluator.get("expected")):
        etype = expected.get("type") if isinstance(expected, dict) else None
        if etype not in EXPECTED_TYPES:
            raise UnsupportedTaskError(f"unsupported OSWorld expected type {etype!r} (supported: rule, constant)")


def from_osworld(data: dict[str, Any] | OsworldTask) -> Task:
    if isinstance(data, dict):
        _refuse_unsupported(data)
        try:
            data = OsworldTask.model_validate(data)
        except ValidationError as exc:
            raise TaskError(f"bad OSWorld task: {first_problem(exc, 'task')}") from None
    ev = data.evaluator
    criteria = []
    for i, (func, result, expected) in enumerate(
        zip(_as_list(ev.func), _as_list(ev.result), _as_list(ev.expected), strict=True)
    ):
        match = _match(func, expected)
        if isinstance(result, VmCommandLine):
            check: CommandOutput | FileContent = CommandOutput(
                type="command_output", command=_command(result.command), match=match
            )
        else:
            check = FileContent(type="file_content", path=result.path, match=match)
        criteria.append(Criterion(name=f"{func} #{i + 1}", check=check))
    task_id = re.sub(r"[^a-z0-9._-]", "-", data.id.lower())[:80] or "osworld-task"
    return Task(
        id=task_id if task_id[0].isalnum() else f"t{task_id[:79]}",
        instruction=data.instruction,
        setup=[_setup(s) for s in data.config],
        criteria=criteria,
        source="osworld",
    )
