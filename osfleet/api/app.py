"""The host agent: a FastAPI service over the replicas of one host.

State (the replica host and the episodes) is created in the app's lifespan; nothing happens at import.
Endpoints are plain (threaded) functions because the replica library blocks on libvirt. Routes are
grouped per resource (native ``/v1``, OSGym's endpoints, meta) and share auth and error docs from one place.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from osfleet import __version__
from osfleet.api import auth, errors
from osfleet.api.contract import BoundaryRoute, add_metrics_route
from osfleet.api.contract import errors as documented
from osfleet.api.errors import Conflict, NotFound
from osfleet.api.metrics import host_usage
from osfleet.api.models import (
    FORMAT_DOC,
    QUALITY_DOC,
    ForkChild,
    ForkRequest,
    ForkResponse,
    Health,
    LeaseBody,
    LeaseRequest,
    LeaseResponse,
    Observation,
    OsgymReset,
    OsgymResetResponse,
    OsgymScreenshot,
    OsgymShutdown,
    OsgymShutdownResponse,
    OsgymStep,
    OsgymStepResponse,
    Released,
    ReplicaView,
    ResetRequest,
    ResetResponse,
    Retired,
    ScaleRequest,
    ScaleResponse,
    StepRequest,
    StepResponse,
)
from osfleet.api.osgym_actions import parse as parse_osgym
from osfleet.api.state import AgentState, LiveEpisode
from osfleet.config import AgentConfig
from osfleet.errors import OsfleetError, VirtError
from osfleet.replicas.actions import ActionResult, Terminate
from osfleet.replicas.episodes import AppliedStep, Episode, OsgymClient
from osfleet.replicas.errors import LeaseError, ReplicaBusyError
from osfleet.replicas.input import InputError
from osfleet.replicas.manager import ReplicaHost
from osfleet.screen import DEFAULT_QUALITY, ImageFormat
from osfleet.tasks import runner
from osfleet.tasks.model import Evaluation, Task, TaskError, find_task
from osfleet.tasks.osworld import OsworldTask, from_osworld
from osfleet.timing import Stages, collecting, stage


class StepOutcomeUnknownError(OsfleetError):
    """The agent stopped while applying a step: whether it reached the guest is unknown, so it is not
    applied again (reset the replica to go on from a known state)."""


def _observe(host: ReplicaHost, rid: str, fmt: ImageFormat = "png", quality: int | None = None) -> Observation:
    """The replica's screen now, captured and encoded in this worker thread (never on the event loop)."""
    data = host.screenshot(rid, fmt, quality)
    with stage("encode"):
        text = base64.b64encode(data).decode()
    w, h = host.image.screen
    used = None if fmt == "png" else (quality or DEFAULT_QUALITY)
    return Observation(screenshot=text, format=fmt, quality=used, width=w, height=h)


def _timed(response: Response, stages: Stages) -> None:
    """Where the request's time went, for clients and ``osfleet bench step`` (``Server-Timing``, ms)."""
    response.headers["Server-Timing"] = stages.header()


def _task_from(req: ResetRequest) -> Task | None:
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


def _set_task(live: LiveEpisode, task: Task | None) -> None:
    live.task = task
    live.data = Episode(
        replica_id=live.data.replica_id,
        lease_id=live.data.lease_id,
        task=task.model_dump(mode="json") if task is not None else None,
        osgym=live.data.osgym,
    )


