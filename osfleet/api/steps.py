"""The step: a batch of actions applied once per ``action_id``, however often it is sent.

In order, under the episode's lock: a retried ``action_id`` gets its stored results back (``replayed``);
otherwise the step is refused if a person drives the replica or if it was under way when the agent stopped
(its outcome is unknown); it is logged *pending*, applied through the episode's lease (checked again under the
replica's lock), logged *applied* (its results bounded, see ``osfleet.replicas.episodes``), written to the
audit log, and recorded. Each part is one function below.
"""

from __future__ import annotations

import time

from osfleet.api import recording_hooks
from osfleet.api.auth import Principal
from osfleet.api.models import Observation, StepRequest, StepResponse, StepResult
from osfleet.api.observe import observe
from osfleet.api.policy import refuse_root_actions
from osfleet.api.state import AgentState, LeasedHost, LiveEpisode
from osfleet.errors import OsfleetError
from osfleet.measure.timing import stage
from osfleet.replicas.actions import declares_infeasible, ends_episode
from osfleet.replicas.episodes import AppliedStep
from osfleet.replicas.errors import LeaseError, ReplicaBusyError, ReplicaNotFoundError
from osfleet.replicas.input import InputError

# Refused before anything reached the guest: the step may be sent again with the same action id.
REFUSED_BEFORE_THE_GUEST = (InputError, ReplicaBusyError, LeaseError, ReplicaNotFoundError)


class StepOutcomeUnknownError(OsfleetError):
    """The agent stopped while applying a step: whether it reached the guest is unknown, so it is not
    applied again (reset the replica to go on from a known state)."""


def step(s: AgentState, rid: str, req: StepRequest, who: Principal) -> StepResponse:
    """Apply ``req`` once (or replay it), with an observation when asked."""
    refuse_root_actions(req.actions, who, s.config)
    live = s.episode(rid, req.lease_id, who)
    leased = live.on(s.host, who)
    with live.lock:
        kept = live.data.applied(req.action_id)
        seen = None
        if kept is None:
            applied, took = _apply(s, live, leased, req)
            seen = _record(s, live, leased, req, applied, took)
        else:
            s.metrics.replays.inc()
            applied = kept
        if seen is None and req.observe:
            seen = observe(leased, rid, req.observation_format, req.observation_quality, req.observation_include)
    return StepResponse(
        action_id=req.action_id,
        replayed=kept is not None,
        done=applied.done,
        results=[StepResult.model_validate(x) for x in applied.results],
        observation=seen,
    )


def _apply(s: AgentState, live: LiveEpisode, leased: LeasedHost, req: StepRequest) -> tuple[AppliedStep, float]:
    """Apply a new step: its results whole (what is kept of them may be less), and how long it took."""
    rid = live.data.replica_id
    s.check_not_taken_over(rid, req.lease_id)
    if live.data.pending == req.action_id:
        raise StepOutcomeUnknownError(
            f"step {req.action_id} was under way when the host agent stopped; its outcome is unknown "
            "and it is not applied again: reset the replica"
        )
    with stage("persist"):
        s.started(live)
        s.store.pending(live.data, req.action_id)
    start = time.monotonic()
    try:
        results = leased.act(rid, req.actions)
    except REFUSED_BEFORE_THE_GUEST:
        s.store.cleared(live.data, req.action_id)
        raise
    except OsfleetError as exc:
        recording_hooks.failure(s, rid, req.lease_id, exc)
        raise
    took = time.monotonic() - start
    s.metrics.step.observe(took)
    applied = AppliedStep(
        action_id=req.action_id,
        done=any(ends_episode(a) for a in req.actions),
        results=[x.model_dump(mode="json") for x in results],
        declared_infeasible=declares_infeasible(req.actions[-1]),
    )
    with stage("persist"):
        s.store.applied(live.data, applied)
        s.audit(rid, req.lease_id, req.action_id)
    return applied, took


def _record(
    s: AgentState, live: LiveEpisode, leased: LeasedHost, req: StepRequest, applied: AppliedStep, took: float
) -> Observation | None:
    """Record the step when the host records episodes; returns the observation taken for it (or None)."""
    if s.recorder is None:
        return None
    rid = live.data.replica_id
    seen = (
        observe(leased, rid, req.observation_format, req.observation_quality, req.observation_include)
        if req.observe
        else None
    )
    with stage("record"):
        s.recorder.step(
            rid,
            req.lease_id,
            req.action_id,
            [a.model_dump(mode="json") for a in req.actions],
            applied.results,
            took,
            applied.done,
            metadata=req.metadata,
            observation=recording_hooks.image(leased, rid, seen),
            owner=live.data.owner,
        )
    return seen
