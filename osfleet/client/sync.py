"""``Fleet``: the blocking twin of ``AsyncFleet``, for scripts, notebooks and Gymnasium environments.

It does not re-implement anything: every call runs the async client's coroutine on an event loop of its own in
a daemon thread, so both twins share the same retry rules, error types and connection pool behaviour, and a
``Fleet`` may be used from several threads at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar, overload

from osfleet.client.fleet import DEFAULT_LEASE_WAIT, AsyncFleet, AsyncGroup, AsyncSession
from osfleet.client.forward import PortForward
from osfleet.client.transport import DEFAULT_TIMEOUT, RetryPolicy, Verify
from osfleet.client.types import ActionLike, ResetResult, Screen, StepResult, TaskLike
from osfleet.protocol.models import CheckpointView, ImageFormat, ObservationPart, ReplicaView
from osfleet.protocol.tasks import Evaluation

T = TypeVar("T")


class _Loop:
    """An event loop running in a daemon thread; ``run`` blocks the caller until a coroutine is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="osfleet-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("this Fleet is closed")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


class Session:
    """One leased replica (blocking). ``with fleet.lease() as session:`` releases it on exit."""

    def __init__(self, loop: _Loop, inner: AsyncSession) -> None:
        self._loop, self.inner = loop, inner

    def __repr__(self) -> str:
        return repr(self.inner).replace("AsyncSession", "Session")

    replica_id = property(lambda self: self.inner.replica_id)
    """The leased replica's id (it names its host: a gateway routes by it)."""
    lease_id = property(lambda self: self.inner.lease_id)
    """The lease's id; every call of this session carries it, and an expired or replaced lease cannot act."""
    expires_at = property(lambda self: self.inner.expires_at)
    """When the lease ends unless the session acts again (seconds since the epoch)."""
    task_id = property(lambda self: self.inner.task_id)
    """The task of the last ``reset`` (None before one, or after a reset without a task)."""
    instruction = property(lambda self: self.inner.instruction)
    """The task's instruction to the agent, from the last ``reset``."""
    steps = property(lambda self: self.inner.steps)
    """Steps applied since the last ``reset`` (a replayed retry does not count)."""
    released = property(lambda self: self.inner.released)
    """True once ``release`` ran (then every other call raises ``LeaseError``)."""

    def reset(self, task: TaskLike | None = None, **options: Any) -> ResetResult:
        """Back to the image's initial state, in milliseconds (a saved running desktop is resumed, not booted),
        then ``task``'s set-up: a built-in task id, a task, an OSWorld task or a task file (None: no task). The
        result has the task's instruction and, unless ``observe=False``, the first screen. ``options``: those of
        ``AsyncSession.reset`` (``observe``, ``format``, ``quality``, ``include``, ``timeout``)."""
        return self._loop.run(self.inner.reset(task, **options))

    def step(self, actions: ActionLike | Sequence[ActionLike], **options: Any) -> StepResult:
        """Apply one action or a batch, validated here first with the server's own models, and applied once: a
        retry after a lost answer carries the same ``action_id`` and gets the first answer back (``replayed``).
        ``options``: those of ``AsyncSession.step`` (``action_id``, ``observe``, ``format``, ``metadata``, ...)."""
        return self._loop.run(self.inner.step(actions, **options))

    def observe(
        self,
        *,
        format: ImageFormat | None = None,
        quality: int | None = None,
        include: Sequence[ObservationPart] = (),
        timeout: float | None = None,
    ) -> Screen:
        """The screen now; ``include`` adds OSWorld's parts (``accessibility_tree``, ``terminal``, ``cursor``)."""
        return self._loop.run(self.inner.observe(format=format, quality=quality, include=include, timeout=timeout))

    def cursor_position(self, *, timeout: float | None = None) -> tuple[int, int]:
        """Where the pointer is now, in screen pixels (``AsyncSession.cursor_position``)."""
        return self._loop.run(self.inner.cursor_position(timeout=timeout))

    def screenshot(
        self,
        *,
        region: tuple[int, int, int, int] | None = None,
        width: int | None = None,
        height: int | None = None,
        format: ImageFormat = "png",
        quality: int | None = None,
        timeout: float | None = None,
    ) -> Screen:
        """The screen or its ``region``, scaled as asked, by the host (``AsyncSession.screenshot``)."""
        shot = self.inner.screenshot(
            region=region, width=width, height=height, format=format, quality=quality, timeout=timeout
        )
        return self._loop.run(shot)

    def evaluate(self, *, timeout: float | None = None) -> Evaluation:
        """The task's reward now: the host reads what the checks need from the desktop and scores it in its
        evaluation sandbox, so nothing the agent did in the guest can change the score. An evaluation the
        infrastructure could not finish raises ``InfrastructureError``; it is never a reward of 0."""
        return self._loop.run(self.inner.evaluate(timeout=timeout))

    def upload(self, path: str, data: bytes, *, timeout: float | None = None) -> int:
        """Write ``data`` to ``path`` in the desktop as the desktop user (``AsyncSession.upload``)."""
        return self._loop.run(self.inner.upload(path, data, timeout=timeout))

    def download(self, path: str, *, timeout: float | None = None) -> bytes:
        """The file ``path`` of the desktop, read as the desktop user, whole (``AsyncSession.download``)."""
        return self._loop.run(self.inner.download(path, timeout=timeout))

    def open_tunnel(self, port: int, *, timeout: float | None = None) -> str:
        """A TCP connection to ``port`` on the replica's loopback (``AsyncSession.open_tunnel``)."""
        return self._loop.run(self.inner.open_tunnel(port, timeout=timeout))

    def tunnel_send(self, tunnel_id: str, data: bytes, *, timeout: float | None = None) -> None:
        """Bytes into the tunnel (``NotFoundError`` once it is closed; ``AsyncSession.tunnel_send``)."""
        self._loop.run(self.inner.tunnel_send(tunnel_id, data, timeout=timeout))

    def tunnel_receive(self, tunnel_id: str, *, wait: float = 20.0, timeout: float | None = None) -> bytes | None:
        """What came out of the tunnel within ``wait`` seconds (``b""``: nothing yet; None: the connection is over
        and everything was read; ``AsyncSession.tunnel_receive``)."""
        return self._loop.run(self.inner.tunnel_receive(tunnel_id, wait=wait, timeout=timeout))

    def close_tunnel(self, tunnel_id: str, *, timeout: float | None = None) -> None:
        """Close the tunnel (one closed already is no error)."""
        self._loop.run(self.inner.close_tunnel(tunnel_id, timeout=timeout))

    def forward(self, guest_port: int, local_port: int = 0) -> PortForward:
        """``127.0.0.1:<returned .port>`` here reaches ``guest_port`` on the replica's loopback (its Chrome's
        DevTools, say): each connection is a tunnel of this lease. ``stop()`` it (or use ``with``)."""
        self.inner._live()
        return PortForward(self, guest_port, local_port)

    def fork(self, children: int, *, timeout: float | None = None) -> list[Session]:
        """``children`` new sessions that start from this replica's current state (screen, memory, disk), each a
        replica of its own with its own lease, the task and the steps so far; this session goes on unchanged.
        For N rollouts of one task from the very same screen, ``Fleet.group`` does the reset and the fork."""
        return [Session(self._loop, s) for s in self._loop.run(self.inner.fork(children, timeout=timeout))]

    def checkpoint(self, name: str, *, timeout: float | None = None) -> CheckpointView:
        """Keep this replica's running state under ``name`` (the caller's own); this session goes on. Start
        replicas from it with ``Fleet.lease(checkpoint=name)`` or ``Fleet.from_checkpoint`` (``QuotaError`` when
        the caller's quota on the host is full)."""
        return self._loop.run(self.inner.checkpoint(name, timeout=timeout))

    def release(self) -> None:
        """End the lease and give the replica back to the pool (a lease that already ended is no error). A
        ``with`` block calls it on the way out, whatever happened inside."""
        self._loop.run(self.inner.release())

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Group(Sequence[Session]):
    """n sessions that started from one running desktop (``Fleet.group``: one replica reset to the task and forked
    n-1 ways; ``Fleet.from_checkpoint``: n replicas at a checkpoint's state). A sequence of ``Session``; its
    ``screens`` are their first screens and ``ready_seconds`` how long the group took to be ready. ``with
    fleet.group(task, n) as group:`` releases them all on exit."""

    def __init__(self, loop: _Loop, inner: AsyncGroup) -> None:
        self._loop, self.inner = loop, inner
        self.sessions = [Session(loop, s) for s in inner.sessions]
        self.screens = inner.screens
        self.ready_seconds = inner.ready_seconds

    @overload
    def __getitem__(self, i: int) -> Session: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Session]: ...
    def __getitem__(self, i: int | slice) -> Session | Sequence[Session]:
        return self.sessions[i]

    def __len__(self) -> int:
        return len(self.sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(self.sessions)

    def release(self) -> None:
        """Release every session of the group (each one's failure is ignored, so all are tried)."""
        self._loop.run(self.inner.release())

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Fleet:
    """The blocking client: ``Fleet(url, token)``, then ``with fleet.lease() as s: s.reset(task); s.step(...)``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        token_file: str | Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_connections: int = 64,
        observation_format: ImageFormat = "png",
        observation_quality: int | None = None,
        verify: Verify = True,
    ) -> None:
        self._loop = _Loop()
        try:
            self.inner = self._loop.run(
                _make(
                    url,
                    token,
                    token_file=token_file,
                    timeout=timeout,
                    retry=retry,
                    max_connections=max_connections,
                    observation_format=observation_format,
                    observation_quality=observation_quality,
                    verify=verify,
                )
            )
        except BaseException:
            self._loop.stop()
            raise
        self.url = self.inner.url

    def __repr__(self) -> str:
        return f"<Fleet {self.url}>"

    def lease(
        self,
        holder: str = "osfleet-client",
        *,
        ttl: float | None = None,
        wait: float = DEFAULT_LEASE_WAIT,
        checkpoint: str | None = None,
    ) -> Session:
        """A leased replica now (``checkpoint``: a new one at that checkpoint's state); use it in a ``with`` block
        to release it whatever happens."""
        leasing = self.inner.lease(holder, ttl=ttl, wait=wait, checkpoint=checkpoint)
        return Session(self._loop, self._loop.run(leasing._get()))

    def from_checkpoint(self, name: str, n: int, **options: Any) -> Group:
        """n sessions, each a new replica at exactly the checkpoint's state (its task too, so ``evaluate`` works).
        ``options``: ``holder``, ``ttl``."""
        return Group(self._loop, self._loop.run(self.inner.from_checkpoint(name, n, **options)))

    def checkpoints(self) -> list[CheckpointView]:
        """The caller's checkpoints (through a gateway: on every host, each naming its host)."""
        return self._loop.run(self.inner.checkpoints())

    def delete_checkpoint(self, name: str) -> None:
        """Delete one of the caller's checkpoints (``NotFoundError`` for any other name)."""
        self._loop.run(self.inner.delete_checkpoint(name))

    def group(self, task: TaskLike, n: int, **options: Any) -> Group:
        """n sessions on ``task`` from the same running desktop (same windows, same clock second), for a GRPO
        group: one replica reset to the task, then forked n-1 ways. On failure nothing is kept. ``options``:
        ``holder``, ``ttl``, ``wait``, ``observe``, ``format`` (``AsyncFleet.group``)."""
        return Group(self._loop, self._loop.run(self.inner.group(task, n, **options)))

    def replicas(self) -> list[ReplicaView]:
        """The replicas this client's token may see, with their state (a tenant's own; an operator's, all)."""
        return self._loop.run(self.inner.replicas())

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer: its ``status``; with this client's token also the largest request body it
        takes (an upload's bound), and with an operator's token more (a gateway's hosts and their state)."""
        return self._loop.run(self.inner.health())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the async client (e.g. ``fleet.inner.group(...)``) on this client's loop."""
        return self._loop.run(coro)

    def close(self) -> None:
        """Close the connections and stop this client's event loop thread (a ``with`` block does it on exit).
        Leases still held are not released: they expire on the server."""
        if self._loop.loop.is_running():
            self._loop.run(self.inner.aclose())
        self._loop.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


async def _make(url: str, token: str | None, **options: Any) -> AsyncFleet:
    """The async client is made on the loop's own thread, so its connection pool belongs to that loop."""
    return AsyncFleet(url, token, **options)
