"""Running tasks on a replica: set-up after a reset, verifier criteria in the guest, oracle, validation."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from osfleet.errors import OsfleetError
from osfleet.replicas import actions
from osfleet.replicas.manager import ReplicaHost
from osfleet.tasks.model import (
    CommandOutput,
    CriterionResult,
    Evaluation,
    FileContent,
    Launch,
    Run,
    Sleep,
    Task,
    score,
)

CHECK_TIMEOUT_SECONDS = 30.0
SETUP_BUDGET_SECONDS = 60.0  # all set-up steps of one reset together
EVALUATE_BUDGET_SECONDS = 90.0  # all criteria of one evaluation together


class TaskSetupError(OsfleetError):
    """A task's set-up failed on the replica: the episode cannot start (an infrastructure failure)."""


class VerifierError(OsfleetError):
    """A criterion could not be checked (guest unreachable, timeout): never scored as unmet."""


def apply_setup(host: ReplicaHost, rid: str, task: Task) -> None:
    """Run the task's set-up steps; all of them together get ``SETUP_BUDGET_SECONDS`` (sleeps and command
    timeouts are cut to what is left), so a reset request has a bounded length whatever the task says."""
    deadline = time.monotonic() + SETUP_BUDGET_SECONDS
    for i, step in enumerate(task.setup):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TaskSetupError(
                f"task {task.id}: set-up did not finish within {SETUP_BUDGET_SECONDS:.0f} s (at step {i + 1})"
            )
        if isinstance(step, Sleep):
            time.sleep(min(step.seconds, left))
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
            raise TaskSetupError(f"task {task.id}: set-up step {i + 1} failed: {exc}") from None
        if out["exit_code"] != 0:
            detail = (out["stderr"] or out["stdout"]).strip().splitlines()
            raise TaskSetupError(
                f"task {task.id}: set-up step {i + 1} exited {out['exit_code']}: {detail[-1] if detail else ''}"
            )


def reset_to_task(host: ReplicaHost, rid: str, task: Task) -> float:
    """Reset the replica to its initial state, then apply the task's set-up; returns seconds taken."""
    start = time.monotonic()
    host.reset(rid)
    apply_setup(host, rid, task)
    return time.monotonic() - start


def evaluate(host: ReplicaHost, rid: str, task: Task) -> Evaluation:
    """Check every criterion in the guest; together they get ``EVALUATE_BUDGET_SECONDS``."""
    results = []
    deadline = time.monotonic() + EVALUATE_BUDGET_SECONDS
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
            else:
                assert isinstance(check, FileContent)
                met, detail = _check_file(host, rid, check)
        except OsfleetError as exc:
            raise VerifierError(f"task {task.id}: criterion {c.name!r} could not be checked: {exc}") from None
        results.append(CriterionResult(name=c.name, met=met, weight=c.weight, required=c.required, detail=detail))
    return score(results)


def _check_file(host: ReplicaHost, rid: str, check: FileContent) -> tuple[bool, str]:
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


def validate(host: ReplicaHost, rid: str, task: Task) -> Validation:
    """The task is valid if its verifier scores 0 on the initial state, 1 after the oracle, 0 after a reset."""
    start = time.monotonic()
    v = Validation(task=task.id, ok=False)
    try:
        reset_to_task(host, rid, task)
        v.rewards.append(evaluate(host, rid, task).reward)
        run_oracle(host, rid, task)
        after = evaluate(host, rid, task)
        v.rewards.append(after.reward)
        reset_to_task(host, rid, task)
        v.rewards.append(evaluate(host, rid, task).reward)
    except OsfleetError as exc:
        v.problem = str(exc)
    else:
        expected = [0.0, 1.0, 0.0]
        v.ok = v.rewards == expected
        if not v.ok:
            v.problem = f"rewards {v.rewards}, expected {expected}"
            if v.rewards[1] != 1.0:
                unmet = [c.name for c in after.criteria if not c.met]
                v.problem += f"; unmet after the oracle: {', '.join(unmet)}"
    v.seconds = time.monotonic() - start
    return v
