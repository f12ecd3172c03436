"""OSGym's endpoints, wire-compatible (``POST /reset``, ``/step``, ``/shutdown``, ``GET /screenshot``).

Each caller (a client's token, the operator's, or an address in ``--osgym-allow``) owns the vm ids it was
given; a vm id is tied to its episode's lease, so a vm whose lease expired answers 409 and never drives a
newer vm on the same replica. ``finish()`` scores the task and releases the vm, even when scoring fails.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Query

from osfleet.api import recording_hooks
from osfleet.api.auth import OsgymCaller
from osfleet.api.contract import Routes
from osfleet.api.models import (
    OsgymReset,
    OsgymResetResponse,
    OsgymScreenshot,
    OsgymShutdown,
    OsgymShutdownResponse,
    OsgymStep,
    OsgymStepResponse,
)
from osfleet.api.operations import (
    OSGYM_RESET,
    OSGYM_SCREENSHOT,
    OSGYM_SHUTDOWN,
    OSGYM_STEP,
    OsgymScreenshotQuery,
)
from osfleet.api.osgym_actions import Parsed as ParsedAction
from osfleet.api.osgym_actions import parse as parse_osgym
from osfleet.api.policy import reads_as_root, refuse_root_task
from osfleet.api.routes.leases import release_episode
from osfleet.api.state import AgentState, LeasedHost, LiveEpisode
from osfleet.errors import OsfleetError, VirtError
from osfleet.replicas.episodes import OsgymClient
from osfleet.replicas.input import InputError
from osfleet.tasks import runner
from osfleet.tasks.model import Task
from osfleet.tasks.osworld_format.convert import from_osworld


def _jpeg(leased: LeasedHost, rid: str) -> str:
    return base64.b64encode(leased.screenshot(rid, "jpeg")).decode()


def _act(s: AgentState, live: LiveEpisode, leased: LeasedHost, req: OsgymStep, parsed: ParsedAction) -> bytes:
    """Apply an OSGym step's actions (a failed one is an infrastructure failure, as OSGym has no per-action
    results) and record it; returns the screen after it (JPEG)."""
    rid, lease_id = live.data.replica_id, live.data.lease_id
    if parsed.actions:
        s.check_not_taken_over(rid, lease_id)
    start = time.monotonic()
    try:
        results = leased.act(rid, parsed.actions) if parsed.actions else []
    except OsfleetError as exc:
        recording_hooks.failure(s, rid, lease_id, exc)
        raise
    took = time.monotonic() - start
    s.metrics.step.observe(took)
    failed = [x for x in results if not x.ok]
    if failed:
        error = VirtError(f"vm {req.vm_id}: {failed[0].type} failed: {failed[0].error}")
        recording_hooks.failure(s, rid, lease_id, error)
        raise error
    shot = leased.screenshot(rid, "jpeg")
    if s.recorder is not None:
        s.recorder.step(
            rid,
            lease_id,
            f"osgym-{len(live.data.steps)}-{time.time_ns()}",
            [a.model_dump(mode="json") for a in parsed.actions],
            [x.model_dump(mode="json") for x in results],
            took,
            parsed.finish,
            metadata={"osgym_action": req.action},
            observation=shot,
            owner=live.data.owner,
        )
    return shot


def _score(
    s: AgentState, live: LiveEpisode, leased: LeasedHost, task: Task, declared_infeasible: bool, as_user: bool
) -> float:
    start = time.monotonic()
    evaluation = runner.evaluate(leased, live.data.replica_id, task, declared_infeasible, as_user=as_user)
    s.metrics.evaluate.observe(time.monotonic() - start)
    if s.recorder is not None:
        s.recorder.evaluated(live.data.replica_id, live.data.lease_id, evaluation.reward, evaluation.success)
    return evaluation.reward


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(OSGYM_RESET)
    def reset(req: OsgymReset, who: OsgymCaller) -> OsgymResetResponse:
        s = state()
        task = from_osworld(req.task_config)
        refuse_root_task(task, True, who, s.config)  # OSGym's task_config is always the caller's own
        rec, lease_ = s.host.lease(who.name, float(req.timeout), owner=who.name)
        live = s.episode(rec.id, lease_.id, who)
        try:
            with live.lock:
                leased = live.on(s.host, who)
                start = time.monotonic()
                runner.reset_to_task(leased, rec.id, task)
                s.metrics.reset.observe(time.monotonic() - start)
                s.set_task(live, task, leased.claim.generation or 0)
                vm_id = s.new_vm(rec.id)
                live.data.osgym = OsgymClient(vm_id=vm_id, owner=who.name)
                s.save(live)
                recording_hooks.begin(s, leased, live, None)
                screenshot = _jpeg(leased, rec.id)
        except BaseException:
            with live.lock:
                release_episode(s, live, who, quiet=True)
            raise
        return OsgymResetResponse(screenshot=screenshot, problem=task.instruction, vm_id=vm_id)

    @routes(OSGYM_STEP)
    def step(req: OsgymStep, who: OsgymCaller) -> OsgymStepResponse:
        s = state()
        rid, live = s.vm(req.vm_id, who)
        parsed = parse_osgym(req.action)
        # a finishing step scores: its client's evaluation slot is taken first, so a 429 leaves the vm untouched
        with s.ledger.evaluating(who) if parsed.finish else contextlib.nullcontext(), live.lock:
            leased = live.on(s.host, who)
            release = parsed.finish  # the client is done with this vm, whatever comes of scoring it
            try:
                s.host.check_lease(rid, live.data.lease_id, who.owner)  # 409 once the lease has expired
                task = s.task_of(live, rid)
                shot = _act(s, live, leased, req, parsed)
                as_user = not reads_as_root(task, who, s.config)  # OSGym's tasks are the caller's own
                reward = _score(s, live, leased, task, parsed.declared_infeasible, as_user) if parsed.finish else 0.0
            except InputError:  # the client's mistake, refused before the guest: the vm stays, to be sent again
                release = False
                raise
            finally:
                if release:
                    release_episode(s, live, who, quiet=True)
        return OsgymStepResponse(screenshot=base64.b64encode(shot).decode(), is_finish=parsed.finish, reward=reward)

    @routes(OSGYM_SHUTDOWN)
    def shutdown(req: OsgymShutdown, who: OsgymCaller) -> OsgymShutdownResponse:
        s = state()
        ids = s.vms_of(who) if req.vm_id == "all" else [req.vm_id]
        for vm_id in ids:
            rid, live = s.vm(vm_id, who)
            with live.lock:
                release_episode(s, live, who, quiet=True)
        return OsgymShutdownResponse(vm_id=req.vm_id)

    @routes(OSGYM_SCREENSHOT)
    def screenshot(query: Annotated[OsgymScreenshotQuery, Query()], who: OsgymCaller) -> OsgymScreenshot:
        s = state()
        rid, live = s.vm(query.vm_id, who)
        return OsgymScreenshot(screenshot=_jpeg(live.on(s.host, who), rid), vm_id=query.vm_id)