# --- native API ---------------------------------------------------------------------------------------------
def _native(state: Callable[[], AgentState]) -> APIRouter:
    r = APIRouter(
        prefix="/v1",
        dependencies=[Depends(auth.require_token)],
        tags=["replicas"],
        route_class=BoundaryRoute,
        responses=documented(401, 422),
    )

    @r.post("/leases", status_code=201, responses=documented(503))
    def lease(req: LeaseRequest) -> LeaseResponse:
        """Lease a ready replica (503 capacity with Retry-After when none is ready)."""
        s = state()
        rec, lease_ = s.host.lease(req.holder, req.ttl_seconds or s.config.lease_seconds)
        return LeaseResponse(replica_id=rec.id, lease_id=lease_.id, expires_at=lease_.expires_at)

    @r.get("/replicas")
    def replicas() -> list[ReplicaView]:
        return [
            ReplicaView(
                id=x.id,
                state=x.state.value,
                generation=x.generation,
                mode=x.mode,
                image=x.image,
                leased=x.lease is not None,
                created_at=x.created_at,
                ready_at=x.ready_at,
            )
            for x in state().host.replicas()
        ]

    @r.post("/replicas", status_code=202, responses=documented(503))
    def scale_up(req: ScaleRequest) -> ScaleResponse:
        """Bring up more replicas in the background; watch them with GET /v1/replicas. 503 capacity when the
        host cannot hold that many more."""
        s = state()
        s.host.up_async(req.count, req.mode)
        return ScaleResponse(requested=req.count, mode=req.mode or s.host.mode)

    @r.delete("/replicas/{rid}", responses=documented(404, 409, 503))
    def retire(rid: str) -> Retired:
        s = state()
        s.host.retire(rid)
        if s.recorder is not None:
            s.recorder.end_replica(rid, "replica_retired")
        s.taken_over.pop(rid, None)
        s.forget(rid)
        return Retired(replica_id=rid, retired=True)

    @r.get("/host")
    def host_sample() -> dict[str, object]:
        """A sample of this host for load tests: replicas by state, disk bytes, CPU and memory."""
        s = state()
        return {"time": time.time(), **s.metrics.sample(s.host), **host_usage()}

    @r.post("/replicas/{rid}/reset", responses=documented(404, 409, 503))
    def reset(rid: str, req: ResetRequest, response: Response) -> ResetResponse:
        s = state()
        live = s.episode(rid, req.lease_id)
        task = _task_from(req)
        with collecting() as stages, live.lock:
            start = time.monotonic()
            if task is None:
                s.host.reset(rid)
            else:
                runner.reset_to_task(s.host, rid, task)
            took = time.monotonic() - start
            s.metrics.reset.observe(took)
            _set_task(live, task)
            s.save(live)
            seen = _observe(s.host, rid, req.observation_format, req.observation_quality) if req.observe else None
            with stage("record"):
                _record_begin(s, rid, live, seen)
        _timed(response, stages)
        return ResetResponse(
            replica_id=rid,
            generation=s.host.get(rid).generation,
            task_id=task.id if task else None,
            instruction=task.instruction if task else None,
            seconds=took,
            observation=seen,
        )

    @r.get("/replicas/{rid}/observation", responses=documented(404, 409, 503))
    def observation(
        rid: str,
        response: Response,
        lease_id: str = Query(min_length=1, max_length=200),
        format: Annotated[ImageFormat, Query(description=FORMAT_DOC)] = "png",
        quality: Annotated[int | None, Query(ge=1, le=100, description=QUALITY_DOC)] = None,
    ) -> Observation:
        s = state()
        s.episode(rid, lease_id)
        with collecting() as stages:
            seen = _observe(s.host, rid, format, quality)
        _timed(response, stages)
        return seen

    @r.post("/replicas/{rid}/step", responses=documented(404, 409, 503))
    def step(rid: str, req: StepRequest, response: Response) -> StepResponse:
        """Apply a batch of actions once per ``action_id``: a retry (even after an agent restart) gets the
        stored results back with ``replayed: true`` and a fresh observation. The ``Server-Timing`` header
        says where the time went (act, persist, capture, encode, record, total)."""
        s = state()
        live = s.episode(rid, req.lease_id)
        observe = (req.observation_format, req.observation_quality)
        with collecting() as stages, live.lock:
            applied = live.data.applied(req.action_id)
            seen = None
            if applied is None:
                s.check_not_taken_over(rid, req.lease_id)
                if live.data.pending == req.action_id:
                    raise StepOutcomeUnknownError(
                        f"step {req.action_id} was under way when the host agent stopped; its outcome is unknown "
                        "and it is not applied again: reset the replica"
                    )
                live.data.pending = req.action_id
                with stage("persist"):
                    s.save(live)
                start = time.monotonic()
                try:
                    results = s.host.act(rid, req.actions)
                except (InputError, ReplicaBusyError):  # refused before anything reached the guest
                    live.data.pending = None
                    s.save(live)
                    raise
                except OsfleetError as exc:
                    _record_failure(s, rid, req.lease_id, exc)
                    raise
                took = time.monotonic() - start
                s.metrics.step.observe(took)
                last = req.actions[-1] if req.actions else None
                applied = AppliedStep(
                    action_id=req.action_id,
                    done=any(a.type == "terminate" for a in req.actions),
                    results=[x.model_dump(mode="json") for x in results],
                    declared_infeasible=isinstance(last, Terminate) and last.status == "failure",
                )
                live.data.remember(applied)
                live.data.pending = None
                with stage("persist"):
                    s.save(live)
                    s.audit(rid, live.data.lease_id, req.action_id)
                replayed = False
                if s.recorder is not None:
                    seen = _observe(s.host, rid, *observe) if req.observe else None
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
                            observation=_png(s, rid, seen),
                        )
            else:
                replayed = True
                s.metrics.replays.inc()
            if seen is None and req.observe:
                seen = _observe(s.host, rid, *observe)
        _timed(response, stages)
        return StepResponse(
            action_id=req.action_id,
            replayed=replayed,
            done=applied.done,
            results=[ActionResult.model_validate(x) for x in applied.results],
            observation=seen,
        )

    @r.post("/replicas/{rid}/fork", status_code=201, responses=documented(404, 409, 503))
    def fork(rid: str, req: ForkRequest) -> ForkResponse:
        """Fork the leased replica mid-episode: ``children`` replicas start from its current state (screen,
        memory, disk), each with its own identity, leased to the caller, with the parent's task and applied
        steps (``evaluate`` works on each). The parent pauses only while it is saved, then goes on. 503
        capacity when this host cannot hold that many more replicas."""
        s = state()
        live = s.episode(rid, req.lease_id)
        with live.lock:  # no step of the parent is half-applied in the saved state
            s.check_not_taken_over(rid, req.lease_id)
            forked = s.host.fork(rid, req.children, req.lease_id, s.config.lease_seconds)
            children = []
            for child in forked.children:
                assert child.lease is not None  # a lease holder's fork leases every child
                child_live = s.adopt_fork_child(child.record.id, child.lease.id, live)
                _record_begin(s, child.record.id, child_live, None)
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

    @r.post("/replicas/{rid}/evaluate", responses=documented(404, 409, 503))
    def evaluate(rid: str, req: LeaseBody) -> Evaluation:
        s = state()
        live = s.episode(rid, req.lease_id)
        with live.lock:
            task = s.task_of(live, rid)
            start = time.monotonic()
            result = runner.evaluate(s.host, rid, task, live.data.declared_infeasible())
            s.metrics.evaluate.observe(time.monotonic() - start)
            if s.recorder is not None:
                s.recorder.evaluated(rid, req.lease_id, result.reward, result.success)
            return result

    @r.post("/replicas/{rid}/release", responses=documented(404, 409))
    def release(rid: str, req: LeaseBody) -> Released:
        """End the lease; the replica is reset before anyone else can lease it."""
        s = state()
        s.host.check_lease(rid, req.lease_id)
        if s.recorder is not None:
            s.recorder.end(rid, req.lease_id, "released")
        s.taken_over.pop(rid, None)
        ready = s.host.release(rid, req.lease_id)
        s.forget(rid)
        return Released(replica_id=rid, released=True, ready_again=ready)

    return r


