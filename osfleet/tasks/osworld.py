"""OSWorld-format task JSON, for the features that work offline on an osfleet desktop.

Set-up (``config``) and ``postconfig`` step types: execute, command, launch, sleep, open, download,
activate_window, close_window. Getters: vm_command_line, vm_file, cloud_file, rule, vm_window_size (results);
rule, constant, vm_file, cloud_file, vm_command_line (expected). Metrics: see ``METRICS``, several joined
with conj "and". Anything else is refused with an error naming it, before a replica is touched.

Downloads and ``cloud_file`` values resolve through the host's asset store (osfleet.tasks.assets): a URL
it does not hold is refused naming the URL. The published schema lists the URLs the store holds when the
schema is made, so a client (and the contract check) sees which downloads this host can serve.

``OsworldTask`` is both the parser and the published request schema (OSGym's ``task_config``): what its
JSON schema allows, the server runs, and the other way round. Constraints that span fields (one result and
one expected per metric; exact_match needs a string to compare with) are spelled out in the schema too.
Metrics whose getters hand them values of the wrong kind score 0, as in OSWorld.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator

from osfleet.errors import OsfleetError, first_problem
from osfleet.tasks import evaluators
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.model import (
    CommandOutput,
    Criterion,
    FileContent,
    Launch,
    Match,
    OsworldCheck,
    PutFile,
    Run,
    SetupStep,
    Sleep,
    Task,
    TaskError,
    UnsupportedTaskError,
)

SETUP_TYPES = ("execute", "command", "launch", "sleep", "open", "download", "activate_window", "close_window")
RESULT_TYPES = ("vm_command_line", "vm_file", "cloud_file", "rule", "vm_window_size")
EXPECTED_TYPES = ("rule", "constant", "vm_file", "cloud_file", "vm_command_line")
METRICS = tuple(evaluators.METRICS)
MAX_CRITERIA = 3  # more makes the published schema too complex for schemathesis to generate from
MAX_STEPS = 16
MAX_DOWNLOADS = 8
GUEST_PATH = r"^/[^\x00]*$"
# How long an ``open`` step waits for the document's window. Under TCG LibreOffice's first start takes longer
# than the whole set-up budget (its splash still showed after 55 s here), so office documents need the
# application started before (pre-warmed), or a task that does not open them in its set-up.
OPEN_WINDOW_SECONDS = 45
# Which application opens a document, by extension (what xdg-open would pick on the office image).
OPENERS = {
    ("xlsx", "xls", "ods", "csv"): "libreoffice --calc",
    ("docx", "doc", "odt", "rtf"): "libreoffice --writer",
    ("pptx", "ppt", "odp"): "libreoffice --impress",
    ("png", "jpg", "jpeg", "xcf", "bmp", "gif"): "gimp",
}

Command = Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1)]
log = logging.getLogger(__name__)


def _stored_urls(field: str) -> Any:
    """Schema hook: ``field`` may only be a URL this host's asset store holds, listed when the schema is made."""

    def hook(schema: dict[str, Any]) -> None:
        try:
            urls = AssetStore.from_settings().urls()
        except OsfleetError as exc:  # a broken index must not take the API's documentation down with it
            log.warning("%s; the published schema offers no downloads", exc)
            urls = []
        if urls:
            schema["properties"][field]["enum"] = urls
        else:
            schema["properties"][field]["maxLength"] = 0  # with minLength 1: no download can run here
            schema["properties"][field]["minLength"] = 1

    return hook


