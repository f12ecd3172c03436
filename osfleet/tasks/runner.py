"""Running tasks on a replica: set-up after a reset, verifier criteria in the guest, oracle, validation.

Tasks converted from OSWorld's format are scored as OSWorld scores them (``Task.osworld``): each metric gives a
value in [0, 1]; ``and`` stops at the first 0 (score 0) and otherwise averages, ``or`` stops at the first 1
and otherwise takes the maximum; an agent whose last action declared the task infeasible scores 1 on an
``infeasible`` task and 0 on any other, without its metrics being run.

Every metric's value is judged in one place (``osfleet.tasks.rewards``, applied by the evaluation sandbox to
every metric it runs): a finite number in [0, 1] or a 0 with the reason. So is every reward this module makes.

Who reads the guest: a client's task (``as_user``, what the API decides with ``osfleet.api.policy``) reads it as
the desktop user in every check and getter, an operator's task may read as root (its ``file_content`` checks, and
``command_output`` checks marked ``as_root``). The getters read files as the desktop user for everyone
(``osfleet.tasks.guest_reads``), but ``cache_file``, which reads osfleet's own root-owned task cache.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from osfleet.errors import GuestFileTooLargeError, GuestTimeoutError, OsfleetError
from osfleet.protocol.actions import MAX_READ_BYTES, Action, ActionResult
from osfleet.replicas import actions
from osfleet.replicas.lifecycle import Timed
from osfleet.tasks import guest_reads
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.jail import sandbox
from osfleet.tasks.model import (
    CommandOutput,
    Criterion,
    CriterionResult,
    DeclaredInfeasible,
    Evaluation,
    FileContent,
    GuestQuery,
    Launch,
    OsworldCheck,
    PutFile,
    Run,
    SetupStep,
    Sleep,
    Task,
    score,
)
from osfleet.tasks.osworld_format import getters, guest_query, metrics
from osfleet.tasks.osworld_format.guest_paths import fill_screen
from osfleet.tasks.osworld_format.guest_writes import CACHE_DIR, put_file, put_text

T = TypeVar("T")


class TaskHost(Protocol):
    """What running a task needs of the replica host: ``osfleet.replicas.manager.ReplicaHost``, or the API's
    view of it for one lease (every call then carries the lease, checked under the replica's lock)."""

    def reset(self, replica_id: str, mode: Any = None, unless_pristine: bool = False) -> Timed: ...
    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]: ...
    def read_file(
        self, replica_id: str, path: str, limit: int, timeout: float = actions.READ_FILE_SECONDS
    ) -> bytes: ...
    def act(self, replica_id: str, actions: list[Action]) -> list[ActionResult]: ...


CHECK_TIMEOUT_SECONDS = 30.0
AS_USER_ONLY = "a client's task checks the guest as the desktop user: this check runs as root (as_root), not run"
SETUP_BUDGET_SECONDS = 120.0  # all set-up steps of one reset together (Chrome opening a tab: 43-52 s under TCG)
EVALUATE_BUDGET_SECONDS = 90.0  # all criteria of one evaluation together
METRIC_MIN_SECONDS = 10.0  # a metric's wall time, however little of the evaluation's budget is left


class TaskSetupError(OsfleetError):
    """A task's set-up failed on the replica: the episode cannot start (an infrastructure failure)."""


class VerifierError(OsfleetError):
    """A criterion could not be checked (guest unreachable, timeout): never scored as unmet."""