# --- OSGym wire compatibility -------------------------------------------------------------------------------
def _osgym(state: Callable[[], AgentState]) -> APIRouter:
    r = APIRouter(
        dependencies=[Depends(auth.require_token_or_osgym_ip)],
        tags=["osgym"],
        route_class=BoundaryRoute,
        responses=documented(401, 422),
    )

    def jpeg(s: AgentState, rid: str) -> str:
        return base64.b64encode(s.host.screenshot(rid, "jpeg")).decode()

    @r.post("/reset", responses=documented(503))
    def reset(req: OsgymReset, request: Request) -> OsgymResetResponse:
        s, who = state(), auth.caller(request)
        task = from_osworld(req.task_config)
        rec, lease_ = s.host.lease(who, float(req.timeout))
        try:
            start = time.monotonic()
            runner.reset_to_task(s.host, rec.id, task)
            s.metrics.reset.observe(time.monotonic() - start)
            live = s.episode(rec.id, lease_.id)
            with live.lock:
                _set_task(live, task)
                vm_id = s.new_vm(rec.id)
                live.data.osgym = OsgymClient(vm_id=vm_id, owner=who)
                s.save(live)
                _record_begin(s, rec.id, live, None)
            screenshot = jpeg(s, rec.id)
        except BaseException:
            s.forget(rec.id)
            s.host.release(rec.id, lease_.id)
            raise
        return OsgymResetResponse(screenshot=screenshot, problem=task.instruction, vm_id=vm_id)

    @r.post("/step", responses=documented(404, 409, 503))
    def step(req: OsgymStep, request: Request) -> OsgymStepResponse:
        s = state()
        rid, live = s.vm(req.vm_id, auth.caller(request))
        parsed = parse_osgym(req.action)
        s.host.check_lease(rid, live.data.lease_id)  # 409 once the lease has expired
        with live.lock:
            task = s.task_of(live, rid)
            if parsed.actions:
                s.check_not_taken_over(rid, live.data.lease_id)
            start = time.monotonic()
            try:
                results = s.host.act(rid, parsed.actions) if parsed.actions else []
            except OsfleetError as exc:
                _record_failure(s, rid, live.data.lease_id, exc)
                raise
            took = time.monotonic() - start
            s.metrics.step.observe(took)
            failed = [x for x in results if not x.ok]
            if failed:
                error = VirtError(f"vm {req.vm_id}: {failed[0].type} failed: {failed[0].error}")
                _record_failure(s, rid, live.data.lease_id, error)
                raise error
            shot = s.host.screenshot(rid, "jpeg")
            screenshot = base64.b64encode(shot).decode()
            if s.recorder is not None:
                s.recorder.step(
                    rid,
                    live.data.lease_id,
                    f"osgym-{len(live.data.steps)}-{time.time_ns()}",
                    [a.model_dump(mode="json") for a in parsed.actions],
                    [x.model_dump(mode="json") for x in results],
                    took,
                    parsed.finish,
                    metadata={"osgym_action": req.action},
                    observation=shot,
                )
            reward = 0.0
            if parsed.finish:
                start = time.monotonic()
                evaluation = runner.evaluate(s.host, rid, task, parsed.declared_infeasible)
                reward = evaluation.reward
                s.metrics.evaluate.observe(time.monotonic() - start)
                if s.recorder is not None:
                    s.recorder.evaluated(rid, live.data.lease_id, evaluation.reward, evaluation.success)
        if parsed.finish:
            _release(s, rid, live)
        return OsgymStepResponse(screenshot=screenshot, is_finish=parsed.finish, reward=reward)

    @r.post("/shutdown", responses=documented(404))
    def shutdown(req: OsgymShutdown, request: Request) -> OsgymShutdownResponse:
        """Release the caller's vm (or all of the caller's vms); another client's vms are never touched."""
        s, who = state(), auth.caller(request)
        ids = s.vms_of(who) if req.vm_id == "all" else [req.vm_id]
        for vm_id in ids:
            rid, live = s.vm(vm_id, who)
            _release(s, rid, live)
        return OsgymShutdownResponse(vm_id=req.vm_id)

    @r.get("/screenshot", responses=documented(404, 409, 503))
    def screenshot(request: Request, vm_id: int = Query(alias="vmId")) -> OsgymScreenshot:
        s = state()
        rid, _ = s.vm(vm_id, auth.caller(request))
        return OsgymScreenshot(screenshot=jpeg(s, rid), vm_id=vm_id)

    return r


