"""Simulated host agents for ``osfleet bench gateway``: many hosts speaking the host agent's HTTP contract for what
a gateway relays through an episode (health, sample, lease, step, release), all in one process of their own, so
that the gateway in front of them is what is measured, not the hosts.

Each host is a real HTTP/1.1 server on a loopback port of its own (h11, connections kept alive), holding replicas
and leases as a host agent does: a lease takes a ready replica (503 ``capacity`` when none is left), a step is
accepted only with the host's operator token, for a lease that holds that replica, made for the same client
(``X-Osfleet-Client`` vouched for by ``X-Osfleet-Gateway``), and each step is counted by (replica, action id).
A request that reaches a host that does not hold its replica or lease is answered as a host agent answers it
(404, 409) and counted as misrouted: the bench checks that the gateway routed every lease right, not only that
it was fast.

The hosts run in a child process (``SimHosts``), so their CPU is not the bench's or the gateway's; the parent
asks it for their ports at start and for their tallies at the end, over a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import multiprocessing
import re
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

import h11

from osfleet.api.auth import ON_BEHALF_OF, VOUCHED_BY
from osfleet.errors import OsfleetError

START_SECONDS = 60.0
STOP_SECONDS = 10.0
REPLICA_BYTES = 48 * 2**20  # what a sample says each replica takes (a parked desktop, as measured on this project)
MACHINE = {"cpus": 64, "cpu_busy_share": 0.05, "memory_total_bytes": 512 * 2**30}  # a metal host's shape
_STEP = re.compile(r"^/v1/replicas/([^/]+)/(step|release)$")


@dataclass(frozen=True)
class HostSpec:
    """One simulated host: its name in fleet ids, the operator token it expects, how many replicas it holds."""

    name: str
    token: str
    replicas: int


@dataclass
class Tally:
    """What one host saw; summed over hosts by ``SimHosts.tallies``."""

    health: int = 0
    samples: int = 0
    leases: int = 0
    leases_refused: int = 0  # no ready replica left: the gateway asked the wrong host
    steps: int = 0
    duplicate_steps: int = 0  # the same (replica, action id) twice: a retry applied again
    releases: int = 0
    misrouted: int = 0  # a replica or lease this host does not hold, or another client's
    unauthorized: int = 0


@dataclass
class _Host:
    spec: HostSpec
    ready: list[str] = field(default_factory=list)
    leases: dict[str, tuple[str, str]] = field(default_factory=dict)  # lease id -> (replica id, owner)
    applied: set[tuple[str, str]] = field(default_factory=set)
    tally: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        self.ready = [f"r-{uuid.uuid4().hex[:8]}" for _ in range(self.spec.replicas)]

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) for one request, as a host agent would give it."""
        if method == "GET" and path == "/health":
            self.tally.health += 1
            return 200, {"status": "ok"}
        if headers.get("authorization") != f"Bearer {self.spec.token}":
            self.tally.unauthorized += 1
            return 401, {"detail": "missing or wrong bearer token"}
        owner = headers.get(ON_BEHALF_OF.lower(), "")
        if owner:
            owner = f"{headers.get(VOUCHED_BY.lower(), '')}/{owner}"
        if method == "GET" and path == "/v1/host":
            self.tally.samples += 1
            return 200, self.sample()
        if method == "POST" and path == "/v1/leases":
            return self.lease(owner)
        m = _STEP.match(path)
        if method == "POST" and m is not None:
            try:
                request = json.loads(body)
                lease_id = str(request["lease_id"])
            except (ValueError, KeyError, TypeError):
                return 422, {"detail": "a JSON body with lease_id"}
            held = self.leases.get(lease_id)
            if held is None or held[0] != m.group(1) or held[1] != owner:
                self.tally.misrouted += 1
                return (404, {"detail": f"no replica {m.group(1)}"}) if held is None else (409, {"detail": "lease"})
            if m.group(2) == "release":
                del self.leases[lease_id]
                self.ready.append(held[0])
                self.tally.releases += 1
                return 200, {"replica_id": held[0], "released": True}
            return self.step(held[0], request)
        return 404, {"detail": f"no route {method} {path}"}

    def sample(self) -> dict[str, Any]:
        n = self.spec.replicas
        used = MACHINE["memory_total_bytes"] // 8 + n * REPLICA_BYTES
        return {
            "time": time.time(),
            "capacity": {"max_replicas": n, "replicas": n, "rss_bytes_per_replica": REPLICA_BYTES},
            "replicas": {"ready": len(self.ready), "leased": len(self.leases)},
            **MACHINE,
            "memory_used_bytes": used,
        }

    def lease(self, owner: str) -> tuple[int, dict[str, Any]]:
        if not self.ready:
            self.tally.leases_refused += 1
            return 503, {"kind": "capacity", "detail": "no ready replica to lease"}
        rid = self.ready.pop()
        lease_id = uuid.uuid4().hex
        self.leases[lease_id] = (rid, owner)
        self.tally.leases += 1
        return 201, {"replica_id": rid, "lease_id": lease_id, "expires_at": time.time() + 600}

    def step(self, rid: str, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        action_id = str(request.get("action_id"))
        replayed = (rid, action_id) in self.applied
        if replayed:
            self.tally.duplicate_steps += 1
        else:
            self.applied.add((rid, action_id))
            self.tally.steps += 1
        results = [{"type": str(a.get("type")), "ok": True, "seconds": 0.0} for a in request.get("actions") or []]
        return 200, {"action_id": action_id, "replayed": replayed, "done": False, "results": results,
                     "observation": None}  # fmt: skip


class _Connection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection to a simulated host."""

    def __init__(self, host: _Host) -> None:
        self.host = host
        self.http = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.http.receive_data(data)
        self._events()

    def eof_received(self) -> bool | None:
        self.http.receive_data(b"")
        self._events()
        return None

    def _events(self) -> None:
        assert self.transport is not None
        while True:
            try:
                event = self.http.next_event()
            except h11.RemoteProtocolError:
                self.transport.close()
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.request, self.body = event, []
            elif isinstance(event, h11.Data):
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._answer()
                if self.http.our_state is h11.MUST_CLOSE or self.http.their_state is h11.MUST_CLOSE:
                    self.transport.close()
                    return
                self.http.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                self.transport.close()
                return

    def _answer(self) -> None:
        assert self.request is not None and self.transport is not None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.request.headers}
        path = self.request.target.decode("latin-1").split("?", 1)[0]
        status, answer = self.host.answer(self.request.method.decode(), path, headers, b"".join(self.body))
        data = json.dumps(answer, separators=(",", ":")).encode()
        head = h11.Response(
            status_code=status, headers=[("content-type", "application/json"), ("content-length", str(len(data)))]
        )
        self.transport.write(
            self.http.send(head) + self.http.send(h11.Data(data=data)) + self.http.send(h11.EndOfMessage())
        )


async def _serve(specs: list[HostSpec], conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    hosts = [_Host(s) for s in specs]
    servers = []
    for host in hosts:
        servers.append(await loop.create_server(functools.partial(_Connection, host), "127.0.0.1", 0, backlog=1024))
    conn.send([s.sockets[0].getsockname()[1] for s in servers])
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command == "tally":
            conn.send({h.spec.name: h.tally.__dict__ for h in hosts})
        else:  # "stop"
            break
    for s in servers:
        s.close()


def serve_hosts(specs: list[HostSpec], conn: Connection) -> None:
    """The child process: serve every host until told to stop (or until the parent's end of the pipe closes)."""
    with contextlib.suppress(EOFError, KeyboardInterrupt, BrokenPipeError):
        asyncio.run(_serve(specs, conn))


class SimHosts:
    """``with SimHosts(specs) as hosts:`` -> ``hosts.urls`` (one per spec, in order), ``hosts.tallies()``,
    ``hosts.pid``. Leaving the block stops the child process, however the block ends."""

    def __init__(self, specs: list[HostSpec]) -> None:
        self.specs = specs
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no thread or loop of the bench's inherited
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=serve_hosts, args=(specs, child), name="osfleet-sim-hosts", daemon=True)
        self.urls: list[str] = []

    @property
    def pid(self) -> int:
        if self._proc.pid is None:
            raise OsfleetError("the simulated hosts are not running")
        return self._proc.pid

    def __enter__(self) -> SimHosts:
        self._proc.start()
        try:
            if not self._conn.poll(START_SECONDS):
                raise OsfleetError(f"the simulated hosts did not start within {START_SECONDS:.0f} s")
            ports = self._conn.recv()
        except BaseException:
            self._stop()
            raise
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop()

    def tallies(self) -> dict[str, dict[str, int]]:
        """Each host's ``Tally`` as a dict, by host name."""
        self._conn.send("tally")
        if not self._conn.poll(STOP_SECONDS):
            raise OsfleetError("the simulated hosts did not answer for their tallies")
        tallies: dict[str, dict[str, int]] = self._conn.recv()
        return tallies

    def _stop(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError):  # the child is gone already
                self._conn.send("stop")
            self._proc.join(STOP_SECONDS)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(STOP_SECONDS)
        self._conn.close()


def total(tallies: dict[str, dict[str, int]]) -> dict[str, int]:
    """Every host's tally summed."""
    out: dict[str, int] = {}
    for t in tallies.values():
        for k, v in t.items():
            out[k] = out.get(k, 0) + v
    return out
