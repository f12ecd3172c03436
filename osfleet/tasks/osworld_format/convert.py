"""OSWorld-format task JSON: parsed, checked, and turned into an osfleet task that runs it as OSWorld would.

The parts of a task file are typed in ``spec.py`` (set-up steps and getters, from OSWorld's own code);
this module puts them together: the task and its evaluator (``func`` alone or a list joined by ``conj``
``and``/``or``, one ``result``/``expected``/``options`` per metric, ``postconfig``), OSWorld's ``infeasible``
tasks (scored from the agent's declared failure), and the conversion into osfleet's task model, which the
runner executes (``osfleet.tasks.runner``) with the getters of ``getters.py``.

Downloads, ``cloud_file`` values and the history template of ``update_browse_history`` resolve through the
host's asset store (osfleet.tasks.assets): a URL it does not hold is refused naming the URL. The published
schema lists the URLs the store holds when the schema is made, so a client (and the contract check) sees
which downloads this host can serve.

``OsworldTask`` is both the parser and the published request schema (OSGym's ``task_config``): what its
JSON schema allows, the server runs, and the other way round. Metrics whose getters hand them values of the
wrong kind score 0, as in OSWorld. ``unsupported_features`` names, for a whole task file at once, everything
osfleet does not run (an import report), where ``from_osworld`` refuses the first.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from osfleet.protocol.tasks import (
    Criterion,
    DeclaredInfeasible,
    GuestQuery,
    Launch,
    OsworldCheck,
    OsworldScoring,
    PutFile,
    Run,
    SetupStep,
    Sleep,
    Task,
)
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.errors import TaskError, UnsupportedTaskError
from osfleet.tasks.osworld_format import metrics as metric_registry
from osfleet.tasks.osworld_format.guest_paths import (
    PLACEHOLDERS,
    guest_path,
    needs_screen,
    shell_command,
    truthy,
    unknown_placeholders,
)
from osfleet.tasks.osworld_format.spec import (
    GETTER_TYPES,
    HISTORY_TEMPLATE_URL,
    OFFLINE,
    SETUP_TYPES,
    AnyGetter,
    AnyStep,
    BrowseHistoryStep,
    ChromeCloseTabsStep,
    ChromeOpenTabsStep,
    CloudFile,
    DownloadStep,
    ExecuteStep,
    Flag,
    Getter,
    LaunchStep,
    Open,
    OpenStep,
    OsworldStep,
    SleepStep,
    VmFile,
    WallpaperStep,
    WindowStep,
)

INFEASIBLE = "infeasible"
METRICS = (*metric_registry.METRICS, INFEASIBLE)
MAX_CRITERIA = 5  # the most funcs one of OSWorld's task files joins (each more makes the published schema larger)
MAX_STEPS = 32
COMMAND_TIMEOUT_SECONDS = 120.0  # OSWorld's server gives each executed command this long
CHROME_PROFILE = "/home/user/.config/google-chrome"  # where OSWorld's Chrome getters and set-up look
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

Metric = Literal[METRICS]  # type: ignore[valid-type]
ListedMetric = Literal[tuple(metric_registry.METRICS)]  # type: ignore[valid-type]  # (infeasible stands alone)
Options = dict[str, Any]
Resolve = Callable[[str], str]  # an asset URL -> its sha256 in the store (or raises MissingAssetError)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _evaluator_schema(schema: dict[str, Any]) -> None:
    """What ``Evaluator._paired`` checks, for the published schema: a result unless the task is infeasible,
    and one result (and expected) per func: objects for a single func, lists as long as a list of funcs."""
    one = {"type": "object"}
    rules: list[dict[str, Any]] = [
        {"if": {"properties": {"func": {"not": {"const": INFEASIBLE}}}}, "then": {"required": ["result"]}},
        {
            "if": {"properties": {"func": {"type": "string"}}},
            "then": {"properties": {"result": one, "expected": one}},
        },
    ]
    for k in range(1, MAX_CRITERIA + 1):
        n = {"type": "array", "minItems": k, "maxItems": k}
        rules.append({"if": {"properties": {"func": n}}, "then": {"properties": {"result": n, "expected": n}}})
    schema["allOf"] = rules


class Evaluator(Open):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_evaluator_schema)

    func: Metric | Annotated[list[ListedMetric], Field(min_length=1, max_length=MAX_CRITERIA)]  # type: ignore[valid-type]
    # Absent rather than null (pydantic does not check defaults): the published schema allows no null here.
    result: Getter | Annotated[list[Getter], Field(min_length=1, max_length=MAX_CRITERIA)] = None  # type: ignore[assignment]
    expected: Getter | Annotated[list[Getter | None], Field(min_length=1, max_length=MAX_CRITERIA)] = None  # type: ignore[assignment]
    options: Options | Annotated[list[Options | None], Field(max_length=MAX_CRITERIA)] = Field(
        {}, description="the metric's options: one object for a single func, or one per func (null: none)"
    )
    conj: Literal["and", "or"] = "and"
    postconfig: Annotated[list[OsworldStep], Field(max_length=MAX_STEPS)] = []

    @model_validator(mode="after")
    def _paired(self) -> Evaluator:
        if self.func == INFEASIBLE:
            return self
        if self.result is None:
            raise ValueError("an OSWorld evaluator needs a result getter for its func")
        several = isinstance(self.func, list)
        for key in ("result", "expected"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, list) != several or (several and len(value) != len(self.func))):
                raise ValueError(f"an OSWorld evaluator needs one {key} per func (all lists, or none)")
        return self


class OsworldTask(Open):
    """An OSWorld task, in the features osfleet runs."""

    id: str = Field("osworld-task", max_length=200)
    instruction: str = Field(min_length=1)
    config: Annotated[list[OsworldStep], Field(max_length=MAX_STEPS)] = []
    evaluator: Evaluator
    proxy: Flag = Field(False, description="OSWorld runs the task behind a proxy (its sites block data centres)")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        """A feature osfleet does not run is named with its reason (a 422 through the API), before the
        schema's more generic complaint about an unexpected tag."""
        if isinstance(data, dict):
            problems = _feature_problems(data, METRICS)
            if problems:
                raise ValueError(f"unsupported OSWorld {problems[0]}")
        return data


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
    exists = f"test -e {q} || {{ echo {shlex.quote(f'file not found: {path}')} >&2; exit 1; }}"
    return [
        Run(type="run", command=exists),
        Launch(type="launch", command=launch),
        Run(type="run", command=wait, timeout=OPEN_WINDOW_SECONDS + 10),
    ]


