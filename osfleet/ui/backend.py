"""What the dashboard shows and does, behind one interface with two implementations.

``LocalBackend`` is the host agent's: it reads the replica host, the recorder's store and ``/v1/host``'s
sample directly. ``FleetBackend`` is the gateway's: it asks every host agent's ``/ui/api`` (with the host's
token, naming the dashboard's user as the client it acts for) and names replicas and episodes with fleet ids
(``<host>.<id>``). The dashboard's routes only see ``Backend``, so the pages are the same on a host and on the
gateway, and so are the rules: every method takes the user (``who``) and shows or does only what is theirs.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from PIL import Image, ImageDraw
from pydantic import BaseModel, TypeAdapter
from starlette.concurrency import run_in_threadpool

from osfleet.api.auth import Principal
from osfleet.api.errors import Conflict, NotFound, relayed
from osfleet.api.policy import refuse_root_actions
from osfleet.errors import OsfleetError
from osfleet.protocol.actions import Action
from osfleet.recording import TrajectoryError, TrajectoryStore, store_dir
from osfleet.recording.store import TrajectoryMeta
from osfleet.recording.video import export_mp4
from osfleet.replicas.actions import check_actions
from osfleet.replicas.errors import ReplicaNotFoundError
from osfleet.replicas.leases import Claim
from osfleet.replicas.records import Lease, ReplicaRecord, State

ACTIONS = TypeAdapter(list[Action])
THUMB_WIDTH = 320
VIDEO_ROUTE = "video"  # the gateway's deadline for a host's MP4 (gateway.DEADLINES): encoding takes a while
SCREEN_CACHE_SECONDS = 0.5  # viewers of one replica share its screenshots (two a second at most per size)


class ReplicaRow(BaseModel):
    id: str
    host: str
    state: str
    generation: int
    leased: bool
    holder: str | None = None
    lease_expires_at: float | None = None
    created_at: float
    taken_over: bool = False
    recording: str | None = None  # the open recorded episode, if any


class Backend(Protocol):
    """What the dashboard shows and does, for one principal at a time (``who``): the operator sees
    everything; a client only the replicas it holds a lease on and the episodes recorded under its leases
    (anything else is "not found", as in the API)."""

    kind: str  # "host" or "fleet"

    async def replicas(self, who: Principal) -> list[ReplicaRow]: ...
    async def figures(self, who: Principal) -> dict[str, dict[str, Any]]: ...
    async def screen(self, rid: str, width: int | None, who: Principal) -> bytes: ...
    async def take_over(self, rid: str, who: Principal) -> None: ...
    async def hand_back(self, rid: str, who: Principal) -> None: ...
    async def act(self, rid: str, actions: list[dict[str, Any]], who: Principal) -> list[dict[str, Any]]: ...
    async def trajectories(self, who: Principal) -> list[dict[str, Any]]: ...
    async def trajectory(self, tid: str, who: Principal) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
    async def image(self, tid: str, name: str, who: Principal) -> tuple[bytes, str]: ...
    async def video(self, tid: str, who: Principal) -> Path:
        """The episode as an MP4 in a temporary file, which the caller streams and then removes."""
        ...


def scaled_jpeg(data: bytes, width: int | None, quality: int = 70) -> bytes:
    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    if width is not None and rgb.width > width:
        rgb = rgb.resize((width, max(1, rgb.height * width // rgb.width)))
    buf = io.BytesIO()
    rgb.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def placeholder(text: str, size: tuple[int, int] = (THUMB_WIDTH, 200)) -> bytes:
    """A grey picture saying why there is no screen (a replica booting, resetting or failed)."""
    img = Image.new("RGB", size, (60, 60, 60))
    ImageDraw.Draw(img).text((10, size[1] // 2 - 6), text[:48], fill=(220, 220, 220))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=70)
    return buf.getvalue()


def media_type(name: str) -> str:
    return "image/webp" if name.endswith(".webp") else "image/jpeg"


# --- on a host agent ----------------------------------------------------------------------------------------
class LocalBackend:
    kind = "host"

    def __init__(self, state: Any, sample: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._state = state  # () -> AgentState
        self._sample = sample  # the /v1/host sample (taken off the shared thread pool)
        self.host_name = socket.gethostname()
        # (replica, lease, width) -> (when, JPEG): viewers of one lease share its screenshots; never another lease
        self._screens: dict[tuple[str, str | None, int | None], tuple[float, bytes]] = {}
        self._screens_lock = threading.Lock()
        self._encoding = asyncio.Semaphore(1)  # one MP4 encoded at a time: it takes a core while it runs

    @property
    def s(self) -> Any:
        return self._state()

    def _store(self) -> TrajectoryStore:
        s = self.s
        if s.recorder is not None:
            return s.recorder.store  # type: ignore[no-any-return]
        return TrajectoryStore(store_dir(s.host.settings.home))  # what an earlier run recorded

    def _visible(self, rid: str, who: Principal) -> ReplicaRecord:
        """The replica's record if ``who`` may see it (a client: only while it holds a lease on it)."""
        rec: ReplicaRecord = self.s.host.get(rid)
        if not who.operator and (rec.lease is None or rec.lease.owner != who.name):
            raise ReplicaNotFoundError(f"no replica {rid}")
        return rec

    async def replicas(self, who: Principal) -> list[ReplicaRow]:
        s = self.s
        recording = {}
        if s.recorder is not None:
            recording = s.recorder.open_by_replica()
        return [
            ReplicaRow(
                id=r.id,
                host=self.host_name,
                state=r.state.value,
                generation=r.generation,
                leased=r.lease is not None,
                holder=r.lease.holder if r.lease is not None else None,
                lease_expires_at=r.lease.expires_at if r.lease is not None else None,
                created_at=r.created_at,
                taken_over=r.lease is not None and s.taken_over.get(r.id) == r.lease.id,
                recording=recording.get(r.id),
            )
            for r in sorted(s.visible(who), key=lambda r: r.created_at)
        ]

    async def figures(self, who: Principal) -> dict[str, dict[str, Any]]:
        """The host's sample: the operator's (it covers every tenant)."""
        return {"this host": await self._sample()} if who.operator else {}

    async def screen(self, rid: str, width: int | None, who: Principal) -> bytes:
        rec = self._visible(rid, who)
        lease_id = rec.lease.id if rec.lease is not None else None
        key, now = (rid, lease_id, width), time.monotonic()
        with self._screens_lock:
            cached = self._screens.get(key)
        if cached is not None and now - cached[0] < SCREEN_CACHE_SECONDS:
            return cached[1]

        def grab() -> bytes:
            try:
                return scaled_jpeg(self.s.host.screenshot(rid, "jpeg"), width)
            except OsfleetError:
                return placeholder(f"{rid}: {rec.state.value}")

        data = await run_in_threadpool(grab)
        # Taken without the replica's lock (a step may hold it for a minute): shown only if the lease that was
        # checked before is still the replica's now, so it held throughout (a lease never comes back).
        after = self._visible(rid, who)
        if not who.operator and (after.lease.id if after.lease is not None else None) != lease_id:
            raise ReplicaNotFoundError(f"no replica {rid}")
        with self._screens_lock:
            self._screens = {k: v for k, v in self._screens.items() if now - v[0] < 10 * SCREEN_CACHE_SECONDS}
            self._screens[key] = (time.monotonic(), data)
        return data

    def _leased(self, rid: str, who: Principal) -> Lease:
        rec = self._visible(rid, who)
        if rec.state != State.LEASED or rec.lease is None:
            raise Conflict(f"replica {rid} is {rec.state.value}: only a leased replica can be taken over")
        return rec.lease

    async def take_over(self, rid: str, who: Principal) -> None:
        self.s.taken_over[rid] = self._leased(rid, who).id

    async def hand_back(self, rid: str, who: Principal) -> None:
        self._visible(rid, who)
        self.s.taken_over.pop(rid, None)

    async def act(self, rid: str, actions: list[dict[str, Any]], who: Principal) -> list[dict[str, Any]]:
        """A person's input through the agent's own act path (validated the same way, the same root rule, the
        lease checked under the replica's lock), recorded as theirs."""
        lease = self._leased(rid, who)
        if self.s.taken_over.get(rid) != lease.id:
            raise Conflict(f"take over replica {rid} before sending input")
        parsed = ACTIONS.validate_python(actions)
        refuse_root_actions(parsed, who, self.s.config)
        check_actions(parsed, self.s.host.image.screen)
        claim = Claim(who.owner, lease.id)
        start = time.monotonic()
        results = await run_in_threadpool(lambda: self.s.host.act(rid, parsed, claim=claim))
        took = time.monotonic() - start
        with self._screens_lock:  # the person sees the effect in the next frame
            self._screens = {k: v for k, v in self._screens.items() if k[0] != rid}
        dumped = [r.model_dump(mode="json") for r in results]
        if self.s.recorder is not None:
            png = await run_in_threadpool(lambda: self.s.host.screenshot(rid, "png", claim=claim))
            self.s.recorder.step(
                rid,
                lease.id,
                f"person-{time.time_ns()}",
                [a.model_dump(mode="json") for a in parsed],
                dumped,
                took,
                False,
                observation=png,
                source="person",
                owner=lease.owner,
            )
        return dumped

    def _meta(self, tid: str, who: Principal) -> TrajectoryMeta:
        try:
            meta = self._store().meta(tid)
        except TrajectoryError as exc:
            raise NotFound(str(exc)) from None
        if not who.owns(meta.owner):
            raise NotFound(f"no recorded episode {tid}")
        return meta

    async def trajectories(self, who: Principal) -> list[dict[str, Any]]:
        metas = await run_in_threadpool(self._store().all)
        return [m.model_dump(mode="json", exclude={"task"}) for m in metas if who.owns(m.owner)]

    async def trajectory(self, tid: str, who: Principal) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        meta = self._meta(tid, who)
        try:
            steps = self._store().steps(tid)
        except TrajectoryError as exc:
            raise NotFound(str(exc)) from None
        return meta.model_dump(mode="json"), [s.model_dump(mode="json") for s in steps]

    async def image(self, tid: str, name: str, who: Principal) -> tuple[bytes, str]:
        self._meta(tid, who)
        try:
            return self._store().image_path(tid, name).read_bytes(), media_type(name)
        except TrajectoryError as exc:
            raise NotFound(str(exc)) from None

    async def video(self, tid: str, who: Principal) -> Path:
        self._meta(tid, who)
        async with self._encoding:
            path = _temporary(".mp4")
            gone = threading.Event()  # the request was given up (the browser left): the encoding stops
            try:
                await run_in_threadpool(_encode, self._store(), tid, path, gone)
            except TrajectoryError as exc:  # no screens in it (a step's image gone)
                path.unlink(missing_ok=True)
                raise NotFound(str(exc)) from None
            except BaseException:
                gone.set()
                path.unlink(missing_ok=True)
                raise
            return path