def _run_steps(
    host: TaskHost,
    rid: str,
    steps: list[SetupStep],
    deadline: tuple[float, float],
    what: str,
    strict: bool = True,
) -> list[str]:
    """Run ``steps`` before ``deadline`` (sleeps and command timeouts are cut to what is left).

    ``strict``: a step that exits non-zero raises ``TaskSetupError``; otherwise its complaint is returned
    and the next step runs (OSWorld's post-config: saving a document the agent already closed is no
    infrastructure failure). A guest that cannot be reached raises either way.
    """
    complaints = []
    end, budget = deadline
    screen: tuple[int, int] | None = None
    for i, step in enumerate(steps):
        left = end - time.monotonic()
        if left <= 0:
            raise TaskSetupError(f"{what} did not finish within {budget:.0f} s (at step {i + 1})")
        if isinstance(step, Sleep):
            time.sleep(min(step.seconds, left))
            continue
        if isinstance(step, PutFile):
            try:
                put_file(host, rid, step.path, AssetStore.from_settings().path(step.url), left)
            except OsfleetError as exc:
                raise TaskSetupError(f"{what} step {i + 1} (download {step.url}) failed: {exc}") from None
            continue
        if isinstance(step, GuestQuery):
            try:
                guest_query.ask(host, rid, step.op, step.args, left)
            except guest_query.GuestQueryError as exc:
                complaint = f"{what} step {i + 1} ({step.op}) failed: {exc}"
                if strict:
                    raise TaskSetupError(complaint) from None
                complaints.append(complaint)
            except OsfleetError as exc:
                raise TaskSetupError(f"{what} step {i + 1} ({step.op}) failed: {exc}") from None
            continue
        if isinstance(step, Run | Launch) and step.fill_screen:
            if screen is None:
                screen = _screen(host, rid, min(CHECK_TIMEOUT_SECONDS, left), f"{what} step {i + 1}")
            step = step.model_copy(update={"command": fill_screen(step.command, *screen), "fill_screen": False})
        if isinstance(step, Launch):
            command = f"setsid -f sh -c {shlex.quote(step.command)} >/dev/null 2>&1 </dev/null"
            as_root, timeout = False, 30.0
        else:
            assert isinstance(step, Run)
            command, as_root, timeout = step.command, step.as_root, step.timeout
        timeout = min(timeout, max(left, 0.1))
        try:
            out = host.shell(rid, command, timeout, as_root)
            if isinstance(step, Run):
                _keep_output(host, rid, step, out, max(end - time.monotonic(), 1.0))
        except OsfleetError as exc:
            raise TaskSetupError(f"{what} step {i + 1} failed: {exc}") from None
        if out["exit_code"] != 0:
            detail = (out["stderr"] or out["stdout"]).strip().splitlines()
            complaint = f"{what} step {i + 1} exited {out['exit_code']}: {detail[-1] if detail else ''}"
            if strict and not (isinstance(step, Run) and step.ignore_exit):
                raise TaskSetupError(complaint)
            complaints.append(complaint)
    return complaints


def _screen(host: TaskHost, rid: str, timeout: float, what: str) -> tuple[int, int]:
    """The replica's screen for OSWorld's screen placeholders, asked of the running desktop (a set-up step that
    needs it cannot run without it)."""
    try:
        size = getters.guest_screen(host, rid, timeout)
    except OsfleetError as exc:
        raise TaskSetupError(f"{what}: cannot read the screen size for its placeholders: {exc}") from None
    if size is None:
        raise TaskSetupError(f"{what}: the desktop did not report its screen size (xdotool getdisplaygeometry)")
    return size


def _keep_output(host: TaskHost, rid: str, step: Run, out: dict[str, Any], timeout: float) -> None:
    """OSWorld's ``stdout``/``stderr`` of an executed command: kept as files of the task's cache in the guest."""
    for name, stream in ((step.stdout_to, "stdout"), (step.stderr_to, "stderr")):
        if name:
            if name.startswith("/") or ".." in name.split("/"):  # the cache is root's: no way out of it
                raise TaskSetupError(f"an execute step's {stream} file {name!r} leads out of the task cache")
            put_text(host, rid, f"{CACHE_DIR}/{name}", out[stream], timeout)


PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def proxy_steps(task: Task, proxy: str | None) -> list[SetupStep]:
    """``task``'s set-up behind ``proxy`` when it needs one (OSWorld's ``"proxy": true``) and the host has one
    (``--replica-network proxy=URL``), as OSWorld's ``_proxy_setup`` does it: the proxy variables exported in the
    desktop user's ~/.bashrc (for the shells the agent opens) and ``--proxy-server`` added to each launch of
    google-chrome. (OSWorld's own runs a tinyproxy in the VM that forwards to its proxy pool; a replica reaches
    the host's proxy directly, the only address its firewall lets through.) Otherwise the set-up as it is."""
    if not task.needs_proxy or not proxy:
        return list(task.setup)
    exports = "".join(f"export {name}={shlex.quote(proxy)}\n" for name in PROXY_VARIABLES)
    bashrc = Run(type="run", command=f"printf %s {shlex.quote(exports)} >> ~/.bashrc")
    return [bashrc, *_behind(list(task.setup), proxy)]


