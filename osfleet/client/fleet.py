"""``AsyncFleet``: an async client of a host agent or a fleet gateway (the same contract), and its sessions.

A session is one lease: reset it to a task, step it, observe, evaluate, fork, release. Leasing is a context
manager that always releases, whatever happens inside it, so a trainer's error path cannot leak a desktop;
if the process dies instead, the server takes the replica back when the lease's TTL runs out.

Many sessions share one ``AsyncFleet`` (one connection pool, one event loop): hundreds of episodes run
concurrently from one process. Each step gets an ``action_id`` (generated unless given) that is reused on
every retry, so a step the server already applied is replayed, never applied twice.

``group(task, n)`` gives n sessions on the same task from the very same running desktop, for GRPO-style
rollouts: one replica is reset to the task and forked n-1 ways (on a host agent or through a gateway).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, overload

from osfleet.client.errors import FleetError, InvalidRequestError, LeaseError, NotFoundError
from osfleet.client.transport import DEFAULT_TIMEOUT, RetryPolicy, Transport, Verify
from osfleet.client.types import (
    ActionLike,
    ResetResult,
    Screen,
    StepResult,
    TaskLike,
    actions_of,
    task_body,
)
from osfleet.protocol.models import (
    CheckpointView,
    FileWritten,
    ForkResponse,
    ImageFormat,
    LeaseResponse,
    Observation,
    ObservationPart,
    ReplicaView,
    ResetResponse,
    StepResponse,
    TunnelOpened,
)
from osfleet.protocol.tasks import Evaluation

TUNNEL_OPEN_TIMEOUT = 120.0  # a replica's first tunnel starts the guest's relay (python3 in a TCG guest)
TUNNEL_RECEIVE_SLACK = 30.0  # a receive's deadline beyond its wait

DEFAULT_LEASE_WAIT = 600.0  # seconds a lease waits for a free replica before CapacityError
RELEASE_TIMEOUT = 60.0


def read_token(token: str | None, token_file: str | Path | None) -> str:
    """The bearer token: given, else from ``token_file``, else ``$OSFLEET_API_TOKEN``."""
    if token:
        return token.strip()
    if token_file is not None:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as exc:
            raise InvalidRequestError(f"token file {token_file}: {exc.strerror}") from None
        if not text:
            raise InvalidRequestError(f"token file {token_file} is empty")
        return text
    env = os.environ.get("OSFLEET_API_TOKEN", "").strip()
    if env:
        return env
    raise InvalidRequestError("no token: pass token= or token_file=, or set OSFLEET_API_TOKEN")


class AsyncSession:
    """One leased replica. Use it as ``async with fleet.lease() as session:`` (released on exit)."""

    def __init__(self, fleet: AsyncFleet, lease: LeaseResponse, steps: int = 0) -> None:
        self.fleet = fleet
        self.replica_id = lease.replica_id
        self.lease_id = lease.lease_id
        self.expires_at = lease.expires_at
        self.task_id: str | None = None
        self.instruction: str | None = None
        self.steps = steps
        self.released = False

    def __repr__(self) -> str:
        return f"<AsyncSession {self.replica_id} lease {self.lease_id[:8]}{' released' if self.released else ''}>"

    @property
    def _path(self) -> str:
        return f"/v1/replicas/{self.replica_id}"

    def _live(self) -> None:
        if self.released:
            raise LeaseError(f"session on {self.replica_id} was released", status=409, kind="lease")

    async def reset(
        self,
        task: TaskLike | None = None,
        *,
        observe: bool = True,
        format: ImageFormat | None = None,
        quality: int | None = None,
        include: Sequence[ObservationPart] = (),
        timeout: float | None = None,
    ) -> ResetResult:
        """Back to the image's initial state, then the task's set-up (``task=None``: no task). ``include``: OSWorld's
        observation parts with the screen (``accessibility_tree``, ``terminal``, ``cursor``)."""
        self._live()
        body: dict[str, Any] = {"lease_id": self.lease_id, "observe": observe, **task_body(task)}
        body |= self.fleet._observe_options(format, quality, include)
        data = await self.fleet._t.call(
            "POST", f"{self._path}/reset", body, retry="idempotent", timeout=timeout, what=f"reset {self.replica_id}"
        )
        r = ResetResponse.model_validate(data)
        self.task_id, self.instruction, self.steps = r.task_id, r.instruction, 0
        return ResetResult(r.replica_id, r.generation, r.task_id, r.instruction, r.seconds, Screen.of(r.observation))

    async def step(
        self,
        actions: ActionLike | Sequence[ActionLike],
        *,
        action_id: str | None = None,
        observe: bool = True,
        format: ImageFormat | None = None,
        quality: int | None = None,
        include: Sequence[ObservationPart] = (),
        metadata: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> StepResult:
        """Apply a batch of actions once: retried with the same ``action_id`` on connection failures and 503s.
        Actions are osfleet's, or OSWorld's (``{"type": "pyautogui", "command": CODE}``, ``{"type": "computer_13",
        "action": {...}}``); ``include`` as for ``reset``."""
        self._live()
        body: dict[str, Any] = {
            "lease_id": self.lease_id,
            "action_id": action_id or uuid.uuid4().hex,
            "actions": [a.model_dump(mode="json", exclude_none=True) for a in actions_of(actions)],
            "observe": observe,
            **self.fleet._observe_options(format, quality, include),
        }
        if metadata is not None:
            body["metadata"] = metadata
        data = await self.fleet._t.call(
            "POST", f"{self._path}/step", body, retry="idempotent", timeout=timeout, what=f"step {self.replica_id}"
        )
        r = StepResponse.model_validate(data)
        if not r.replayed:
            self.steps += 1
        return StepResult(
            r.action_id, r.replayed, r.done, r.results, Screen.of(r.observation), [x for x in r.results if not x.ok]
        )

    async def observe(
        self,
        *,
        format: ImageFormat | None = None,
        quality: int | None = None,
        include: Sequence[ObservationPart] = (),
        timeout: float | None = None,
    ) -> Screen:
        """The screen now; ``include`` adds OSWorld's parts (``accessibility_tree``, ``terminal``, ``cursor``)."""
        self._live()
        opts = self.fleet._observe_options(format, quality)
        params: dict[str, Any] = {"lease_id": self.lease_id, "format": opts["observation_format"]}
        if "observation_quality" in opts:
            params["quality"] = opts["observation_quality"]
        if include:
            params["include"] = ",".join(include)
        data = await self.fleet._t.call(
            "GET",
            f"{self._path}/observation",
            params=params,
            retry="idempotent",
            timeout=timeout,
            what=f"observe {self.replica_id}",
        )
        screen = Screen.of(Observation.model_validate(data))
        assert screen is not None  # the route always sends the screenshot
        return screen

    async def cursor_position(self, *, timeout: float | None = None) -> tuple[int, int]:
        """Where the pointer is now, in screen pixels (a step with one ``cursor_position`` action)."""
        (out,) = (await self._act({"type": "cursor_position"}, timeout)).results
        if out.x is None or out.y is None:
            raise FleetError(f"cursor_position on {self.replica_id} answered no position")
        return out.x, out.y

    async def screenshot(
        self,
        *,
        region: tuple[int, int, int, int] | None = None,
        width: int | None = None,
        height: int | None = None,
        format: ImageFormat = "png",
        quality: int | None = None,
        timeout: float | None = None,
    ) -> Screen:
        """The screen, or its ``region`` (x0, y0, x1, y1: the pixels x0 <= x < x1, y0 <= y < y1), scaled to
        ``width`` x ``height`` when given (one of them: the other keeps the aspect ratio). The host crops and scales,
        so only the image asked for crosses the network (a step with one ``screenshot`` action). A region outside
        the screen raises ``InvalidActionError``."""
        action: dict[str, Any] = {"type": "screenshot", "format": format}
        for name, value in (("region", list(region) if region else None), ("width", width), ("height", height)):
            if value is not None:
                action[name] = value
        if quality is not None and format != "png":
            action["quality"] = quality
        (out,) = (await self._act(action, timeout)).results
        if out.content_base64 is None or out.width is None or out.height is None:
            raise FleetError(f"screenshot of {self.replica_id} answered no image")
        return Screen(base64.b64decode(out.content_base64), format, out.width, out.height, quality)

    async def _act(self, action: dict[str, Any], timeout: float | None) -> StepResult:
        """One action as a step without an observation; its failure in the guest raises ``FleetError``."""
        result = await self.step(action, observe=False, timeout=timeout)
        if result.failed:
            raise FleetError(f"{action['type']} on {self.replica_id} failed: {result.failed[0].error}")
        return result

    async def evaluate(self, *, timeout: float | None = None) -> Evaluation:
        """The task's reward now. An evaluation the infrastructure could not finish raises
        ``InfrastructureError``; it is never a reward of 0."""
        self._live()
        data = await self.fleet._t.call(
            "POST",
            f"{self._path}/evaluate",
            {"lease_id": self.lease_id},
            retry="idempotent",
            timeout=timeout,
            what=f"evaluate {self.replica_id}",
        )
        return Evaluation.model_validate(data)

    async def upload(self, path: str, data: bytes, *, timeout: float | None = None) -> int:
        """Write ``data`` to the file ``path`` in the desktop, as the desktop user (its folder is made, a file
        already there is replaced); returns the bytes written. ``path`` is absolute and normalised, under
        ``/home/user/`` or ``/tmp/``: any other raises ``ForbiddenError``, as does a file the user may not write.
        More than the server takes in one request (its ``--max-body-mib``) raises ``InvalidRequestError``."""
        self._live()
        limit = await self.fleet._max_body()
        if limit is not None and len(data) > limit:
            raise InvalidRequestError(
                f"upload {path}: {len(data)} bytes, over the server's limit of {limit} bytes (its --max-body-mib)",
                status=413,
                kind="too_large",
            )
        answer = await self.fleet._t.call(
            "PUT",
            f"{self._path}/files",
            params={"lease_id": self.lease_id, "path": path},
            content=bytes(data),
            retry="idempotent",  # the same bytes to the same path: sent again, the file is the same
            timeout=timeout,
            what=f"upload {path} to {self.replica_id}",
        )
        return FileWritten.model_validate(answer).bytes

    async def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """The file ``path`` of the desktop, read as the desktop user, whole. ``NotFoundError`` when there is no
        such file (or none the user can see); ``ForbiddenError`` for a path as ``upload`` refuses it or a file the
        user may not read; a file over the most a host reads from a guest (``osfleet.protocol.actions.MAX_READ_BYTES``,
        8 MiB) raises ``InvalidRequestError``, never comes back cut short."""
        self._live()
        data: bytes = await self.fleet._t.call(
            "GET",
            f"{self._path}/files",
            params={"lease_id": self.lease_id, "path": path},
            raw=True,
            retry="idempotent",
            timeout=timeout,
            what=f"download {path} from {self.replica_id}",
        )
        return data

    # --- tunnels: TCP connections to ports on the replica's own loopback (``Session.forward`` listens locally) ------
    async def open_tunnel(self, port: int, *, timeout: float | None = None) -> str:
        """Connect to ``port`` on the replica's loopback (its Chrome's DevTools, say) as the desktop user; returns
        the tunnel's id. ``ConflictError`` when nothing accepts the connection there."""
        self._live()
        data = await self.fleet._t.call(
            "POST",
            f"{self._path}/tunnels",
            {"lease_id": self.lease_id, "port": port},
            timeout=timeout or TUNNEL_OPEN_TIMEOUT,
            what=f"open a tunnel to port {port} of {self.replica_id}",
        )
        return TunnelOpened.model_validate(data).tunnel_id

    async def tunnel_send(self, tunnel_id: str, data: bytes, *, timeout: float | None = None) -> None:
        """Bytes into the tunnel (``NotFoundError`` once it is closed)."""
        await self.fleet._t.call(
            "PUT",
            f"{self._path}/tunnel",
            params={"lease_id": self.lease_id, "tunnel_id": tunnel_id},
            content=bytes(data),
            timeout=timeout,
            what=f"send into tunnel {tunnel_id}",
        )

    async def tunnel_receive(self, tunnel_id: str, *, wait: float = 20.0, timeout: float | None = None) -> bytes | None:
        """What came out of the tunnel, waiting up to ``wait`` seconds (b"" when nothing came); None once the
        connection is over and everything was read."""
        try:
            data: bytes = await self.fleet._t.call(
                "GET",
                f"{self._path}/tunnel",
                params={"lease_id": self.lease_id, "tunnel_id": tunnel_id, "wait": wait},
                raw=True,
                timeout=timeout or wait + TUNNEL_RECEIVE_SLACK,
                what=f"receive from tunnel {tunnel_id}",
            )
        except NotFoundError:
            return None
        return data

    async def close_tunnel(self, tunnel_id: str, *, timeout: float | None = None) -> None:
        """Close the tunnel (one closed already is no error)."""
        with contextlib.suppress(NotFoundError, LeaseError):
            await self.fleet._t.call(
                "DELETE",
                f"{self._path}/tunnel",
                params={"lease_id": self.lease_id, "tunnel_id": tunnel_id},
                timeout=timeout,
                what=f"close tunnel {tunnel_id}",
            )

    async def fork(self, children: int, *, timeout: float | None = None) -> list[AsyncSession]:
        """``children`` new sessions that start from this replica's current state (screen, memory, disk), each
        with its own lease, the task and the steps so far; this session goes on unchanged. ``QuotaError`` when the
        caller's saved forks and checkpoints fill its share of the host's fork budget (release forked sessions or
        delete a checkpoint), ``InvalidRequestError`` when one fork alone is larger than that share,
        ``ConflictError`` when this replica is a fork as deep as the host allows (fork its ancestor)."""
        self._live()
        if children < 1:
            raise InvalidRequestError(f"fork: children must be at least 1, not {children}")
        data = await self.fleet._t.call(
            "POST",
            f"{self._path}/fork",
            {"lease_id": self.lease_id, "children": children},
            retry="never",
            timeout=timeout or max(self.fleet._t.timeout, 60.0 + 15.0 * children),
            what=f"fork {self.replica_id}",
        )
        forked = ForkResponse.model_validate(data)
        out = []
        for c in forked.children:
            child = AsyncSession(
                self.fleet,
                LeaseResponse(replica_id=c.replica_id, lease_id=c.lease_id, expires_at=c.expires_at),
                steps=self.steps,
            )
            child.task_id, child.instruction = self.task_id, self.instruction
            out.append(child)
        return out

    async def checkpoint(self, name: str, *, timeout: float | None = None) -> CheckpointView:
        """Keep this replica's running state (memory and disk) under ``name``, the caller's own; this session goes
        on. Start replicas from it with ``fleet.lease(checkpoint=name)`` or ``fleet.from_checkpoint(name, n)``,
        until ``fleet.delete_checkpoint(name)``. ``QuotaError`` when the caller's quota or share on the host is full
        (delete a checkpoint first), ``InvalidRequestError`` when this one alone is larger than it."""
        self._live()
        data = await self.fleet._t.call(
            "POST",
            f"{self._path}/checkpoints",
            {"lease_id": self.lease_id, "name": name},
            retry="never",
            timeout=timeout or max(self.fleet._t.timeout, 120.0),
            what=f"checkpoint {self.replica_id} as {name!r}",
        )
        return CheckpointView.model_validate(data)

    async def release(self) -> None:
        """End the lease (idempotent: a lease that already ended is not an error here)."""
        if self.released:
            return
        self.released = True
        # expired, already released, or the replica was retired: nothing left to give back
        with contextlib.suppress(LeaseError, NotFoundError):
            await self.fleet._t.call(
                "POST",
                f"{self._path}/release",
                {"lease_id": self.lease_id},
                retry="idempotent",
                timeout=RELEASE_TIMEOUT,
                what=f"release {self.replica_id}",
            )

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.shield(self.release())