# --- on the fleet gateway -----------------------------------------------------------------------------------
class FleetBackend:
    """Every healthy host's ``/ui/api``, with fleet ids, on behalf of the dashboard's user (the hosts apply the
    same rules: a client sees its own replicas and episodes only)."""

    kind = "fleet"

    def __init__(self, get_gateway: Any) -> None:
        self._get_gateway = get_gateway  # () -> Gateway

    async def _call(self, host: str, method: str, path: str, who: Principal, route: str = "quick", **kw: Any) -> Any:
        gateway = self._get_gateway()
        resp = await gateway.call(route, gateway.pool.get(host), method, path, who=who, **kw)
        if resp.status_code < 300:
            return resp
        try:
            body = resp.json()
        except ValueError:
            body = None
        raise relayed(resp.status_code, body, host)

    async def _each(self, path: str, who: Principal) -> list[tuple[str, Any]]:
        gateway = self._get_gateway()
        hosts = gateway.pool.healthy()
        answers = await asyncio.gather(*(self._call(h.name, "GET", path, who) for h in hosts), return_exceptions=True)
        return [(h.name, a.json()) for h, a in zip(hosts, answers, strict=True) if not isinstance(a, BaseException)]

    @staticmethod
    def _split(fleet_id: str) -> tuple[str, str]:
        from osfleet.fleet import ids

        return ids.split(fleet_id)

    async def replicas(self, who: Principal) -> list[ReplicaRow]:
        from osfleet.fleet import ids

        out = []
        for host, rows in await self._each("/ui/api/replicas", who):
            for row in rows:
                r = ReplicaRow.model_validate(row)
                r.id, r.host = ids.join(host, r.id), host
                if r.recording:
                    r.recording = ids.join(host, r.recording)
                out.append(r)
        return out

    async def figures(self, who: Principal) -> dict[str, dict[str, Any]]:
        if not who.operator:
            return {}
        return {h.name: (h.sample or {"unhealthy": h.reason}) for h in self._get_gateway().pool.hosts}

    async def screen(self, rid: str, width: int | None, who: Principal) -> bytes:
        host, local = self._split(rid)
        params = {"w": width} if width else None
        resp = await self._call(host, "GET", f"/ui/api/replicas/{local}/screen", who, params=params)
        return resp.content  # type: ignore[no-any-return]

    async def take_over(self, rid: str, who: Principal) -> None:
        host, local = self._split(rid)
        await self._call(host, "POST", f"/ui/api/replicas/{local}/take-over", who)

    async def hand_back(self, rid: str, who: Principal) -> None:
        host, local = self._split(rid)
        await self._call(host, "POST", f"/ui/api/replicas/{local}/hand-back", who)

    async def act(self, rid: str, actions: list[dict[str, Any]], who: Principal) -> list[dict[str, Any]]:
        host, local = self._split(rid)
        return (await self._call(host, "POST", f"/ui/api/replicas/{local}/act", who, json=actions)).json()  # type: ignore[no-any-return]

    async def trajectories(self, who: Principal) -> list[dict[str, Any]]:
        from osfleet.fleet import ids

        out = []
        for host, metas in await self._each("/ui/api/trajectories", who):
            out += [{**m, "id": ids.join(host, m["id"]), "host": host} for m in metas]
        return sorted(out, key=lambda m: m["started_at"], reverse=True)

    async def trajectory(self, tid: str, who: Principal) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        host, local = self._split(tid)
        body = (await self._call(host, "GET", f"/ui/api/trajectories/{local}", who)).json()
        return {**body["meta"], "id": tid, "host": host}, body["steps"]

    async def image(self, tid: str, name: str, who: Principal) -> tuple[bytes, str]:
        host, local = self._split(tid)
        resp = await self._call(host, "GET", f"/ui/api/trajectories/{local}/images/{name}", who)
        return resp.content, resp.headers.get("content-type", media_type(name))

    async def video(self, tid: str, who: Principal) -> Path:
        host, local = self._split(tid)
        resp = await self._call(host, "GET", f"/ui/api/trajectories/{local}/video.mp4", who, route=VIDEO_ROUTE)
        path = _temporary(".mp4")
        await run_in_threadpool(path.write_bytes, resp.content)
        return path


class _GivenUp(Exception):
    """Raised in an encoding thread whose request was given up."""


def _encode(store: TrajectoryStore, tid: str, path: Path, gone: threading.Event) -> None:
    """``export_mp4`` that stops (ffmpeg killed, nothing left) at its next progress once ``gone`` is set."""

    def progress(done: int, total: int) -> None:
        if gone.is_set():
            raise _GivenUp(tid)

    try:
        export_mp4(store, tid, path, progress=progress)
    finally:
        if gone.is_set():
            path.unlink(missing_ok=True)


def _temporary(suffix: str) -> Path:
    """A new empty file of this process's temporary folder (the caller removes it)."""
    fd, name = tempfile.mkstemp(prefix="osfleet-", suffix=suffix)
    os.close(fd)
    return Path(name)