class _Open(BaseModel):
    """OSWorld objects often carry keys osfleet does not use; they are allowed and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)


class CommandParams(_Open):
    command: Command


class SleepParams(_Open):
    seconds: float = Field(1.0, ge=0, le=120)


class OpenParams(_Open):
    path: str = Field(pattern=GUEST_PATH)


class DownloadFile(_Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_stored_urls("url"))

    url: str = Field(min_length=1)
    path: str = Field(pattern=GUEST_PATH)


class DownloadParams(_Open):
    files: Annotated[list[DownloadFile], Field(min_length=1, max_length=MAX_DOWNLOADS)]


class WindowParams(_Open):
    window_name: str = Field(min_length=1, max_length=200)
    strict: bool = False
    by_class: bool = False


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


class DownloadStep(_Open):
    type: Literal["download"]
    parameters: DownloadParams


class WindowStep(_Open):
    type: Literal["activate_window", "close_window"]
    parameters: WindowParams


AnyStep = ExecuteStep | LaunchStep | SleepStep | OpenStep | DownloadStep | WindowStep
OsworldStep = Annotated[AnyStep, Field(discriminator="type")]


class VmCommandLine(_Open):
    type: Literal["vm_command_line"]
    command: Command


class VmFile(_Open):
    type: Literal["vm_file"]
    path: str = Field(pattern=GUEST_PATH)


class CloudFile(_Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_stored_urls("path"))

    type: Literal["cloud_file"]
    path: str = Field(min_length=1)


class VmWindowSize(_Open):
    type: Literal["vm_window_size"]
    app_class_name: str = Field(min_length=1, max_length=200)


class Rules(_Open):
    expected: Any = None  # a string for exact_match (checked below); lists and objects for other metrics
    include: list[str] = []
    exclude: list[str] = []


class RuleExpected(_Open):
    type: Literal["rule"]
    rules: Rules = Rules()


class ConstantExpected(_Open):
    type: Literal["constant"]
    value: Any = None


Result = Annotated[VmCommandLine | VmFile | CloudFile | RuleExpected | VmWindowSize, Field(discriminator="type")]
Expected = Annotated[RuleExpected | ConstantExpected | VmFile | CloudFile | VmCommandLine, Field(discriminator="type")]


def _known_metric(name: str) -> str:
    if name not in METRICS:
        raise ValueError(f"unsupported OSWorld metric {name!r}")
    return name


# A metric osfleet runs (osfleet.tasks.evaluators.METRICS), offered as an enum in the published schema.
Metric = Annotated[str, AfterValidator(_known_metric), WithJsonSchema({"type": "string", "enum": list(METRICS)})]
ExpectedValue = RuleExpected | ConstantExpected | VmFile | CloudFile | VmCommandLine
ResultValue = VmCommandLine | VmFile | CloudFile | RuleExpected | VmWindowSize

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
            "then": {
                "properties": {
                    "result": {"type": "object"},
                    "expected": {"type": "object"},
                    "options": {"type": "object"},
                }
            },
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


Options = dict[str, Any]


class Evaluator(_Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_evaluator_schema)

    func: Metric | Annotated[list[Metric], Field(min_length=1, max_length=MAX_CRITERIA)]
    result: Result | Annotated[list[Result], Field(min_length=1, max_length=MAX_CRITERIA)]
    expected: Expected | Annotated[list[Expected], Field(min_length=1, max_length=MAX_CRITERIA)]
    options: Options | Annotated[list[Options], Field(max_length=MAX_CRITERIA)] = Field(
        {}, description="the metric's options: one object for a single func, or one per func"
    )
    conj: Literal["and"] = "and"
    postconfig: Annotated[list[OsworldStep], Field(max_length=MAX_STEPS)] = []

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
    config: Annotated[list[OsworldStep], Field(max_length=MAX_STEPS)] = []
    evaluator: Evaluator


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _expected_text(expected: ExpectedValue) -> Any:
    if isinstance(expected, ConstantExpected):
        return expected.value
    return expected.rules.expected if isinstance(expected, RuleExpected) else None


def _command(cmd: str | list[str]) -> str:
    return shlex.join(cmd) if isinstance(cmd, list) else cmd


def _posix_regex(text: str) -> str:
    """``text`` as a literal in a POSIX extended regular expression (xdotool's --name)."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def _open_steps(path: str) -> list[SetupStep]:
    """Open a document with its application, then wait (bounded) until its window shows, as OSWorld does."""
    q = shlex.quote(path)
    ext = PurePosixPath(path).suffix.lower().lstrip(".")
    opener = next((app for exts, app in OPENERS.items() if ext in exts), None)
    launch = f"{opener} {q}" if opener else f"xdg-open {q} 2>/dev/null || xedit {q}"
    title = shlex.quote(_posix_regex(PurePosixPath(path).name))
    wait = (
        "command -v xdotool >/dev/null || exit 0; "  # a desktop without xdotool cannot tell: do not wait
        f"end=$(($(date +%s) + {OPEN_WINDOW_SECONDS})); while [ $(date +%s) -lt $end ]; do "  # by the clock: each
        f"xdotool search --onlyvisible --name {title} >/dev/null 2>&1 && exit 0; sleep 1; done; "  # try is slow
        f"echo {shlex.quote(f'no window for {PurePosixPath(path).name} after {OPEN_WINDOW_SECONDS} s')} >&2; exit 1"
    )
    return [Launch(type="launch", command=launch), Run(type="run", command=wait, timeout=OPEN_WINDOW_SECONDS + 10)]


def _window_step(step: WindowStep) -> Run:
    """``wmctrl -a`` (activate) or ``-c`` (close) the window by title substring, exact title or class."""
    p = step.parameters
    flags = (["-x"] if p.by_class else []) + (["-F"] if p.strict else [])
    action = "-a" if step.type == "activate_window" else "-c"
    return Run(type="run", command=shlex.join(["wmctrl", *flags, action, p.window_name]))


def _steps(step: AnyStep, store: AssetStore) -> list[SetupStep]:
    if isinstance(step, ExecuteStep):
        return [Run(type="run", command=_command(step.parameters.command))]
    if isinstance(step, LaunchStep):
        return [Launch(type="launch", command=_command(step.parameters.command))]
    if isinstance(step, SleepStep):
        return [Sleep(type="sleep", seconds=step.parameters.seconds)]
    if isinstance(step, OpenStep):
        return _open_steps(step.parameters.path)
    if isinstance(step, DownloadStep):
        return [
            PutFile(type="put_file", path=f.path, url=f.url, sha256=store.resolve(f.url).sha256)
            for f in step.parameters.files
        ]
    return [_window_step(step)]


def _match(func: str, expected: RuleExpected | ConstantExpected) -> Match:
    if func == "exact_match":
        return Match(equals=_expected_text(expected))
    rules = expected.rules if isinstance(expected, RuleExpected) else Rules()
    if not rules.include and not rules.exclude:
        return Match(regex="")  # nothing to include or exclude: always met, as in OSWorld
    return Match(include=rules.include, exclude=rules.exclude)


def _in_guest(func: str, result: ResultValue, expected: ExpectedValue, options: Options) -> bool:
    """Command output and file text checks keep running in the guest, as before host-side metrics."""
    return (
        func in ("exact_match", "check_include_exclude")
        and isinstance(result, VmCommandLine | VmFile)
        and isinstance(expected, RuleExpected | ConstantExpected)
        and not options
    )


def _criterion(
    i: int, func: str, result: ResultValue, expected: ExpectedValue, options: Options, store: AssetStore
) -> Criterion:
    name = f"{func} #{i + 1}"
    if _in_guest(func, result, expected, options):
        assert isinstance(expected, RuleExpected | ConstantExpected)
        match = _match(func, expected)
        if isinstance(result, VmCommandLine):
            check: CommandOutput | FileContent | OsworldCheck = CommandOutput(
                type="command_output", command=_command(result.command), match=match
            )
        else:
            assert isinstance(result, VmFile)
            check = FileContent(type="file_content", path=result.path, match=match)
        return Criterion(name=name, check=check)
    evaluators.require(func)
    for getter in (result, expected):
        if isinstance(getter, CloudFile):
            store.resolve(getter.path)  # refused now, naming the URL, rather than at evaluation
    check = OsworldCheck(
        type="osworld",
        func=func,
        result=result.model_dump(mode="json"),
        expected=expected.model_dump(mode="json"),
        options=options,
    )
    return Criterion(name=name, check=check)


def _options(ev: Evaluator, n: int) -> list[Options]:
    """One options object per func: a single object applies to every func, a list is padded with none."""
    opts = ev.options
    if isinstance(opts, dict):
        return [opts] * n
    return [*opts, *[{}] * (n - len(opts))][:n]


def _refuse_unsupported(data: dict[str, Any]) -> None:
    """Name the first feature osfleet does not run, before the schema's more generic complaint."""
    evaluator = data.get("evaluator")
    postconfig = evaluator.get("postconfig") if isinstance(evaluator, dict) else None
    for where, steps in (("set-up", data.get("config")), ("postconfig", postconfig)):
        for step in steps if isinstance(steps, list) else []:
            kind = step.get("type") if isinstance(step, dict) else None
            if kind not in SETUP_TYPES:
                raise UnsupportedTaskError(
                    f"unsupported OSWorld {where} type {kind!r} (supported: {', '.join(SETUP_TYPES)})"
                )
    if not isinstance(evaluator, dict):
        return
    for f in _as_list(evaluator.get("func")):
        if f not in METRICS:
            raise UnsupportedTaskError(f"unsupported OSWorld metric {f!r} (supported: {', '.join(METRICS)})")
    if evaluator.get("conj", "and") != "and":
        raise UnsupportedTaskError(f"unsupported OSWorld conj {evaluator.get('conj')!r} (supported: and)")
    for key, allowed in (("result", RESULT_TYPES), ("expected", EXPECTED_TYPES)):
        for getter in _as_list(evaluator.get(key)):
            gtype = getter.get("type") if isinstance(getter, dict) else None
            if gtype not in allowed:
                raise UnsupportedTaskError(
                    f"unsupported OSWorld {key} type {gtype!r} (supported: {', '.join(allowed)})"
                )
            if isinstance(getter, dict) and (getter.get("multi") or isinstance(getter.get("path"), list)):
                raise UnsupportedTaskError(f"unsupported OSWorld {key} {gtype!r} with several files (multi)")


def from_osworld(data: dict[str, Any] | OsworldTask, store: AssetStore | None = None) -> Task:
    """An osfleet task from an OSWorld one; downloads and cloud files are resolved in ``store`` (this host's
    by default), so a task that needs a file the host lacks is refused now, naming its URL."""
    if isinstance(data, dict):
        _refuse_unsupported(data)
        try:
            data = OsworldTask.model_validate(data)
        except ValidationError as exc:
            raise TaskError(f"bad OSWorld task: {first_problem(exc, 'task')}") from None
    store = store or AssetStore.from_settings()
    ev = data.evaluator
    setup = [s for step in data.config for s in _steps(step, store)]
    postconfig = [s for step in ev.postconfig for s in _steps(step, store)]
    funcs = _as_list(ev.func)
    criteria = [
        _criterion(i, func, result, expected, opts, store)
        for i, (func, result, expected, opts) in enumerate(
            zip(funcs, _as_list(ev.result), _as_list(ev.expected), _options(ev, len(funcs)), strict=True)
        )
    ]
    task_id = re.sub(r"[^a-z0-9._-]", "-", data.id.lower())[:80] or "osworld-task"
    return Task(
        id=task_id if task_id[0].isalnum() else f"t{task_id[:79]}",
        instruction=data.instruction,
        setup=setup,
        postconfig=postconfig,
        criteria=criteria,
        source="osworld",
    )


def unsupported_features(data: Any, store: AssetStore | None = None) -> list[str]:
    """Every reason ``data`` cannot run here (empty: it can), for reports over many task files."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    problems: list[str] = []
    evaluator = data.get("evaluator")
    ev = evaluator if isinstance(evaluator, dict) else {}
    for where, steps in (("set-up", data.get("config")), ("postconfig", ev.get("postconfig"))):
        for step in steps if isinstance(steps, list) else []:
            kind = step.get("type") if isinstance(step, dict) else None
            if kind not in SETUP_TYPES:
                problems.append(f"{where} type {kind!r}")
    for f in _as_list(ev.get("func")):
        if f not in METRICS:
            problems.append(f"metric {f!r}")
    if ev.get("conj", "and") != "and":
        problems.append(f"conj {ev.get('conj')!r}")
    for key, allowed in (("result", RESULT_TYPES), ("expected", EXPECTED_TYPES)):
        for getter in _as_list(ev.get(key)):
            gtype = getter.get("type") if isinstance(getter, dict) else None
            if gtype not in allowed:
                problems.append(f"{key} type {gtype!r}")
            elif isinstance(getter, dict) and (getter.get("multi") or isinstance(getter.get("path"), list)):
                problems.append(f"{key} {gtype!r} with several files (multi)")
    if problems:
        return list(dict.fromkeys(problems))
    try:
        from_osworld(data, store)
    except OsfleetError as exc:
        return [str(exc)]
    return []
