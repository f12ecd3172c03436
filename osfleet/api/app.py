"""The host agent: a FastAPI service over the replicas of one host.

State (the replica host, episodes, OSGym vm ids) is created in the app's lifespan; nothing happens at
import. Endpoints are plain (threaded) functions because the replica library blocks on libvirt.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from osfleet import __version__
from osfleet.api import auth, errors
from osfleet.api.errors import Conflict, NotFound
from osfleet.api.metrics import Metrics, host_usage
from osfleet.api.osgym_actions import parse as parse_osgym
from osfleet.config import AgentConfig
from osfleet.errors import VirtError
from osfleet.replicas.actions import Action, ActionResult
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import Lease
from osfleet.tasks import runner
from osfleet.tasks.model import Evaluation, Task, find_task, parse_task

STEP_CACHE_SIZE = 256


@dataclass
class Episode:
    lease_id: str
    task: Task | None = None
    steps: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class OsgymVm:
    replica: str
    lease_id: str
    owner: str


class AgentState:
    def __init__(self, host: ReplicaHost, config: AgentConfig) -> None:
        self.host = host
        self.config = config
        self.metrics = Metrics()
        self.episodes: dict[str, Episode] = {}
        self.osgym: dict[int, OsgymVm] = {}
        self.next_vm = 0
        self.lock = threading.Lock()

    def episode(self, rid: str, lease_id: str) -> Episode:
        self.host.check_lease(rid, lease_id)  # 404 unknown replica, 409 foreign or expired lease
        with self.lock:
            ep = self.episodes.get(rid)
            if ep is None or ep.lease_id != lease_id:
                ep = Episode(lease_id=lease_id)
                self.episodes[rid] = ep
            return ep


# --- request and response bodies --------------------------------------------------------------------------
class LeaseRequest(BaseModel):
    holder: str = Field("anonymous", max_length=200)
    ttl_seconds: float | None = Field(None, gt=0, le=86400)


class ScaleRequest(BaseModel):
    count: int = Field(ge=1, le=1024)
    mode: Literal["snapshot", "cold"] | None = None


class LeaseResponse(BaseModel):
    replica_id: str
    lease_id: str
    expires_at: float


class LeaseBody(BaseModel):
    lease_id: str = Field(min_length=1, max_length=200)


class ResetRequest(LeaseBody):
    task_id: str | None = None
    task: dict[str, Any] | None = None
    observe: bool = True


class Observation(BaseModel):
    screenshot: str | None = Field(None, description="base64 image")
    format: str = "png"
    width: int
    height: int


class ResetResponse(BaseModel):
    replica_id: str
    generation: int
    task_id: str | None
    instruction: str | None
    seconds: float
    observation: Observation | None


class StepRequest(LeaseBody):
    action_id: str = Field(min_length=1, max_length=200, description="caller-chosen; a retry with it applies once")
    actions: list[Action] = Field(min_length=1, max_length=100)
    observe: bool = True


class StepResponse(BaseModel):
    action_id: str
    replayed: bool = False
    done: bool
    results: list[ActionResult]
    observation: Observation | None


def _observe(host: ReplicaHost, rid: str, fmt: str = "png") -> Observation:
    data = host.screenshot(rid, fmt)
    w, h = host.image.screen
    return Observation(screenshot=base64.b64encode(data).decode(), format=fmt, width=w, height=h)


def _task_from(req: ResetRequest) -> Task | None:
    if req.task_id and req.task:
        raise Conflict("give task_id or task, not both")
    if req.task_id:
        try:
            return find_task(req.task_id)
        except Exception as exc:
            raise NotFound(str(exc)) from None
    return parse_task(req.task, "in request") if req.task is not None else None


# --- native API ---------------------------------------------------------------------------------------------
def _native(state: Callable[[], AgentState]) -> APIRouter:
    r = APIRouter(prefix="/v1", dependencies=[Depends(auth.require_token)], tags=["replicas"])

    @r.post("/leases", status_code=201)
    def lease(req: LeaseRequest) -> LeaseResponse:
        s = state()
        rec, lease_ = s.host.lease(req.holder, req.ttl_seconds or s.config.lease_seconds)
        return LeaseResponse(replica_id=rec.id, lease_id=lease_.id, expires_at=lease_.expires_at)

    @r.get("/replicas")
    def replicas() -> list[dict[str, Any]]:
        return [
            {
                "id": x.id,
                "state": x.state,
                "generation": x.generation,
                "mode": x.mode,
                "image": x.image,
                "leased": x.lease is not None,
                "created_at": x.created_at,
                "ready_at": x.ready_at,
            }
            for x in state().host.replicas()
        ]

    @r.post("/replicas", status_code=202)
    def scale_up(req: ScaleRequest) -> dict[str, Any]:
        """Bring up more replicas in the background; watch them with GET /v1/replicas."""
        state().host.up_async(req.count, req.mode)
        return {"requested": req.count, "mode": req.mode or state().host.mode}

    @r.delete("/replicas/{rid}")
    def retire(rid: str) -> dict[str, Any]:
        state().host.retire(rid)
        return {"replica_id": rid, "retired": True}

    @r.get("/host")
    def host_sample() -> dict[str, Any]:
        """A sample of this host for load tests: replicas by state, disk bytes, CPU and memory."""
        s = state()
        return {"time": time.time(), **s.metrics.sample(s.host), **host_usage()}

    @r.post("/replicas/{rid}/reset")
    def reset(rid: str, req: ResetRequest) -> ResetResponse:
        s = state()
        ep = s.episode(rid, req.lease_id)
        task = _task_from(req)
        with ep.lock:
            start = time.monotonic()
            if task is None:
                s.host.reset(rid)
            else:
                runner.reset_to_task(s.host, rid, task)
            took = time.monotonic() - start
            s.metrics.reset.observe(took)
            ep.task, ep.steps = task, OrderedDict()
        return ResetResponse(
            replica_id=rid,
            generation=s.host.get(rid).generation,
            task_id=task.id if task else None,
            instruction=task.instruction if task else None,
            seconds=took,
            observation=_observe(s.host, rid) if req.observe else None,
        )

    @r.get("/replicas/{rid}/observation")
    def observation(
        rid: str, lease_id: str = Query(min_length=1), format: Literal["png", "jpeg"] = "png"
    ) -> Observation:
        s = state()
        s.episode(rid, lease_id)
        return _observe(s.host, rid, format)

    @r.post("/replicas/{rid}/step")
    def step(rid: str, req: StepRequest) -> StepResponse:
        s = state()
        ep = s.episode(rid, req.lease_id)
        with ep.lock:
            if req.action_id in ep.steps:
                return StepResponse(**{**ep.steps[req.action_id], "replayed": True})
            start = time.monotonic()
            results = s.host.act(rid, req.actions)
            s.metrics.step.observe(time.monotonic() - start)
            done = any(a.type == "terminate" for a in req.actions)
            body = {
                "action_id": req.action_id,
                "done": done,
                "results": results,
                "observation": _observe(s.host, rid) if req.observe else None,
            }
            ep.steps[req.action_id] = body
            while len(ep.steps) > STEP_CACHE_SIZE:
                ep.steps.popitem(last=False)
            return StepResponse(**body)

    @r.post("/replicas/{rid}/evaluate")
    def evaluate(rid: str, req: LeaseBody) -> Evaluation:
        s = state()
        ep = s.episode(rid, req.lease_id)
        if ep.task is None:
            raise Conflict(f"replica {rid} has no task: reset it with task_id or task first")
        with ep.lock:
            start = time.monotonic()
            result = runner.evaluate(s.host, rid, ep.task)
            s.metrics.evaluate.observe(time.monotonic() - start)
            return result

    @r.post("/replicas/{rid}/release")
    def release(rid: str, req: LeaseBody) -> dict[str, Any]:
        s = state()
        s.host.check_lease(rid, req.lease_id)
        s.host.release(rid, req.lease_id)
        with s.lock:
            s.episodes.pop(rid, None)
        return {"replica_id": rid, "released": True}

    return r


# --- OSGym wire compatibility -------------------------------------------------------------------------------
class OsgymReset(BaseModel):
    task_config: dict[str, Any]
    timeout: int = Field(1000, gt=0)


class OsgymStep(BaseModel):
    action: str
    vm_id: int


class OsgymShutdown(BaseModel):
    vm_id: int | Literal["all"]


def _osgym(state: Callable[[], AgentState]) -> APIRouter:
    r = APIRouter(dependencies=[Depends(auth.require_token_or_osgym_ip)], tags=["osgym"])

    def owned(s: AgentState, vm_id: int, who: str) -> OsgymVm:
        vm = s.osgym.get(vm_id)
        if vm is None or vm.owner != who:
            raise NotFound(f"vm {vm_id} is not allocated to this client")
        return vm

    def jpeg(s: AgentState, rid: str) -> str:
        return base64.b64encode(s.host.screenshot(rid, "jpeg")).decode()

    @r.post("/reset")
    def reset(req: OsgymReset, request: Request) -> dict[str, Any]:
        s, who = state(), auth.caller(request)
        task = parse_task(req.task_config, "task_config")
        rec, lease_ = s.host.lease(who, float(req.timeout))
        try:
            start = time.monotonic()
            runner.reset_to_task(s.host, rec.id, task)
            s.metrics.reset.observe(time.monotonic() - start)
        except Exception:
            s.host.release(rec.id, lease_.id)
            raise
        with s.lock:
            vm_id = s.next_vm
            s.next_vm += 1
            s.osgym[vm_id] = OsgymVm(rec.id, lease_.id, who)
            s.episodes[rec.id] = Episode(lease_id=lease_.id, task=task)
        return {"screenshot": jpeg(s, rec.id), "problem": task.instruction, "vm_id": vm_id}

    @r.post("/step")
    def step(req: OsgymStep, request: Request) -> dict[str, Any]:
        s = state()
        vm = owned(s, req.vm_id, auth.caller(request))
        parsed = parse_osgym(req.action)
        start = time.monotonic()
        results = s.host.act(vm.replica, parsed.actions) if parsed.actions else []
        s.metrics.step.observe(time.monotonic() - start)
        failed = [r_ for r_ in results if not r_.ok]
        if failed:
            raise VirtError(f"vm {req.vm_id}: {failed[0].type} failed: {failed[0].error}")
        reward = 0.0
        screenshot = jpeg(s, vm.replica)
        if parsed.finish:
            task = s.episodes[vm.replica].task
            assert task is not None
            start = time.monotonic()
            reward = runner.evaluate(s.host, vm.replica, task).reward
            s.metrics.evaluate.observe(time.monotonic() - start)
            _release(s, req.vm_id)
        return {"screenshot": screenshot, "is_finish": parsed.finish, "reward": reward}

    @r.post("/shutdown")
    def shutdown(req: OsgymShutdown, request: Request) -> dict[str, Any]:
        s, who = state(), auth.caller(request)
        if req.vm_id == "all":
            for vm_id in [i for i, vm in list(s.osgym.items()) if vm.owner == who]:
                _release(s, vm_id)
        else:
            owned(s, req.vm_id, who)
            _release(s, req.vm_id)
        return {"vm_id": req.vm_id}

    @r.get("/screenshot")
    def screenshot(request: Request, vm_id: int = Query(alias="vmId")) -> dict[str, Any]:
        s = state()
        vm = owned(s, vm_id, auth.caller(request))
        return {"screenshot": jpeg(s, vm.replica), "vm_id": vm_id}

    return r


def _release(s: AgentState, vm_id: int) -> None:
    with s.lock:
        vm = s.osgym.pop(vm_id, None)
        if vm is not None:
            s.episodes.pop(vm.replica, None)
    if vm is not None:
        s.host.release(vm.replica, vm.lease_id)


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
        host.adopt()
        host.start_background()
        holder["state"] = AgentState(host, config)
        try:
            yield
        finally:
            host.close()

    app = FastAPI(title="osfleet host agent", version=__version__, lifespan=lifespan)
    app.state.config = config
    errors.install(app, on_error=lambda kind: state().metrics.failure(kind) if "state" in holder else None)
    app.include_router(_native(state))
    app.include_router(_osgym(state))

    @app.get("/health", tags=["meta"])
    def health() -> dict[str, Any]:
        s = state()
        counts: dict[str, int] = {}
        for rec in s.host.replicas():
            counts[rec.state.value] = counts.get(rec.state.value, 0) + 1
        return {"status": "ok", "image": s.host.image.name, "accelerator": s.host.accel, "replicas": counts}

    @app.get("/metrics", tags=["meta"], dependencies=[Depends(auth.require_loopback_or_token)])
    def metrics() -> Response:
        s = state()
        return Response(s.metrics.render(s.host), media_type="text/plain; version=0.0.4")

    return app


__all__ = ["AgentState", "Lease", "create_app"]