def _window_step(step: WindowStep) -> Run:
    """``wmctrl -a`` (activate) or ``-c`` (close) the window by title substring, exact title or class; as in
    OSWorld, a window that is not there is no failure of the set-up."""
    p = step.parameters
    flags = (["-x"] if truthy(p.by_class) else []) + (["-F"] if truthy(p.strict) else [])
    action = "-a" if step.type == "activate_window" else "-c"
    return Run(type="run", command=shlex.join(["wmctrl", *flags, action, p.window_name]), ignore_exit=True)


def _command(command: str | list[str], shell: Any) -> str:
    """The command line; one shlex cannot split (an open quote) fails when it runs, as on OSWorld's server."""
    try:
        return shell_command(command, shell)
    except ValueError as exc:
        return f"echo {shlex.quote(f'cannot split {command!r} into arguments: {exc}')} >&2; exit 2"


def _steps(step: AnyStep, sha: Resolve) -> list[SetupStep]:
    if isinstance(step, ExecuteStep):
        p = step.parameters
        command = _command(p.command, p.shell)
        return [
            Run(
                type="run",
                command=command,
                timeout=COMMAND_TIMEOUT_SECONDS,
                ignore_exit=True,
                stdout_to=p.stdout or None,
                stderr_to=p.stderr or None,
                fill_screen=needs_screen(command),
            )
        ]
    if isinstance(step, LaunchStep):
        command = _command(step.parameters.command, step.parameters.shell)
        argv = step.parameters.command
        chrome = isinstance(argv, list) and argv[0] == "google-chrome"  # as OSWorld's _launch_setup tells
        return [Launch(type="launch", command=command, fill_screen=needs_screen(command), chrome=chrome)]
    if isinstance(step, SleepStep):
        return [Sleep(type="sleep", seconds=step.parameters.seconds)]
    if isinstance(step, OpenStep):
        return _open_steps(guest_path(step.parameters.path))
    if isinstance(step, DownloadStep):
        return [
            PutFile(type="put_file", path=guest_path(f.path), url=f.url, sha256=sha(f.url))
            for f in step.parameters.files
        ]
    if isinstance(step, ChromeOpenTabsStep):
        return [GuestQuery(type="guest_query", op="chrome_open_tabs", args={"urls": step.parameters.urls_to_open})]
    if isinstance(step, ChromeCloseTabsStep):
        return [GuestQuery(type="guest_query", op="chrome_close_tabs", args={"urls": step.parameters.urls_to_close})]
    if isinstance(step, BrowseHistoryStep):
        history = f"{CHROME_PROFILE}/Default/History"
        items = [i.model_dump(mode="json") for i in step.parameters.history]
        return [
            PutFile(type="put_file", path=history, url=HISTORY_TEMPLATE_URL, sha256=sha(HISTORY_TEMPLATE_URL)),
            GuestQuery(type="guest_query", op="add_history", args={"path": history, "items": items}),
        ]
    if isinstance(step, WallpaperStep):
        uri = "file://" + guest_path(step.parameters.path)
        cmd = shlex.join(["gsettings", "set", "org.gnome.desktop.background", "picture-uri", uri])
        return [Run(type="run", command=cmd, ignore_exit=True)]
    assert isinstance(step, WindowStep)
    return [_window_step(step)]


