"""Fair shares per tenant: what one client may hold of a host at once, so that no client can take it all.

A host agent's resources are shared by its clients (``--clients-file``, and every client a gateway names). Each is
first come, first served unless bounded per client, and then one tenant's flood is every other tenant's loss: the
worker threads fill with its requests, its queued bodies fill the memory, its evaluations take every slot of the
evaluation jail (the next tenant's evaluation times out: an infrastructure failure that is not its own). So each
client gets a share, and what is past its share is refused to *it*, 429 with ``Retry-After`` and a JSON reason
(``kind: throttled``), before anything of the request is done or read:

- **requests in flight**: ``SPARE_REQUESTS`` plus ``REQUESTS_PER_LEASE`` for each replica the client holds (a
  trainer with many replicas steps them all at once; a client with none cannot fill the worker threads);
- **bodies being received**: at most ``BODY_SHARE`` times the server's body limit (``--max-body-mib``) declared by
  the client's requests in flight (a chunked body counts as the whole limit);
- **one body at a time per replica and client**: a request that carries a body to one of a replica's operations
  (step, reset, evaluate, fork, release, checkpoint, a file, a tunnel's opening) waits for the same client's
  earlier one on that replica *before its body is read*: the replica's lock would make it wait anyway, and a queue
  of waiting requests then holds their headers, never their bodies. The wait holds no worker thread. A tunnel's
  bytes (``PUT .../tunnel``) do not wait: they never take the replica's lock;
- **evaluations**: ``evaluation_slots`` at once (a share of the evaluation jail's workers, never fewer than one),
  counted around the evaluation itself.

What a client keeps on the host (saved forks and its checkpoints, counted together against the host-wide fork
budget; recordings) is bounded the same way by a share of each budget (``--client-share``, default
``osfleet.config.DEFAULT_CLIENT_SHARE``); past it the answer is the client's own 4xx with the reason
(``Ledger.keeping``, ``osfleet.replicas.quota``): 409 ``quota`` when what it keeps fills its share (it frees only
when the client releases or deletes), 413 for one larger than the whole share, 429 when only its own saves under way
are in the way. Never a 503 or a 507, which say the host is short of something, and never another client's loss
(``osfleet.recording.recorder`` drops the largest holder's recordings first).

The operator (the server's own token, with no client named) is not a tenant: its requests are not counted.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osfleet.api import auth, osgym_turn
from osfleet.api.auth import Principal
from osfleet.api.errors import LargerThanShare, SavesPending, ShareFull, Throttled
from osfleet.api.host import AgentHost
from osfleet.api.limits import content_length, refuse_too_large
from osfleet.config import DEFAULT_CLIENT_SHARE
from osfleet.replicas.errors import CapacityError
from osfleet.replicas.quota import Refusals, refuse_past
from osfleet.tasks.jail.sandbox import MAX_JOBS

SPARE_REQUESTS = 16  # a client's requests in flight whatever it holds (leases asked for, listings, its checkpoints)
REQUESTS_PER_LEASE = 4  # and per replica it holds: a step, an observation, a tunnel's send and receive
BODY_SHARE = 4  # a client's bodies being received: at most this many times the server's body limit
RETRY_AFTER_SECONDS = 1
EVALUATION_RETRY_AFTER_SECONDS = 5  # an evaluation takes seconds: sooner would only be refused again
DISK_RESERVE_SHARE = 20  # a fork or checkpoint leaves at least 1/N of its file systems free (replicas' overlays)
SHARE_REFUSALS = Refusals(full=ShareFull, too_large=LargerThanShare, pending=SavesPending)
LEASES_CACHE_SECONDS = 1.0  # how long a client's count of leases is reused (it is counted only past the spare)
# A replica's operations whose body waits for the same client's earlier request on that replica (not the tunnel's
# bytes: ``PUT /v1/replicas/{rid}/tunnel`` never takes the replica's lock).
ONE_AT_A_TIME = re.compile(r"^/v1/replicas/([^/]+)/(step|reset|evaluate|fork|release|checkpoints|files|tunnels)$")


def evaluation_slots(jail_workers: int = MAX_JOBS, share: float = DEFAULT_CLIENT_SHARE) -> int:
    """A client's evaluations at once: its share of the evaluation jail's workers, never fewer than one."""
    return max(1, int(jail_workers * share))


@dataclass(frozen=True)
class Shares:
    """One host's per-client bounds (the module's docstring): ``body_bytes``, a client's bodies being received;
    ``share``, the most of each host-wide budget one client may hold (``--client-share``)."""

    body_bytes: int
    share: float = DEFAULT_CLIENT_SHARE
    spare_requests: int = SPARE_REQUESTS
    requests_per_lease: int = REQUESTS_PER_LEASE
    evaluations: int = evaluation_slots()

    @classmethod
    def for_host(cls, max_body_bytes: int, share: float = DEFAULT_CLIENT_SHARE) -> Shares:
        return cls(body_bytes=BODY_SHARE * max_body_bytes, share=share, evaluations=evaluation_slots(share=share))


class Ledger:
    """What each client holds now: requests in flight, body bytes declared by them, evaluations under way, and the
    per-replica turns of its bodies. Requests are counted on the event loop, evaluations in worker threads: one
    lock for both (held for a few dictionary updates)."""

    def __init__(self, shares: Shares, leases_held: Callable[[str], int]) -> None:
        self.shares = shares
        self._leases_held = leases_held
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.body_bytes: Counter[str] = Counter()
        self.evaluations: Counter[str] = Counter()
        self._leases: dict[str, tuple[float, int]] = {}  # client -> (when counted, replicas it held)
        self._turns: dict[tuple[str, str], asyncio.Lock] = {}
        self._waiting: Counter[tuple[str, str]] = Counter()
        self.keeping_bytes: Counter[str] = Counter()  # forks and checkpoints being saved, by client

    def request_cap(self, client: str) -> int:
        """How many requests ``client`` may have in flight: the spare, and more for each replica it holds."""
        now = time.monotonic()
        seen = self._leases.get(client)
        if seen is None or now - seen[0] > LEASES_CACHE_SECONDS:
            seen = (now, self._leases_held(client))
            self._leases[client] = seen
        return self.shares.spare_requests + self.shares.requests_per_lease * seen[1]

    def admit(self, client: str, body_bytes: int) -> None:
        """Count a request of ``client`` in, or ``Throttled`` when it is past its share (nothing counted)."""
        with self._lock:
            held = self.requests[client]
            if held >= self.shares.spare_requests:  # the lease count is only needed past the spare
                cap = self.request_cap(client)
                if held >= cap:
                    raise Throttled(
                        f"this client has {held} requests in flight on this host, its share with the replicas it "
                        f"holds ({cap}): wait for some to end"
                    )
            bodies = self.body_bytes[client]
            if body_bytes and bodies + body_bytes > self.shares.body_bytes:
                raise Throttled(
                    f"this client's requests in flight carry {bodies} bytes of bodies; {body_bytes} more would pass "
                    f"its share of {self.shares.body_bytes} bytes: wait for some to end"
                )
            self.requests[client] += 1
            self.body_bytes[client] += body_bytes

    def done(self, client: str, body_bytes: int) -> None:
        with self._lock:
            self.requests[client] -= 1
            self.body_bytes[client] -= body_bytes
            if self.requests[client] <= 0:
                del self.requests[client]
                self.body_bytes.pop(client, None)

    @contextmanager
    def evaluating(self, who: Principal) -> Iterator[None]:
        """Hold one of ``who``'s evaluation slots for the evaluation inside (``Throttled`` when all are held)."""
        if who.operator:
            yield
            return
        with self._lock:
            if self.evaluations[who.name] >= self.shares.evaluations:
                raise Throttled(
                    f"this client has {self.evaluations[who.name]} evaluation(s) under way on this host, its share "
                    f"of the evaluation jail ({self.shares.evaluations}): retry when one has ended",
                    retry_after=EVALUATION_RETRY_AFTER_SECONDS,
                )
            self.evaluations[who.name] += 1
        try:
            yield
        finally:
            with self._lock:
                self.evaluations[who.name] -= 1
                if self.evaluations[who.name] <= 0:
                    del self.evaluations[who.name]

    @contextmanager
    def turn(self, key: tuple[str, str]) -> Iterator[asyncio.Lock]:
        """The lock of one (client, replica), kept while anyone waits for it or holds it (event loop only)."""
        lock = self._turns.get(key)
        if lock is None:
            lock = self._turns[key] = asyncio.Lock()
        self._waiting[key] += 1
        try:
            yield lock
        finally:
            self._waiting[key] -= 1
            if self._waiting[key] <= 0:
                del self._waiting[key]
                del self._turns[key]

    @contextmanager
    def keeping(self, host: AgentHost, who: Principal, new_bytes: int) -> Iterator[None]:
        """Room for one more saved fork or checkpoint of ``who`` (about ``new_bytes``), held while it is saved. Past
        the client's share of the host's fork budget (its forks and checkpoints counted together, with those being
        saved) it is refused as its own excess (``osfleet.replicas.quota``): 409 ``quota`` when what it keeps fills
        the share, 413 when this one alone is larger than the share, 429 when only its own saves under way make it
        not fit. 503 ``capacity`` when the host's disk or memory file system would keep less than
        1/``DISK_RESERVE_SHARE`` free (that is no client's excess)."""
        leave_free(host, new_bytes)
        if who.operator:
            yield
            return
        cap = int(host.settings.fork_max_bytes * self.shares.share)
        held = kept_bytes(host, who.name)
        with self._lock:
            refuse_past(
                held,
                self.keeping_bytes[who.name],
                new_bytes,
                cap,
                SHARE_REFUSALS,
                holding="this client's saved forks and checkpoints",
                limit=f"its share of the host's fork budget ({cap >> 20} MiB)",
                remedy="release forked replicas or delete a checkpoint first",
            )
            self.keeping_bytes[who.name] += new_bytes
        try:
            yield
        finally:
            with self._lock:
                self.keeping_bytes[who.name] -= new_bytes
                if self.keeping_bytes[who.name] <= 0:
                    del self.keeping_bytes[who.name]

    def snapshot(self) -> dict[str, dict[str, int]]:
        """What each client holds now, by resource (``/metrics``' ``osfleet_client_in_use``)."""
        with self._lock:
            return {
                "requests": dict(self.requests),
                "body_bytes": dict(self.body_bytes),
                "evaluations": dict(self.evaluations),
                "keeping_bytes": dict(self.keeping_bytes),
            }


