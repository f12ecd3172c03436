"""What a lease holder does with its replica: reset (to a task), observe, step, fork, evaluate.

Each request finds its episode (404 for another client's replica, 409 for a lease that does not hold it) and
goes through the episode's ``LeasedHost``: every host call checks the lease again under the replica's lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Query
from fastapi.responses import Response

from osfleet.api import recording_hooks, steps
from osfleet.api.auth import Caller
from osfleet.api.contract import Routes
from osfleet.api.errors import Conflict, NotFound
from osfleet.api.models import (
    ForkChild,
    ForkRequest,
    ForkResponse,
    LeaseBody,
    Observation,
    ObservationQuery,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from osfleet.api.observe import observe
from osfleet.api.operations import EVALUATE, FORK, OBSERVATION, RESET, STEP
from osfleet.api.policy import reads_as_root, refuse_root_task
from osfleet.api.state import AgentState
from osfleet.measure.timing import Stages, collecting, stage
from osfleet.tasks import runner
from osfleet.tasks.model import Evaluation, Task, TaskError, find_task
from osfleet.tasks.osworld_format.convert import OsworldTask, from_osworld


def _timed(response: Response, stages: Stages) -> None:
    """Where the request's time went, for clients and ``osfleet bench step`` (``Server-Timing``, ms)."""
    response.headers["Server-Timing"] = stages.header()


def task_from(req: ResetRequest) -> Task | None:
    if req.task_id and req.task:
        raise Conflict("give task_id or task, not both")
    if req.task_id:
        try:
            return find_task(req.task_id)
        except TaskError as exc:
            raise NotFound(str(exc)) from None
    if isinstance(req.task, OsworldTask):
        return from_osworld(req.task)
    return req.task


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(RESET)
    def reset(rid: str, req: ResetRequest, response: Response, who: Caller) -> ResetResponse:
        s = state()
        task = task_from(req)
        refuse_root_task(task, req.task is not None, who, s.config)
        live = s.episode(rid, req.lease_id, who)
        with collecting() as stages, live.lock:
            leased = live.on(s.host, who)
            start = time.monotonic()
            try:
                if task is None:
                    leased.reset(rid)
                else:
                    runner.reset_to_task(leased, rid, task)
            except BaseException:  # the replica moved on even if the task's set-up failed: so does the episode
                if leased.claim.generation != live.data.generation:
                    s.set_task(live, None, leased.claim.generation or 0)
                raise
            took = time.monotonic() - start
            s.metrics.reset.observe(took)
            s.set_task(live, task, leased.claim.generation or 0)
            seen = (
                observe(leased, rid, req.observation_format, req.observation_quality, req.observation_include)
                if req.observe
                else None
            )
            with stage("record"):
                recording_hooks.begin(s, leased, live, seen)
        _timed(response, stages)
        return ResetResponse(
            replica_id=rid,
            generation=live.data.generation or 0,
            task_id=task.id if task else None,
            instruction=task.instruction if task else None,
            seconds=took,
            observation=seen,
        )

    @routes(OBSERVATION)
    def observation(
        rid: str, query: Annotated[ObservationQuery, Query()], response: Response, who: Caller
    ) -> Observation:
        s = state()
        live = s.episode(rid, query.lease_id, who)
        with collecting() as stages:
            seen = observe(live.on(s.host, who), rid, query.format, query.quality, query.parts)
        _timed(response, stages)
        return seen

    @routes(STEP)
    def step(rid: str, req: StepRequest, response: Response, who: Caller) -> StepResponse:
        with collecting() as stages:
            answer = steps.step(state(), rid, req, who)
        _timed(response, stages)
        return answer

    @routes(FORK)
    def fork(rid: str, req: ForkRequest, who: Caller) -> ForkResponse:
        s = state()
        live = s.episode(rid, req.lease_id, who)
        saved = s.host.shape.memory_mib * 2**20  # the fork's RAM at most, as the host-wide fork budget counts it
        # within the client's share of the host's fork budget, and the host's disk and memory keep room
        with s.ledger.keeping(s.host, who, saved), live.lock:  # no step of the parent is half-applied in the fork
            s.check_not_taken_over(rid, req.lease_id)
            claim = live.on(s.host, who).claim
            forked = s.host.fork(rid, req.children, req.lease_id, s.config.lease_seconds, claim=claim)
            kids = s.adopt_fork_children(live, forked.fork_id, [c.record for c in forked.children])
            children = []
            for child, child_live in zip(forked.children, kids, strict=True):
                assert child.lease is not None  # a lease holder's fork leases every child
                recording_hooks.begin(s, child_live.on(s.host, who), child_live, None)
                children.append(
                    ForkChild(
                        replica_id=child.record.id,
                        lease_id=child.lease.id,
                        expires_at=child.lease.expires_at,
                        seconds=child.seconds,
                    )
                )
        return ForkResponse(
            parent_id=rid,
            fork_id=forked.fork_id,
            memory_mode="template" if forked.memory_mode == "template" else "stream",
            save_seconds=forked.save_seconds,
            total_seconds=forked.total_seconds,
            children=children,
        )

    @routes(EVALUATE)
    def evaluate(rid: str, req: LeaseBody, who: Caller) -> Evaluation:
        s = state()
        live = s.episode(rid, req.lease_id, who)
        with s.ledger.evaluating(who), live.lock:  # one of the client's evaluation slots (429 when all are held)
            task = s.task_of(live, rid)
            start = time.monotonic()
            as_user = not reads_as_root(task, who, s.config)  # a client's own task reads as the desktop user
            result = runner.evaluate(live.on(s.host, who), rid, task, live.data.declared_infeasible(), as_user=as_user)
            s.metrics.evaluate.observe(time.monotonic() - start)
            if s.recorder is not None:
                s.recorder.evaluated(rid, req.lease_id, result.reward, result.success)
            return result