def _getter_spec(getter: AnyGetter, sha: Resolve) -> dict[str, Any]:
    """The getter as the runner's getters read it: paths resolved as OSWorld's server would, cloud files
    checked against the store now (refused naming the URL, rather than at evaluation)."""
    spec = getter.model_dump(mode="json", by_alias=True)
    for flag in ("time_suffix", "needDeleteId", "split_list", "shell"):
        if flag in spec:
            spec[flag] = truthy(spec[flag])
    if isinstance(getter, VmFile | CloudFile):
        # Several files exactly when ``path`` is a list (OSWorld's ``multi`` flag with a single path would make it
        # fetch each character of the path; a list without the flag would be one file named by a list).
        spec["multi"] = isinstance(getter.path, list)
        paths = _as_list(getter.path)
        if isinstance(getter, CloudFile):
            for url in paths:
                sha(url)
        else:
            spec["path"] = [guest_path(p) for p in paths] if spec["multi"] else guest_path(paths[0])
    for key in ("ppt_file_path",):
        if key in spec:
            spec[key] = guest_path(spec[key])
    if getter.type in ("list_directory", "vscode_config", "content_from_vm_file"):
        spec["path"] = guest_path(spec["path"])
    return spec


def _criterion(i: int, func: str, result: Any, expected: Any, options: Options, sha: Resolve) -> Criterion:
    metric_registry.require(func)
    check = OsworldCheck(
        type="osworld",
        func=func,
        result=_getter_spec(result, sha),
        expected=_getter_spec(expected, sha) if expected is not None else None,
        options=options,
    )
    return Criterion(name=f"{func} #{i + 1}", check=check)


def _options(ev: Evaluator, n: int) -> list[Options]:
    """One options object per func (OSWorld gives a single func its object as it is; null in a list is none)."""
    if isinstance(ev.options, dict):
        return [ev.options] * n
    return ([o or {} for o in ev.options] + [{}] * n)[:n]


def _criteria(ev: Evaluator, sha: Resolve) -> list[Criterion]:
    if ev.func == INFEASIBLE:
        return [Criterion(name="infeasible", check=DeclaredInfeasible(type="declared_infeasible"))]
    funcs = _as_list(ev.func)
    results = _as_list(ev.result)
    expecteds = _as_list(ev.expected) if ev.expected is not None else [None] * len(funcs)
    rows = zip(funcs, results, expecteds, _options(ev, len(funcs)), strict=True)
    return [_criterion(i, f, r, e, o, sha) for i, (f, r, e, o) in enumerate(rows)]


def _task_id(raw: str) -> str:
    task_id = re.sub(r"[^a-z0-9._-]", "-", raw.lower())[:80] or "osworld-task"
    return task_id if task_id[0].isalnum() else f"t{task_id[:79]}"


def from_osworld(data: dict[str, Any] | OsworldTask, store: AssetStore | None = None) -> Task:
    """An osfleet task from an OSWorld one; downloads and cloud files are resolved in ``store`` (this host's
    by default), so a task that needs a file the host lacks is refused now, naming its URL."""
    if isinstance(data, dict):
        problems = _feature_problems(data, METRICS)
        if problems:
            raise UnsupportedTaskError(f"unsupported OSWorld {problems[0]}")
        try:
            data = OsworldTask.model_validate(data)
        except ValidationError as exc:
            raise TaskError(f"bad OSWorld task: {_problem(exc)}") from None
    real = store or AssetStore.from_settings()
    return _convert(data, lambda url: real.resolve(url).sha256)


def _convert(data: OsworldTask, sha: Resolve) -> Task:
    ev = data.evaluator
    return Task(
        id=_task_id(data.id),
        instruction=data.instruction,
        setup=[s for step in data.config for s in _steps(step, sha)],
        postconfig=[s for step in ev.postconfig for s in _steps(step, sha)],
        criteria=_criteria(ev, sha),
        source="osworld",
        osworld=OsworldScoring(conj=ev.conj),
        needs_proxy=truthy(data.proxy),
    )


def _problem(exc: ValidationError) -> str:
    """``field.path: message`` for pydantic's first problem, without the union branches in the path."""
    first = exc.errors()[0]
    parts = [str(p) for p in first["loc"] if not re.match(r"^[a-z-]+\[", str(p))]
    return f"{'.'.join(parts) or 'task'}: {first['msg']}"