def kept_bytes(host: AgentHost, owner: str) -> int:
    """What ``owner`` keeps on the host: its checkpoints (as recorded when saved), and the saved forks its leased
    replicas run on that none of its checkpoints keeps (each fork once)."""
    records = host.replicas()
    checkpoints = host.checkpoints.list(owner)
    mine: set[str] = set()
    root = host.settings.forks_dir
    for rec in records:
        if rec.lease is not None and rec.lease.owner == owner:
            mine |= {Path(p).parent.name for p in rec.layers if Path(p).parent.parent == root}
    mine -= {c.fork_id for c in checkpoints}
    forks = sum(f.disk_bytes + f.memory_bytes for f in host.fork_states() if f.id in mine)
    return forks + sum(c.bytes for c in checkpoints)


def leave_free(host: AgentHost, new_bytes: int) -> None:
    """``CapacityError`` (503) when ``new_bytes`` more on the forks' disk, or in the memory folder (tmpfs: RAM),
    would leave it less than 1/``DISK_RESERVE_SHARE`` free: replicas' overlays and RAM live there too."""
    folders = [host.settings.forks_dir]
    if host.settings.memory_dir is not None:
        folders.append(host.settings.memory_dir)
    for folder in folders:
        where = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if where is None:
            continue
        usage = shutil.disk_usage(where)
        if usage.free - new_bytes < usage.total // DISK_RESERVE_SHARE:
            raise CapacityError(
                f"{where} has {usage.free >> 20} MiB free; saving ~{new_bytes >> 20} MiB more would leave less than "
                f"1/{DISK_RESERVE_SHARE} of it for the replicas: release forked replicas or checkpoints, or retry later"
            )