def _release(s: AgentState, rid: str, live: LiveEpisode) -> None:
    if s.recorder is not None:
        s.recorder.end(rid, live.data.lease_id, "released")
    s.taken_over.pop(rid, None)
    s.forget(rid)
    with contextlib.suppress(LeaseError):  # the lease ended already (expired): the replica was reset then
        s.host.release(rid, live.data.lease_id)


# --- recording hooks (osfleet.recording) ---------------------------------------------------------------------
def _png(s: AgentState, rid: str, seen: Observation | None) -> bytes | None:
    """The screen after a step, as image bytes: the observation already taken, else a new screenshot."""
    if seen is not None and seen.screenshot is not None:
        return base64.b64decode(seen.screenshot)
    try:
        return s.host.screenshot(rid, "png")
    except OsfleetError:  # the step is applied and answered; only its recorded image is missing
        return None


def _record_begin(s: AgentState, rid: str, live: LiveEpisode, seen: Observation | None) -> None:
    if s.recorder is None:
        return
    rec = s.host.get(rid)
    holder = rec.lease.holder if rec.lease is not None else ""
    s.recorder.begin(rid, live.data.lease_id, holder, live.data.task, _png(s, rid, seen))


def _record_failure(s: AgentState, rid: str, lease_id: str, exc: Exception) -> None:
    """An infrastructure failure in a step ends the recorded episode as the infrastructure's doing."""
    if s.recorder is not None and errors.classify(exc)[1] == "infrastructure":
        s.recorder.end(rid, lease_id, "replica_failed", str(exc))