def _behind(steps: list[SetupStep], proxy: str | None) -> list[SetupStep]:
    """``steps`` with ``--proxy-server`` on each launch of google-chrome (OSWorld's post-config does this for every
    task when its environment has a proxy, its set-up for the tasks that need one)."""
    if not proxy:
        return steps
    flag = f" --proxy-server={shlex.quote(proxy)}"
    return [
        s.model_copy(update={"command": s.command + flag}) if isinstance(s, Launch) and s.chrome else s for s in steps
    ]


def apply_setup(host: TaskHost, rid: str, task: Task) -> None:
    """Run the task's set-up steps; all of them together get ``SETUP_BUDGET_SECONDS`` (sleeps and command
    timeouts are cut to what is left), so a reset request has a bounded length whatever the task says."""
    deadline = (time.monotonic() + SETUP_BUDGET_SECONDS, SETUP_BUDGET_SECONDS)
    steps = proxy_steps(task, getattr(host, "replica_proxy", None))
    _run_steps(host, rid, steps, deadline, f"task {task.id}: set-up")


def reset_to_task(host: TaskHost, rid: str, task: Task) -> float:
    """Reset the replica to its initial state (unless it is still there: a lease starts on a freshly reset
    replica), then apply the task's set-up; returns seconds taken."""
    start = time.monotonic()
    if any(isinstance(c.check, OsworldCheck) for c in task.criteria):
        sandbox.default().start_soon()  # its metric modules load while the replica resets, not at evaluation
    host.reset(rid, unless_pristine=True)
    apply_setup(host, rid, task)
    return time.monotonic() - start


def evaluate(
    host: TaskHost, rid: str, task: Task, declared_infeasible: bool = False, *, as_user: bool = True
) -> Evaluation:
    """Run the task's post-config, then check every criterion; together they get ``EVALUATE_BUDGET_SECONDS``.

    Checks of osfleet's own format run in the guest; OSWorld metrics run here, on files and outputs the
    getters fetched from the guest into a private temporary folder. ``declared_infeasible``: the agent's last
    action said the task cannot be done (OSWorld's ``FAIL``), which decides an OSWorld task's score.
    ``as_user``: every check reads the guest as the desktop user (a client's task); False only for an operator's
    task, whose ``file_content`` checks read as root and whose ``as_root`` commands run as root."""
    deadline = time.monotonic() + EVALUATE_BUDGET_SECONDS
    if task.postconfig:
        try:
            budget = (deadline, EVALUATE_BUDGET_SECONDS)
            steps = _behind(list(task.postconfig), getattr(host, "replica_proxy", None))
            _run_steps(host, rid, steps, budget, f"task {task.id}: post-config", strict=False)
        except TaskSetupError as exc:
            raise VerifierError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="osfleet-eval-") as workdir:
        if task.osworld is not None:
            return _osworld(host, rid, task, deadline, Path(workdir), declared_infeasible)
        return _criteria(host, rid, task, deadline, Path(workdir), as_user)