class _Leasing:
    """``await fleet.lease()`` gives a session; ``async with fleet.lease() as s`` also releases it."""

    def __init__(self, fleet: AsyncFleet, holder: str, ttl: float | None, wait: float, checkpoint: str | None) -> None:
        self._fleet, self._holder, self._ttl, self._wait = fleet, holder, ttl, wait
        self._checkpoint = checkpoint
        self._session: AsyncSession | None = None

    async def _get(self) -> AsyncSession:
        if self._checkpoint is not None:
            return (await self._fleet._from_checkpoint(self._checkpoint, 1, self._holder, self._ttl))[0]
        return await self._fleet._lease(self._holder, self._ttl, self._wait)

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._get().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._get()
        return self._session

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await asyncio.shield(self._session.release())


class AsyncGroup(Sequence[AsyncSession]):
    """n sessions that started from one running desktop (the first is the one that was reset and forked)."""

    def __init__(self, sessions: list[AsyncSession], screens: list[Screen | None], ready_seconds: float) -> None:
        self.sessions = sessions
        self.screens = screens
        self.ready_seconds = ready_seconds

    @overload
    def __getitem__(self, i: int) -> AsyncSession: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[AsyncSession]: ...
    def __getitem__(self, i: int | slice) -> AsyncSession | Sequence[AsyncSession]:
        return self.sessions[i]

    def __len__(self) -> int:
        return len(self.sessions)

    def __iter__(self) -> Iterator[AsyncSession]:
        return iter(self.sessions)

    async def release(self) -> None:
        """Release every session of the group (each one's failure is ignored, so all are tried)."""
        await asyncio.gather(*(s.release() for s in self.sessions), return_exceptions=True)

    async def __aenter__(self) -> AsyncGroup:
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.shield(self.release())