# --- the app ------------------------------------------------------------------------------------------------
def create_app(config: AgentConfig, host_factory: Callable[[], ReplicaHost]) -> FastAPI:
    """``host_factory`` runs in the lifespan: the replica host (adopting what is on disk) lives as long as
    the app, and its background monitor and warm pool run meanwhile."""
    holder: dict[str, AgentState] = {}

    def state() -> AgentState:
        return holder["state"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        host = host_factory()
        try:
            host.adopt()
            holder["state"] = AgentState(host, config)
            host.start_background()
            yield
        finally:
            if "state" in holder:
                holder["state"].close()
            host.close()

    app = FastAPI(title="osfleet host agent", version=__version__, lifespan=lifespan)
    app.state.config = config
    errors.install(app, on_error=lambda kind: state().metrics.failure(kind) if "state" in holder else None)
    app.include_router(_native(state))
    app.include_router(_osgym(state))

    @app.get("/health", tags=["meta"], responses={503: {"model": Health, "description": "a background thread died"}})
    def health() -> Response:
        """Open to anyone: 200 while the agent works, 503 when its monitor or warm pool has died."""
        s = state()
        counts: dict[str, int] = {}
        for rec in s.host.replicas():
            counts[rec.state.value] = counts.get(rec.state.value, 0) + 1
        ok = s.host.background_alive()
        body = Health(
            status="ok" if ok else "failing",
            image=s.host.image.name,
            accelerator=s.host.accel,
            replicas=counts,
            problem=None if ok else "the failure monitor or the warm pool has stopped",
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    add_metrics_route(app, lambda: state().metrics.render(state().host))

    # --- the dashboard at /ui (osfleet.ui; not in the OpenAPI) ---------------------------------------------
    from osfleet.ui import LocalBackend
    from osfleet.ui import install as install_ui

    def sample() -> dict[str, object]:
        s = state()
        return {"time": time.time(), **s.metrics.sample(s.host), **host_usage()}

    dashboard = LocalBackend(state, sample)
    install_ui(app, lambda: dashboard, "osfleet host agent")

    return app


__all__ = ["AgentState", "create_app"]
