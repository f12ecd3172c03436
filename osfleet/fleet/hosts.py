"""The gateway's view of its hosts, rebuilt from the hosts themselves: health, samples, drains.

Each host is polled (``/health`` then ``/v1/host``) every ``POLL_SECONDS``. A host that fails
``FAILS_TO_DRAIN`` polls in a row, or refuses a connection during a proxied call, is drained: its episodes
end as 503 infrastructure with the reason, and nothing new goes to it. It rejoins on its first good poll.

Polls go over connections of their own (a second ``HostClient``), never the ones that carry clients' calls:
those are bounded per host (``hostclient.MAX_CONNECTIONS_PER_HOST``), and a tenant holding every one of them
with long-polls (a tunnel's receive waits up to 25 s) would make the polls wait for a connection past their
deadline, and a healthy host would be drained with every other tenant's episodes on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from osfleet.api.auth import ON_BEHALF_OF, VOUCHED_BY
from osfleet.api.errors import NotFound
from osfleet.errors import ConfigError, OsfleetError, first_problem
from osfleet.fleet.hostclient import HostCallError, HostCallTimeout, HostClient, HostConnectError, HostResponse
from osfleet.fleet.ids import HOST_NAME, host_key

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
POLL_TIMEOUT_SECONDS = 5.0
FAILS_TO_DRAIN = 2


class HostUnavailableError(OsfleetError):
    """The host that holds a replica is drained or did not answer: an infrastructure failure (503)."""


class HostNotReachedError(HostUnavailableError):
    """The call never reached the host (drained, or the connection was refused): another host may be tried."""


class HostTimeoutError(OsfleetError):
    """The host did not answer a proxied call within its deadline (503 infrastructure). It may have done what
    it was asked all the same: the call is not tried on another host."""


class HostEntry(BaseModel):
    """One host agent behind the gateway: its name in fleet ids, its URL, the token it expects and, for an
    ``https`` URL, the CA its certificate is verified against (default: the system's CAs)."""

    name: str = Field(pattern=HOST_NAME.pattern)
    url: str = Field(pattern=r"^https?://[^/\s]+$")
    token: str = Field(min_length=1)
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _ca_only_for_https(self) -> HostEntry:
        if self.ca_file is not None and not self.url.startswith("https://"):
            raise ValueError(f"ca_file is for https URLs; {self.url} is plain HTTP")
        return self


def load_hosts(path: Path) -> list[HostEntry]:
    """A hosts file: YAML or JSON list of {name, url, token | token_file, ca_file (https only, optional)}."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read hosts file {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"hosts file {path}: expected a non-empty list of hosts")
    entries = []
    for i, item in enumerate(raw):
        if isinstance(item, dict) and "token_file" in item and "token" not in item:
            try:
                item = {**item, "token": Path(item.pop("token_file")).read_text().strip()}
            except OSError as exc:
                raise ConfigError(f"hosts file {path}: host {i + 1}: {exc.strerror}: {exc.filename}") from None
        try:
            entries.append(HostEntry.model_validate(item))
        except ValidationError as exc:
            raise ConfigError(f"hosts file {path}: host {i + 1}: {first_problem(exc, 'host')}") from None
    check_unique(entries)
    return entries


def check_unique(entries: list[HostEntry]) -> None:
    names = [e.name for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"host names must be unique; repeated: {', '.join(dup)}")


@dataclass
class HostState:
    entry: HostEntry
    index: int
    healthy: bool = False
    reason: str = "not polled yet"
    sample: dict[str, Any] | None = None
    # Ready replicas by the last sample, less the leases this gateway was granted there since (None: no sample):
    # between two polls, leases go where a replica is left instead of asking full hosts first (``Gateway``).
    ready: int | None = None
    failures: int = 0
    drains: int = 0
    since: float = field(default_factory=time.time)
    # Why the host takes no work whatever its polls say, by source (e.g. Kubernetes: "pod", "node"); see
    # HostPool.hold. A host serves only with none.
    holds: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name


class HostPool:
    """The hosts, their state, and calls to them with deadlines."""

    def __init__(self, entries: list[HostEntry], client: HostClient, gateway: str, poll_client: HostClient) -> None:
        """``gateway``: this gateway's name on its hosts (``auth.gateway_id``), sent with every client it names;
        ``client`` carries the calls made for callers, ``poll_client`` the health polls: never the same
        connections (see the module's docstring)."""
        if poll_client is client:
            raise ValueError("health polls need a HostClient of their own, not the one of callers' calls")
        check_unique(entries)
        self.gateway = gateway
        self.hosts = [HostState(e, i) for i, e in enumerate(entries)]
        self._by_name = {h.name: h for h in self.hosts}
        self.version = 0  # counts changes of hosts and samples: what is computed from them is redone after one
        self._by_vm_key: dict[int, list[HostState]] = {}
        for h in self.hosts:
            self._keyed(h)
        self.client = client
        self.poll_client = poll_client
        for e in entries:
            for c in (client, self.poll_client):
                c.verify_with(e.url, e.ca_file)

    def get(self, name: str) -> HostState:
        host = self._by_name.get(name)
        if host is None:
            raise NotFound(f"no host {name} in this fleet")
        return host

    def by_vm_key(self, key: int) -> list[HostState]:
        """The hosts whose name gives OSGym vm ids this key (``ids.host_key``): one, or none, or more than one only
        for names whose hashes collide (about 1 in 10**10 per pair), which serve no OSGym vm (``ids``)."""
        return self._by_vm_key.get(key, [])

    def _keyed(self, host: HostState) -> None:
        same = self._by_vm_key.setdefault(host_key(host.name), [])
        same.append(host)
        if len(same) > 1:
            log.error("hosts %s give OSGym vm ids the same number: rename one", ", ".join(h.name for h in same))

    def healthy(self) -> list[HostState]:
        return [h for h in self.hosts if h.healthy]

    def known(self, name: str) -> bool:
        return name in self._by_name

    # --- hosts found at run time (osfleet.fleet.discovery) -----------------------------------------------------------
    def upsert(self, entry: HostEntry, tls_name: str | None = None) -> HostState:
        """Add a host found at run time, or move a known one to its new URL (its agent restarted elsewhere): the
        host keeps its name and position, so fleet ids naming it stay valid. A moved host serves again once polled."""
        host = self._by_name.get(entry.name)
        if host is None:
            host = HostState(entry, len(self.hosts))
            self.hosts.append(host)
            self._by_name[entry.name] = host
            self.version += 1
            self._keyed(host)
            log.warning("host %s joined at %s", entry.name, entry.url)
        elif host.entry.url != entry.url or host.entry.token != entry.token:
            log.warning("host %s moved to %s", entry.name, entry.url)
            host.entry = entry
            host.failures = 0
            self.drain(host, f"host {entry.name} moved to {entry.url}; not polled there yet")
        else:
            return host
        for c in (self.client, self.poll_client):
            c.verify_with(entry.url, entry.ca_file, tls_name)
        return host

    def hold(self, name: str, source: str, reason: str | None) -> None:
        """Take host ``name`` out of service for ``reason`` (``None``: lift ``source``'s hold). Held, it is drained
        and its polls do not bring it back; lifted, its next good poll does."""
        host = self._by_name.get(name)
        if host is None:
            return
        if reason is None:
            host.holds.pop(source, None)
            return
        host.holds[source] = reason
        self.drain(host, reason)

    # --- health ----------------------------------------------------------------------------------------------
    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(POLL_SECONDS)

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(h) for h in self.hosts))

    async def _poll(self, host: HostState) -> None:
        try:
            health = await self._get(host, "/health", auth=False)
            if health.status_code != 200:
                raise HostUnavailableError(f"health {health.status_code}: {health.text[:120]}")
            sample = await self._get(host, "/v1/host", auth=True)
            if sample.status_code != 200:
                raise HostUnavailableError(f"/v1/host answered {sample.status_code}")
            host.sample = sample.json()
            host.ready = _ready(host.sample)
            self.version += 1
        except (HostCallError, HostUnavailableError, ValueError) as exc:
            host.failures += 1
            if host.failures >= FAILS_TO_DRAIN:
                self.drain(host, f"host {host.name} is not answering its health checks ({_reason(exc)})")
            return
        host.failures = 0
        if host.holds:
            self.drain(host, "; ".join(host.holds.values()))
            return
        if not host.healthy:
            log.warning("host %s is healthy: it takes replicas and leases (again)", host.name)
            host.healthy, host.reason, host.since = True, "ok", time.time()

    async def _get(self, host: HostState, path: str, auth: bool) -> HostResponse:
        headers = {"Authorization": f"Bearer {host.entry.token}"} if auth else {}
        return await self.poll_client.get(host.entry.url + path, headers=headers, timeout=POLL_TIMEOUT_SECONDS)

    def drain(self, host: HostState, reason: str) -> None:
        if host.healthy:
            host.drains += 1
            log.warning("draining %s: %s", host.name, reason)
        host.healthy, host.reason, host.since = False, reason, time.time()

    # --- proxied calls ---------------------------------------------------------------------------------------
    async def call(
        self,
        host: HostState,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        timeout: float,
        client_id: str | None = None,
    ) -> HostResponse:
        """Call a host with its own token and a deadline, naming the client it is for (``client_id``). A
        drained host, a refused connection or a timeout is a 503 infrastructure error naming the host; a
        connection that failed also drains it. ``HostNotReachedError`` says that the host cannot have acted.
        ``content``: a body of bytes as they are (a file's: ``application/octet-stream``) instead of ``json``."""
        if not host.healthy:
            raise HostNotReachedError(f"{host.reason}; lease again")
        headers = {"Authorization": f"Bearer {host.entry.token}"}
        if client_id:
            headers[ON_BEHALF_OF] = client_id
            headers[VOUCHED_BY] = self.gateway
        try:
            return await self.client.request(
                method,
                host.entry.url + path,
                json=json,
                content=content,
                content_type="application/json" if content is None else "application/octet-stream",
                params=params,
                headers=headers,
                timeout=timeout,
            )
        except HostCallTimeout:
            raise HostTimeoutError(f"host {host.name} did not answer {method} {path} within {timeout:.0f} s") from None
        except HostCallError as exc:
            self.drain(host, f"host {host.name} is not answering ({_reason(exc)})")
            # no connection made (refused, unreachable, TLS refused): the host never saw the request
            unseen = isinstance(exc, HostConnectError)
            raise (HostNotReachedError if unseen else HostUnavailableError)(f"{host.reason}; lease again") from None


def _ready(sample: Any) -> int | None:
    """Ready replicas a host's ``/v1/host`` sample counts (None when it says nothing readable)."""
    try:
        return int(sample["replicas"]["ready"])
    except (KeyError, TypeError, ValueError):
        return None


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]
