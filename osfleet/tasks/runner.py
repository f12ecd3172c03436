"""Running tasks on a replica: set-up after a reset, verifier criteria in the guest, oracle, validation."""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from osfleet.errors import GuestFileTooLargeError, GuestTimeoutError, OsfleetError
from osfleet.replicas import actions
from osfleet.replicas.manager import ReplicaHost
from osfleet.tasks import evaluators, getters, sandbox
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.guest_files import put_file
from osfleet.tasks.model import (
    CommandOutput,
    CriterionResult,
    Evaluation,
    FileContent,
    Launch,
    OsworldCheck,
    PutFile,
    Run,
    SetupStep,
    Sleep,
    Task,
    score,
)

T = TypeVar("T")
CHECK_TIMEOUT_SECONDS = 30.0
SETUP_BUDGET_SECONDS = 60.0  # all set-up steps of one reset together
EVALUATE_BUDGET_SECONDS = 90.0  # all criteria of one evaluation together
METRIC_MIN_SECONDS = 10.0  # a metric's wall time, however little of the evaluation's budget is left


class TaskSetupError(OsfleetError):
    """A task's set-up failed on the replica: the episode cannot start (an infrastructure failure)."""


class VerifierError(OsfleetError):
    """A criterion could not be checked (guest unreachable, timeout): never scored as unmet."""


def _run_steps(
    host: ReplicaHost,
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
        if isinstance(step, Launch):
            command = f"setsid -f sh -c {shlex.quote(step.command)} >/dev/null 2>&1 </dev/null"
            as_root, timeout = False, 30.0
        else:
            assert isinstance(step, Run)
            command, as_root, timeout = step.command, step.as_root, step.timeout
        timeout = min(timeout, max(left, 0.1))
        try:
            out = host.shell(rid, command, timeout, as_root)
        except OsfleetError as exc:
            raise TaskSetupError(f"{what} step {i + 1} failed: {exc}") from None
        if out["exit_code"] != 0:
            detail = (out["stderr"] or out["stdout"]).strip().splitlines()
            complaint = f"{what} step {i + 1} exited {out['exit_code']}: {detail[-1] if detail else ''}"
            if strict:
                raise TaskSetupError(complaint)
            complaints.append(complaint)
    return complaints


def apply_setup(host: ReplicaHost, rid: str, task: Task) -> None:
    """Run the task's set-up steps; all of them together get ``SETUP_BUDGET_SECONDS`` (sleeps and command
    timeouts are cut to what is left), so a reset request has a bounded length whatever the task says."""
    deadline = (time.monotonic() + SETUP_BUDGET_SECONDS, SETUP_BUDGET_SECONDS)
    _run_steps(host, rid, list(task.setup), deadline, f"task {task.id}: set-up")


def reset_to_task(host: ReplicaHost, rid: str, task: Task) -> float:
    """Reset the replica to its initial state (unless it is still there: a lease starts on a freshly reset
    replica), then apply the task's set-up; returns seconds taken."""
    start = time.monotonic()
    if any(isinstance(c.check, OsworldCheck) for c in task.criteria):
        sandbox.default().start_soon()  # its metric modules load while the replica resets, not at evaluation
    host.reset(rid, unless_pristine=True)
    apply_setup(host, rid, task)
    return time.monotonic() - start


def evaluate(host: ReplicaHost, rid: str, task: Task) -> Evaluation:
    """Run the task's post-config, then check every criterion; together they get ``EVALUATE_BUDGET_SECONDS``.

    Checks of osfleet's own format run in the guest; OSWorld metrics run here, on files and outputs the
    getters fetched from the guest into a private temporary folder."""
    deadline = time.monotonic() + EVALUATE_BUDGET_SECONDS
    if task.postconfig:
        try:
            budget = (deadline, EVALUATE_BUDGET_SECONDS)
            _run_steps(host, rid, list(task.postconfig), budget, f"task {task.id}: post-config", strict=False)
        except TaskSetupError as exc:
            raise VerifierError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="osfleet-eval-") as workdir:
        return _criteria(host, rid, task, deadline, Path(workdir))