class Admission:
    """ASGI middleware inside ``AuthBeforeBody``: counts each client's requests in, refuses what is past its share
    (429, the body unread), and makes a body for a replica wait for its client's previous one there (OSGym's step
    too, its body bounded and read first: ``osgym_turn``)."""

    def __init__(
        self,
        app: ASGIApp,
        ledger: Callable[[], Ledger | None],
        max_body_bytes: Callable[[], int],
        vm_replica: osgym_turn.VmReplica | None = None,
    ) -> None:
        self.app = app
        self.ledger = ledger
        self.max_body_bytes = max_body_bytes
        self.vm_replica = vm_replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ledger = self.ledger() if scope["type"] == "http" else None
        who = _client(scope) if ledger is not None else None
        if ledger is None or who is None:
            await self.app(scope, receive, send)
            return
        body = _declared_body(scope, self.max_body_bytes())
        try:
            ledger.admit(who.name, body)
        except Throttled as exc:
            await refuse(send, exc, body_unread=body > 0)
            return
        try:
            if body and scope["method"] == "POST" and scope["path"] == osgym_turn.PATH and self.vm_replica:
                await self._osgym_step(ledger, who, scope, receive, send)
                return
            match = ONE_AT_A_TIME.match(scope["path"]) if body else None
            if match is None or scope["method"] not in ("POST", "PUT", "DELETE"):
                await self.app(scope, receive, send)
                return
            with ledger.turn((who.name, match.group(1))) as turn:
                async with turn:
                    await self.app(scope, receive, send)
        finally:
            ledger.done(who.name, body)

    async def _osgym_step(self, ledger: Ledger, who: Principal, scope: Scope, receive: Receive, send: Send) -> None:
        """OSGym's step: its body bounded and read, then its vm's replica's turn taken (``osgym_turn``). A chunked
        body is read up to the bound (its declared size for the ledger is the server's limit, not its own)."""
        assert self.vm_replica is not None
        declared = content_length(scope)
        if declared is not None and declared > osgym_turn.MAX_STEP_BODY:
            await refuse_too_large(send, osgym_turn.too_large(declared))
            return
        read = await osgym_turn.read_bounded(receive)
        if read is None:
            await refuse_too_large(send, osgym_turn.too_large(None))
            return
        data, messages = read
        replayed = osgym_turn.replaying(messages, receive)
        rid = osgym_turn.replica_of(data, who, self.vm_replica)
        if rid is None:  # not parsed, or not the caller's vm: its route answers at once
            await self.app(scope, replayed, send)
            return
        with ledger.turn((who.name, rid)) as turn:
            async with turn:
                await self.app(scope, replayed, send)


def _client(scope: Scope) -> Principal | None:
    """The request's tenant (on OSGym's endpoints, an address of the OSGym allow-list is one too); None for the
    operator, and for a caller not known (its route answers 401)."""
    conn = HTTPConnection(scope)
    who = auth.principal_if_any(conn)
    if who is None and scope["path"] in auth.OSGYM_PATHS:
        who = auth.osgym_address_principal(conn)
    return None if who is None or who.operator else who


def _declared_body(scope: Scope, limit: int) -> int:
    """The bytes the request says it carries (a chunked one: the whole limit, the most it may send)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(0, min(int(value), limit))
            except ValueError:
                return limit
        if name == b"transfer-encoding":
            return limit
    return 0


async def refuse(send: Send, exc: Throttled, body_unread: bool) -> None:
    """429 with ``Retry-After`` and the reason; a body left unread ends the connection with the answer."""
    body = json.dumps({"error": str(exc), "kind": "throttled"}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(exc.retry_after).encode()),
    ]
    if body_unread:
        headers.append((b"connection", b"close"))
    start: Message = {"type": "http.response.start", "status": 429, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