class AsyncFleet:
    """A host agent's or a gateway's API. ``url`` e.g. ``http://127.0.0.1:8080``; the token from ``token``,
    ``token_file`` or ``$OSFLEET_API_TOKEN``; ``https`` servers verified as ``verify`` says (``transport.Verify``:
    a CA file, or ``$OSFLEET_CA_FILE``, or the system's CAs)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        token_file: str | Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
        observation_format: ImageFormat = "png",
        observation_quality: int | None = None,
        verify: Verify = True,
    ) -> None:
        self._t = Transport(
            url,
            read_token(token, token_file),
            timeout=timeout,
            max_connections=max_connections,
            retry=retry,
            verify=verify,
        )
        self.url = self._t.url
        self.observation_format: ImageFormat = observation_format
        self.observation_quality = observation_quality
        self._body_limit: int | None = None
        self._body_limit_known = False

    def __repr__(self) -> str:
        return f"<AsyncFleet {self.url}>"

    async def _max_body(self) -> int | None:
        """The largest request body the server takes (its ``/health`` says, once asked; None if it does not).

        Why ask: a server refuses a larger body with 413 before reading it and closes the connection, and the
        unread bytes make the connection's end a reset that can swallow the 413; so an upload over the limit is
        refused here, with the figure, instead of ending as a connection failure."""
        if not self._body_limit_known:
            with contextlib.suppress(FleetError):  # not known now: the server's own 413 will do
                limit = (await self.health()).get("max_body_bytes")
                self._body_limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
                self._body_limit_known = True
        return self._body_limit

    def _observe_options(
        self, fmt: ImageFormat | None, quality: int | None, include: Sequence[ObservationPart] = ()
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"observation_format": fmt or self.observation_format}
        q = quality if quality is not None else self.observation_quality
        if q is not None and out["observation_format"] != "png":
            out["observation_quality"] = q
        if include:
            out["observation_include"] = list(include)
        return out

    async def _lease(self, holder: str, ttl: float | None, wait: float) -> AsyncSession:
        body: dict[str, Any] = {"holder": holder}
        if ttl is not None:
            body["ttl_seconds"] = ttl
        data = await self._t.call("POST", "/v1/leases", body, retry="refused", wait_capacity=wait, what="lease")
        return AsyncSession(self, LeaseResponse.model_validate(data))

    def lease(
        self,
        holder: str = "osfleet-client",
        *,
        ttl: float | None = None,
        wait: float = DEFAULT_LEASE_WAIT,
        checkpoint: str | None = None,
    ) -> _Leasing:
        """A ready replica, waiting up to ``wait`` seconds for one (then ``CapacityError``). ``ttl``: the lease's
        length in seconds (the server's default otherwise): a crashed client's replica comes back after it.
        ``checkpoint``: a new replica started at exactly that checkpoint's state instead (``NotFoundError`` for a
        name the caller does not keep)."""
        return _Leasing(self, holder, ttl, wait, checkpoint)

    async def _from_checkpoint(self, name: str, n: int, holder: str, ttl: float | None) -> list[AsyncSession]:
        body: dict[str, Any] = {"holder": holder, "checkpoint": name, "count": n}
        if ttl is not None:
            body["ttl_seconds"] = ttl
        data = await self._t.call(
            "POST",
            "/v1/leases",
            body,
            retry="never",  # each try would start replicas: a lost answer leaves them to their lease's end
            timeout=max(self._t.timeout, 60.0 + 15.0 * n),
            what=f"start {n} from checkpoint {name!r}",
        )
        answer = LeaseResponse.model_validate(data)
        sessions = [AsyncSession(self, LeaseResponse(**g.model_dump())) for g in answer.leases or [answer]]
        for s in sessions:
            s.task_id = answer.task_id
        return sessions

    async def from_checkpoint(
        self, name: str, n: int, *, holder: str = "osfleet-checkpoint", ttl: float | None = None
    ) -> AsyncGroup:
        """n sessions, each a new replica at exactly the checkpoint's state (its task too, so ``evaluate``
        works); released together with ``async with``."""
        if n < 1:
            raise InvalidRequestError(f"from_checkpoint: n must be at least 1, not {n}")
        start = time.monotonic()
        sessions = await self._from_checkpoint(name, n, holder, ttl)
        return AsyncGroup(sessions, [None] * len(sessions), time.monotonic() - start)

    async def checkpoints(self) -> list[CheckpointView]:
        """The caller's checkpoints (through a gateway: on every host, each naming its host)."""
        data = await self._t.call("GET", "/v1/checkpoints", retry="idempotent", what="list checkpoints")
        return [CheckpointView.model_validate(x) for x in data]

    async def delete_checkpoint(self, name: str) -> None:
        """Delete one of the caller's checkpoints (``NotFoundError`` for any other name)."""
        await self._t.call("DELETE", f"/v1/checkpoints/{name}", retry="idempotent", what=f"delete checkpoint {name!r}")

    async def group(
        self,
        task: TaskLike,
        n: int,
        *,
        holder: str = "osfleet-group",
        ttl: float | None = None,
        wait: float = DEFAULT_LEASE_WAIT,
        observe: bool = True,
        format: ImageFormat | None = None,
    ) -> AsyncGroup:
        """n sessions on ``task`` from the same running desktop (same windows, same clock second): one replica
        reset to the task, forked n-1 ways. Released together with ``async with``; on failure nothing is kept."""
        if n < 1:
            raise InvalidRequestError(f"group: n must be at least 1, not {n}")
        start = time.monotonic()
        first = await self._lease(holder, ttl, wait)
        sessions = [first]
        try:
            reset = await first.reset(task, observe=False)
            del reset
            if n > 1:
                sessions += await first.fork(n - 1)
            ready = time.monotonic() - start
            screens: list[Screen | None] = [None] * n
            if observe:
                screens = list(await asyncio.gather(*(s.observe(format=format) for s in sessions)))
            return AsyncGroup(sessions, screens, ready)
        except BaseException:
            await asyncio.shield(asyncio.gather(*(s.release() for s in sessions), return_exceptions=True))
            raise

    @asynccontextmanager
    async def episode(self, task: TaskLike, **lease_options: Any) -> AsyncIterator[tuple[AsyncSession, ResetResult]]:
        """Lease, reset to ``task``, and release at the end: the shape of one rollout."""
        async with self.lease(**lease_options) as session:
            yield session, await session.reset(task)

    async def replicas(self) -> list[ReplicaView]:
        """The replicas this client's token may see, with their state (a tenant's own; an operator's, all)."""
        data = await self._t.call("GET", "/v1/replicas", retry="idempotent", what="list replicas")
        return [ReplicaView.model_validate(x) for x in data]

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer: its ``status``; with this client's token also the largest request body it
        takes (an upload's bound), and with an operator's token more (a gateway's hosts and their state)."""
        data = await self._t.call("GET", "/health", retry="idempotent", what="health")
        return dict(data)

    async def aclose(self) -> None:
        """Close the connections (``async with`` does it on exit). Leases still held are not released: they
        expire on the server."""
        await self._t.aclose()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


__all__ = ["AsyncFleet", "AsyncGroup", "AsyncSession", "FleetError", "read_token"]
