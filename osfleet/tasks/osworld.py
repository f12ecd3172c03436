"""OSWorld-style task JSON, for the subset that works offline on an osfleet desktop.

Set-up types: execute, command, launch, sleep, open. Evaluator result getters: vm_command_line, vm_file.
Metrics: exact_match, check_include_exclude (several joined with conj "and"). Anything else is refused
with an error naming it, before a replica is touched.
"""

from __future__ import annotations

import shlex
from typing import Any

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


def _command(params: dict[str, Any]) -> str:
    cmd = params.get("command")
    if isinstance(cmd, list) and all(isinstance(c, str) for c in cmd):
        return shlex.join(cmd)
    if isinstance(cmd, str) and cmd:
        return cmd
    raise TaskError("an OSWorld command must be a string or a list of strings")


def _setup(step: dict[str, Any]) -> SetupStep:
    kind, params = step.get("type"), step.get("parameters") or {}
    if kind not in SETUP_TYPES:
        raise UnsupportedTaskError(f"unsupported OSWorld set-up type {kind!r} (supported: {', '.join(SETUP_TYPES)})")
    if kind in ("execute", "command"):
        return Run(type="run", command=_command(params))
    if kind == "launch":
        return Launch(type="launch", command=_command(params))
    if kind == "sleep":
        return Sleep(type="sleep", seconds=float(params.get("seconds", 1)))
    path = params.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise TaskError("an OSWorld open step needs an absolute path")
    return Launch(type="launch", command=f"xdg-open {shlex.quote(path)} 2>/dev/null || xedit {shlex.quote(path)}")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _match(func: str, expected: dict[str, Any]) -> Match:
    etype = expected.get("type")
    if etype == "constant":
        rules: dict[str, Any] = {"expected": expected.get("value")}
    elif etype == "rule":
        rules = expected.get("rules") or {}
    else:
        raise UnsupportedTaskError(f"unsupported OSWorld expected type {etype!r} (supported: rule, constant)")
    if func == "exact_match":
        if not isinstance(rules.get("expected"), str):
            raise TaskError("exact_match needs rules.expected as a string")
        return Match(equals=rules["expected"])
    return Match(include=list(rules.get("include", [])), exclude=list(rules.get("exclude", [])))


def from_osworld(data: dict[str, Any]) -> Task:
    setup = [_setup(s) for s in data.get("config") or []]
    evaluator = data.get("evaluator") or {}
    if not evaluator.get("func"):
        raise TaskError("OSWorld task has no evaluator func")
    funcs = _as_list(evaluator.get("func"))
    for f in funcs:
        if f not in METRICS:
            raise UnsupportedTaskError(f"unsupported OSWorld metric {f!r} (supported: {', '.join(METRICS)})")
    if evaluator.get("conj", "and") != "and":
        raise UnsupportedTaskError(f"unsupported OSWorld conj {evaluator.get('conj')!r} (supported: and)")
    for step in evaluator.get("postconfig") or []:
        raise UnsupportedTaskError(f"unsupported OSWorld postconfig type {step.get('type')!r}")
    results, expecteds = _as_list(evaluator.get("result")), _as_list(evaluator.get("expected"))
    if len(results) != len(funcs) or len(expecteds) != len(funcs):
        raise TaskError("OSWorld evaluator needs one result and one expected per func")
    criteria = []
    for i, (func, result, expected) in enumerate(zip(funcs, results, expecteds, strict=True)):
        rtype = (result or {}).get("type")
        if rtype not in RESULT_TYPES:
            raise UnsupportedTaskError(
                f"unsupported OSWorld result type {rtype!r} (supported: {', '.join(RESULT_TYPES)})"
            )
        match = _match(func, expected or {})
        if rtype == "vm_command_line":
            check: CommandOutput | FileContent = CommandOutput(
                type="command_output", command=_command(result), match=match
            )
        else:
            check = FileContent(type="file_content", path=result["path"], match=match)
        criteria.append(Criterion(name=f"{func} #{i + 1}", check=check))
    task_id = str(data.get("id", "osworld-task")).lower()
    return Task(
        id=task_id[:80] if task_id[:1].isalnum() else f"t{task_id[:79]}",
        instruction=str(data.get("instruction", "")),
        setup=setup,
        criteria=criteria,
        source="osworld",
    )