def _type_of(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else None


def _why(kind: Any, what: str, known: Iterable[str]) -> str:
    if isinstance(kind, str) and kind in OFFLINE:
        return f"{what} {kind!r}: {OFFLINE[kind]}"
    if not isinstance(kind, str) or not kind:
        return f"{what} missing"
    return f"{what} {kind!r} (OSWorld has none by that name)"


def _command_texts(item: Any) -> list[str]:
    """The strings of a step's ``parameters.command`` or a getter's ``command`` (a string or a list)."""
    if not isinstance(item, dict):
        return []
    params = item.get("parameters")
    command = params.get("command") if isinstance(params, dict) else item.get("command")
    return [c for c in _as_list(command) if isinstance(c, str)]


def _placeholder_problems(where: str, item: Any) -> list[str]:
    known = ", ".join(PLACEHOLDERS)
    return [
        f"placeholder {token} in a {where} command (OSWorld fills only {known}; it would run as literal text)"
        for text in _command_texts(item)
        for token in unknown_placeholders(text)
    ]


def _feature_problems(data: dict[str, Any], metrics: Iterable[str]) -> list[str]:
    """Every step type, getter type, metric, conj and placeholder of ``data`` that osfleet does not run, named."""
    known = set(metrics)
    problems: list[str] = []
    ev = data.get("evaluator")
    evd = ev if isinstance(ev, dict) else {}
    for where, steps in (("set-up", data.get("config")), ("postconfig", evd.get("postconfig"))):
        for step in steps if isinstance(steps, list) else []:
            kind = _type_of(step)
            if kind not in SETUP_TYPES:
                problems.append(_why(kind, f"{where} type", SETUP_TYPES))
            problems += _placeholder_problems(where, step)
    funcs = _as_list(evd.get("func"))
    for f in funcs:
        if f not in known:
            problems.append(f"metric {f!r} (osfleet has no such metric yet)")
    if evd.get("conj", "and") not in ("and", "or"):
        problems.append(f"conj {evd.get('conj')!r} (OSWorld has and, or)")
    for key in ("result", "expected"):
        for getter in _as_list(evd.get(key)):
            if getter is None or funcs == [INFEASIBLE]:
                continue
            kind = _type_of(getter)
            if kind not in GETTER_TYPES:
                problems.append(_why(kind, f"{key} type", GETTER_TYPES))
            problems += _placeholder_problems(f"{key} getter", getter)
    return list(dict.fromkeys(problems))


def unsupported_features(data: Any, metrics: Iterable[str] = METRICS) -> list[str]:
    """Every reason ``data`` cannot run here apart from missing assets (empty: it can), for reports over many
    task files. ``metrics``: the metric names to count as supported (this host's registry by default)."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    problems = _feature_problems(data, metrics)
    if problems:
        return problems
    try:
        parsed = OsworldTask.model_validate(_registered_funcs(data))
    except ValidationError as exc:
        return [f"bad OSWorld task: {_problem(exc)}"]
    try:
        _convert(parsed, lambda url: "0" * 64)  # assets aside: those are check_supported's second list
    except TaskError as exc:
        return [str(exc)]
    return []


def _registered_funcs(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each metric name the registry lacks (but the caller counts as supported) replaced by a
    registered one, so the rest of the task is checked as it would be once that metric exists."""
    ev = data.get("evaluator")
    if not isinstance(ev, dict):
        return data
    stand_in = next(iter(metric_registry.METRICS))
    func = ev.get("func")
    swap = [f if f in METRICS else stand_in for f in func] if isinstance(func, list) else func
    if func != INFEASIBLE and not isinstance(func, list) and func not in METRICS:
        swap = stand_in
    return {**data, "evaluator": {**ev, "func": swap}}


def asset_urls(data: Any) -> list[str]:
    """Every URL a task file needs from the asset store: downloads (set-up and postconfig), ``cloud_file``
    getters (several for multi) and the history template of ``update_browse_history``."""
    if not isinstance(data, dict):
        return []
    ev = data.get("evaluator") if isinstance(data.get("evaluator"), dict) else {}
    assert isinstance(ev, dict)
    urls: list[str] = []
    for steps in (data.get("config"), ev.get("postconfig")):
        for step in steps if isinstance(steps, list) else []:
            params = step.get("parameters") if isinstance(step, dict) else None
            if not isinstance(params, dict):
                continue
            if step.get("type") == "download":
                files = params.get("files")
                for f in files if isinstance(files, list) else []:
                    if isinstance(f, dict) and isinstance(f.get("url"), str):
                        urls.append(f["url"])
            elif step.get("type") == "update_browse_history":
                urls.append(HISTORY_TEMPLATE_URL)
    for key in ("result", "expected"):
        for getter in _as_list(ev.get(key)):
            if _type_of(getter) == "cloud_file":
                urls += [u for u in _as_list(getter.get("path")) if isinstance(u, str)]
    return list(dict.fromkeys(u for u in urls if u))