def _left(task: Task, c: Criterion, deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise VerifierError(
            f"task {task.id}: the verifier did not finish within {EVALUATE_BUDGET_SECONDS:.0f} s "
            f"(criterion {c.name!r} not checked)"
        )
    return left


def _osworld(
    host: TaskHost, rid: str, task: Task, deadline: float, workdir: Path, declared_infeasible: bool
) -> Evaluation:
    """OSWorld's score (see the module docstring), with every metric that ran listed."""
    assert task.osworld is not None
    conj = task.osworld.conj
    results: list[CriterionResult] = []
    infeasible = [c for c in task.criteria if isinstance(c.check, DeclaredInfeasible)]
    if infeasible or declared_infeasible:
        met = bool(infeasible) and declared_infeasible
        said = "declared" if declared_infeasible else "did not declare"
        name = infeasible[0].name if infeasible else "declared infeasible"
        detail = f"the agent {said} the task infeasible"
        results.append(CriterionResult(name=name, met=met, weight=1.0, required=True, detail=detail, score=float(met)))
        return Evaluation(reward=float(met), success=met, criteria=results)
    values: list[float] = []
    for c in task.criteria:
        check = c.check
        assert isinstance(check, OsworldCheck)
        _left(task, c, deadline)
        try:
            value, detail = _score_osworld(host, rid, check, workdir, deadline)
        except OsfleetError as exc:
            raise VerifierError(f"task {task.id}: criterion {c.name!r} could not be checked: {exc}") from None
        met = value >= 1.0
        results.append(CriterionResult(name=c.name, met=met, weight=c.weight, required=c.required, detail=detail))
        results[-1].score = value
        values.append(value)
        if (conj == "and" and value == 0.0) or (conj == "or" and value == 1.0):
            break
    if conj == "and":
        reward = 0.0 if 0.0 in values else sum(values) / len(values)
    else:
        reward = 1.0 if 1.0 in values else max(values)
    return Evaluation(reward=reward, success=reward >= 1.0, criteria=results)


def _criteria(host: TaskHost, rid: str, task: Task, deadline: float, workdir: Path, as_user: bool) -> Evaluation:
    results = []
    for c in task.criteria:
        check = c.check
        left = _left(task, c, deadline)
        try:
            if isinstance(check, CommandOutput) and check.as_root and as_user:
                met, detail = False, AS_USER_ONLY  # refused at reset already (osfleet.api.policy): never run
            elif isinstance(check, CommandOutput):
                out = host.shell(rid, check.command, min(CHECK_TIMEOUT_SECONDS, left), check.as_root)
                met = (check.exit_code is None or out["exit_code"] == check.exit_code) and (
                    check.match is None or check.match.check(out["stdout"])
                )
                detail = out["stdout"][-200:]
            elif isinstance(check, OsworldCheck):
                value, detail = _score_osworld(host, rid, check, workdir, deadline)
                met = value >= 1.0
            else:
                assert isinstance(check, FileContent)
                met, detail = _check_file(Deadlined(host, deadline), rid, check, as_user)
        except GuestFileTooLargeError as exc:  # the guest's doing: unmet, never scored on a cut-off copy
            met, detail = False, str(exc)
        except OsfleetError as exc:
            raise VerifierError(f"task {task.id}: criterion {c.name!r} could not be checked: {exc}") from None
        results.append(CriterionResult(name=c.name, met=met, weight=c.weight, required=c.required, detail=detail))
    return score(results)


def _check_file(host: Deadlined, rid: str, check: FileContent, as_user: bool) -> tuple[bool, str]:
    """A ``file_content`` check, read as the desktop user (``as_user``: a file it may not read is unmet, saying so
    and nothing of the file) or as root (an operator's task)."""
    q = shlex.quote(check.path)
    out = host.shell(rid, f"test -e {q} && echo present || echo absent", CHECK_TIMEOUT_SECONDS, not as_user)
    exists = out["stdout"].strip() == "present"
    if check.absent:
        return not exists, "absent" if not exists else "present"
    if not exists:
        return False, "missing"
    if check.match is None:
        return True, "present"
    if as_user:
        try:
            data = guest_reads.read_as_user(host, rid, check.path, MAX_READ_BYTES, CHECK_TIMEOUT_SECONDS)
        except guest_reads.GuestReadRefused as exc:
            return False, str(exc)
        if data is None:
            return False, "missing"
    else:
        data = host.read_file(rid, check.path, MAX_READ_BYTES)
    text = data.decode(errors="replace")
    met = check.match.check(text)
    return met, text[-200:] if met else f"its content: {text[-200:]!r}"  # quoted: an empty file says so


def _score_osworld(host: TaskHost, rid: str, check: OsworldCheck, workdir: Path, deadline: float) -> tuple[float, str]:
    """An OSWorld metric in the evaluation sandbox, on what its getters fetched: its value and why. A value the
    guest cannot give (or a file over the limit) scores 0 with the reason; a guest that cannot be reached
    raises. Every guest call of the getters ends by ``deadline``."""
    store = AssetStore.from_settings()
    guest = Deadlined(host, deadline)
    timeout = min(CHECK_TIMEOUT_SECONDS, guest.left())
    try:
        result = getters.get(guest, rid, check.result, workdir, store, timeout)
        expected = None
        if check.expected:
            expected = getters.get(guest, rid, check.expected, workdir, store, min(CHECK_TIMEOUT_SECONDS, guest.left()))
    except (getters.GetterValueError, GuestFileTooLargeError) as exc:
        return 0.0, f"{check.func}: {exc}"[-200:]
    # At least METRIC_MIN_SECONDS: slow guest calls before it must not leave a metric too little time to score.
    wall = max(deadline - time.monotonic(), METRIC_MIN_SECONDS)
    value, detail = metrics.run_metric(check.func, result, expected, check.options, wall=wall)
    return value, detail[-200:]


class Deadlined:
    """A replica host whose guest calls all end by ``deadline`` (the getters' view of it): whatever a getter
    does, a guest agent that answers slowly or never costs the evaluation its budget, never a hung thread."""

    def __init__(self, host: TaskHost, deadline: float) -> None:
        self._host = host
        self._deadline = deadline

    def left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise GuestTimeoutError(f"the evaluation's {EVALUATE_BUDGET_SECONDS:.0f} s budget ran out")
        return left

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        return self._host.shell(replica_id, command, min(timeout, self.left()), as_root)

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = actions.READ_FILE_SECONDS) -> bytes:
        return self._host.read_file(replica_id, path, limit, timeout=min(timeout, self.left()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


def run_oracle(host: TaskHost, rid: str, task: Task) -> None:
    for result in host.act(rid, list(task.oracle)):
        if not result.ok:
            raise OsfleetError(f"task {task.id}: oracle action {result.type} failed: {result.error}")


@dataclass
class Validation:
    task: str
    ok: bool
    rewards: list[float] = field(default_factory=list)
    seconds: float = 0.0
    problem: str = ""
    # Seconds per phase, in order: reset (with set-up), evaluate, oracle, evaluate, reset, evaluate.
    phases: dict[str, float] = field(default_factory=dict)


def validate(host: TaskHost, rid: str, task: Task) -> Validation:
    """The task is valid if its verifier scores 0 on the initial state, 1 after the oracle, 0 after a reset. (The
    operator's tool: its checks read the guest as an operator's task does.)"""
    start = time.monotonic()
    v = Validation(task=task.id, ok=False)

    def timed(phase: str, fn: Callable[[], T]) -> T:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            v.phases[phase] = round(time.monotonic() - t0, 2)

    try:
        timed("reset", lambda: reset_to_task(host, rid, task))
        v.rewards.append(timed("evaluate_initial", lambda: evaluate(host, rid, task, as_user=False)).reward)
        timed("oracle", lambda: run_oracle(host, rid, task))
        after = timed("evaluate_oracle", lambda: evaluate(host, rid, task, as_user=False))
        v.rewards.append(after.reward)
        timed("reset_again", lambda: reset_to_task(host, rid, task))
        v.rewards.append(timed("evaluate_reset", lambda: evaluate(host, rid, task, as_user=False)).reward)
    except OsfleetError as exc:
        v.problem = str(exc)
    else:
        expected = [0.0, 1.0, 0.0]
        v.ok = v.rewards == expected
        if not v.ok:
            v.problem = f"rewards {v.rewards}, expected {expected}"
            if v.rewards[1] != 1.0:
                unmet = [f"{c.name} ({c.detail[-120:]})" if c.detail else c.name for c in after.criteria if not c.met]
                v.problem += f"; unmet after the oracle: {', '.join(unmet)}"
    v.seconds = time.monotonic() - start
    return v