def _criteria(host: ReplicaHost, rid: str, task: Task, deadline: float, workdir: Path) -> Evaluation:
    results = []
    for c in task.criteria:
        check = c.check
        left = deadline - time.monotonic()
        if left <= 0:
            raise VerifierError(
                f"task {task.id}: the verifier did not finish within {EVALUATE_BUDGET_SECONDS:.0f} s "
                f"(criterion {c.name!r} not checked)"
            )
        try:
            if isinstance(check, CommandOutput):
                out = host.shell(rid, check.command, min(CHECK_TIMEOUT_SECONDS, left), check.as_root)
                met = (check.exit_code is None or out["exit_code"] == check.exit_code) and (
                    check.match is None or check.match.check(out["stdout"])
                )
                detail = out["stdout"][-200:]
            elif isinstance(check, OsworldCheck):
                met, detail = _check_osworld(host, rid, check, workdir, deadline)
            else:
                assert isinstance(check, FileContent)
                met, detail = _check_file(Deadlined(host, deadline), rid, check)
        except GuestFileTooLargeError as exc:  # the guest's doing: unmet, never scored on a cut-off copy
            met, detail = False, str(exc)
        except OsfleetError as exc:
            raise VerifierError(f"task {task.id}: criterion {c.name!r} could not be checked: {exc}") from None
        results.append(CriterionResult(name=c.name, met=met, weight=c.weight, required=c.required, detail=detail))
    return score(results)


def _check_file(host: Deadlined, rid: str, check: FileContent) -> tuple[bool, str]:
    q = shlex.quote(check.path)
    out = host.shell(rid, f"test -e {q} && echo present || echo absent", CHECK_TIMEOUT_SECONDS, True)
    exists = out["stdout"].strip() == "present"
    if check.absent:
        return not exists, "absent" if not exists else "present"
    if not exists:
        return False, "missing"
    if check.match is None:
        return True, "present"
    text = host.read_file(rid, check.path, actions.MAX_READ_BYTES).decode(errors="replace")
    return check.match.check(text), text[-200:]


def _check_osworld(
    host: ReplicaHost, rid: str, check: OsworldCheck, workdir: Path, deadline: float
) -> tuple[bool, str]:
    """An OSWorld metric in the evaluation sandbox on what the getters fetched; met when it scores 1 (OSWorld's
    metrics here are all-or-nothing). Every guest call of the getters ends by ``deadline``."""
    store = AssetStore.from_settings()
    guest = Deadlined(host, deadline)
    timeout = min(CHECK_TIMEOUT_SECONDS, guest.left())
    result = getters.get(guest, rid, check.result, workdir, store, timeout)
    expected = getters.get(guest, rid, check.expected, workdir, store, timeout) if check.expected else None
    # At least METRIC_MIN_SECONDS: slow guest calls before it must not leave a metric too little time to score.
    wall = max(guest.left(), METRIC_MIN_SECONDS)
    value, detail = evaluators.run_metric(check.func, result, expected, check.options, wall=wall)
    return value >= 1.0, detail[-200:]


class Deadlined:
    """A replica host whose guest calls all end by ``deadline`` (the getters' view of it): whatever a getter
    does, a guest agent that answers slowly or never costs the evaluation its budget, never a hung thread."""

    def __init__(self, host: ReplicaHost, deadline: float) -> None:
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


def run_oracle(host: ReplicaHost, rid: str, task: Task) -> None:
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


def validate(host: ReplicaHost, rid: str, task: Task) -> Validation:
    """The task is valid if its verifier scores 0 on the initial state, 1 after the oracle, 0 after a reset."""
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
        v.rewards.append(timed("evaluate_initial", lambda: evaluate(host, rid, task)).reward)
        timed("oracle", lambda: run_oracle(host, rid, task))
        after = timed("evaluate_oracle", lambda: evaluate(host, rid, task))
        v.rewards.append(after.reward)
        timed("reset_again", lambda: reset_to_task(host, rid, task))
        v.rewards.append(timed("evaluate_reset", lambda: evaluate(host, rid, task)).reward)
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
