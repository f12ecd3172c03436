"""The sandboxes ``osfleet e2b serve`` keeps: each one a lease of the fleet, taken with its client's own key.

An E2B client's key (``E2B_API_KEY``) is a client token of the fleet, so the fleet itself says who the client is
and what it may touch: a wrong key is refused by the fleet (401 here too), and a sandbox belongs to the key that
created it (any other key is told it does not exist: 404). The key is checked with the fleet once and remembered
for ``KEY_CHECK_SECONDS``; only its SHA-256 names its owner here.

A sandbox lives until it is killed or its E2B timeout passes (``set_timeout`` moves it); its lease lasts
``max_lifetime`` seconds from its start (osfleet leases are not extended), which bounds how far a timeout may reach,
as E2B bounds a sandbox's life. Pausing keeps the desktop's running state as a checkpoint of the fleet and gives
the replica back; resuming (``connect`` or ``resume``) starts a new replica from it. Everything lives in this
process: stopping the server releases every lease and deletes the checkpoints of paused sandboxes, and a server
that dies without that leaves them to the leases' ends (the checkpoints to the client, who sees them as its own).

The data plane is authorised by each sandbox's envd access token, a secret made at its start; a killed sandbox's
id and token hash are remembered (``ENDED_REMEMBERED``) so its client hears "not found" rather than "unauthorised".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from osfleet.client import AsyncFleet, AuthenticationError, FleetError, NotFoundError
from osfleet.client.fleet import AsyncSession
from osfleet.e2b.desktop_lines import DesktopState
from osfleet.e2b.errors import E2BError, from_fleet
from osfleet.e2b.processes import ProcessTable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300  # seconds a sandbox lives when its creation names no timeout (E2B's default)
DEFAULT_MAX_LIFETIME = 3600.0  # seconds a sandbox's lease lasts at most (E2B's limit for its Hobby tier)
DEFAULT_LEASE_WAIT = 50.0  # seconds a creation waits for a free desktop (the SDK's own request times out at 60)
KEY_CHECK_SECONDS = 60.0  # how long a key the fleet accepted is taken as valid without asking again
ENDED_REMEMBERED = 10000  # killed sandboxes whose clients are told "not found" rather than "unauthorised"
MAX_SANDBOXES_PER_KEY = 1000  # sandboxes one key may hold here at once
TEMPLATES = ("desktop", "base")  # the template names E2B's SDKs send by default: the fleet's desktop


def owner_of(key: str) -> str:
    """The name a key's things are kept under here: its SHA-256, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Sandbox:
    """One E2B sandbox: its lease (``session``, None while paused), its owner and what E2B's API reports of it."""

    id: str
    owner: str
    key: str
    template: str
    access_token: str
    started_at: float
    end_at: float
    lease_end: float
    metadata: dict[str, str]
    envs: dict[str, str]
    auto_pause: bool
    session: AsyncSession | None
    checkpoint: str | None = None
    killed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    desktop: DesktopState = field(default_factory=DesktopState)
    processes: ProcessTable = field(default_factory=ProcessTable)

    @property
    def paused(self) -> bool:
        return self.session is None

    def token_matches(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.access_token.encode())


class SandboxBook:
    """Every sandbox of this server, by id; one ``AsyncFleet`` per key (the client's own credentials)."""

    def __init__(
        self,
        url: str,
        *,
        max_lifetime: float = DEFAULT_MAX_LIFETIME,
        lease_wait: float = DEFAULT_LEASE_WAIT,
        verify: bool | str = True,
    ) -> None:
        self.url = url
        self.max_lifetime = max_lifetime
        self.lease_wait = lease_wait
        self.verify = verify
        self.sandboxes: dict[str, Sandbox] = {}
        self._fleets: dict[str, AsyncFleet] = {}
        self._keys_checked: dict[str, float] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # sandbox id -> its access token's SHA-256

    # --- who is asking ------------------------------------------------------------------------------------------
    def fleet(self, key: str) -> AsyncFleet:
        owner = owner_of(key)
        if owner not in self._fleets:
            self._fleets[owner] = AsyncFleet(self.url, token=key, verify=self.verify)
        return self._fleets[owner]

    async def check_key(self, key: str | None) -> str:
        """The owner of a key the fleet accepts; ``E2BError(401)`` for a missing or wrong one."""
        if not key:
            raise E2BError(401, "missing X-API-KEY: the key is a client token of the fleet")
        owner = owner_of(key)
        if self._keys_checked.get(owner, 0.0) > time.monotonic():
            return owner
        if any(s.owner == owner for s in self.sandboxes.values()):
            return owner
        fleet = AsyncFleet(self.url, token=key, verify=self.verify)
        try:
            await fleet.replicas()
        except AuthenticationError:
            raise E2BError(401, "the fleet refused this key (E2B_API_KEY is a client token of the fleet)") from None
        except FleetError as exc:
            raise from_fleet(exc) from None
        finally:
            await fleet.aclose()
        self._keys_checked[owner] = time.monotonic() + KEY_CHECK_SECONDS
        return owner

    async def get(self, key: str | None, sandbox_id: str) -> Sandbox:
        """The key's sandbox ``sandbox_id``; 404 for any other (another client's is not confirmed to exist)."""
        owner = await self.check_key(key)
        found = self.sandboxes.get(sandbox_id)
        if found is None or found.owner != owner:
            raise E2BError(404, f"sandbox {sandbox_id} was not found")
        return found

    def owned(self, owner: str) -> list[Sandbox]:
        return [s for s in self.sandboxes.values() if s.owner == owner]

    # --- the data plane's door ----------------------------------------------------------------------------------
    def for_envd(self, sandbox_id: str | None, token: str | None) -> Sandbox:
        """The running sandbox a daemon request is for, by its id and access token: 401 without the right token,
        502 "not found" for a sandbox of that token that was killed (what E2B's proxy answers), 502 while paused."""
        found = self.sandboxes.get(sandbox_id or "")
        if found is not None and found.token_matches(token):
            if found.paused:
                raise E2BError(502, f"sandbox {sandbox_id} is paused: connect to it to resume it")
            return found
        ended = self._ended.get(sandbox_id or "")
        if ended is not None and token and hmac.compare_digest(ended, hashlib.sha256(token.encode()).hexdigest()):
            raise E2BError(502, f"sandbox {sandbox_id} was not found")
        raise E2BError(401, "missing or wrong X-Access-Token for this sandbox")

    # --- life -----------------------------------------------------------------------------------------------------
    def _timeout(self, timeout: float | None, start: float) -> float:
        seconds = DEFAULT_TIMEOUT if timeout is None else timeout
        if seconds < 0:
            raise E2BError(400, f"timeout {seconds} s: must be 0 or more seconds")
        return start + seconds

    async def create(
        self,
        key: str | None,
        template: str,
        timeout: float | None,
        metadata: dict[str, str],
        envs: dict[str, str],
        auto_pause: bool,
    ) -> Sandbox:
        """A new sandbox: a lease of the fleet's desktop (``TEMPLATES``), or a new replica from one of the key's
        checkpoints (an E2B snapshot, named as the template)."""
        owner = await self.check_key(key)
        assert key is not None
        if len(self.owned(owner)) >= MAX_SANDBOXES_PER_KEY:
            raise E2BError(429, f"this key holds {MAX_SANDBOXES_PER_KEY} sandboxes here already: kill some first")
        now = time.time()
        end = self._timeout(timeout, now)
        if end - now > self.max_lifetime:
            limit = f"{self.max_lifetime:.0f} s"
            raise E2BError(400, f"timeout {end - now:.0f} s is over this server's --max-lifetime {limit}")
        sandbox_id = secrets.token_hex(10)
        fleet = self.fleet(key)
        try:
            if template in TEMPLATES:
                session = await fleet.lease(f"e2b:{sandbox_id}", ttl=self.max_lifetime, wait=self.lease_wait)
            else:
                session = await fleet.lease(f"e2b:{sandbox_id}", ttl=self.max_lifetime, checkpoint=template)
        except NotFoundError:
            raise E2BError(
                404,
                f"template {template!r} was not found (the fleet's desktop is one of "
                f"{', '.join(TEMPLATES)}; a snapshot of yours is named by its id)",
            ) from None
        except FleetError as exc:
            raise from_fleet(exc) from None
        sandbox = Sandbox(
            id=sandbox_id,
            owner=owner,
            key=key,
            template=template,
            access_token=secrets.token_urlsafe(24),
            started_at=now,
            end_at=end,
            lease_end=session.expires_at,
            metadata=metadata,
            envs=envs,
            auto_pause=auto_pause,
            session=session,
        )
        self.sandboxes[sandbox_id] = sandbox
        log.info("e2b: sandbox %s on replica %s", sandbox_id, session.replica_id)
        return sandbox

    async def kill(self, sandbox: Sandbox) -> None:
        """End the sandbox: its lease released (or, paused, its checkpoint deleted); its id answers 404 after."""
        async with sandbox.lock:
            if self.sandboxes.pop(sandbox.id, None) is None:
                return
            sandbox.killed = True
            self._ended[sandbox.id] = hashlib.sha256(sandbox.access_token.encode()).hexdigest()
            while len(self._ended) > ENDED_REMEMBERED:
                self._ended.popitem(last=False)
            session, sandbox.session = sandbox.session, None
            sandbox.processes.clear()  # their streams end
            if session is not None:
                with contextlib.suppress(FleetError):  # an ended lease: nothing left to give back
                    await session.release()
            if sandbox.checkpoint is not None:
                with contextlib.suppress(FleetError):
                    await self.fleet(sandbox.key).delete_checkpoint(sandbox.checkpoint)
                sandbox.checkpoint = None
        log.info("e2b: sandbox %s killed", sandbox.id)

    async def set_timeout(self, sandbox: Sandbox, timeout: float) -> None:
        """The sandbox ends ``timeout`` seconds from now (no later than its lease)."""
        async with sandbox.lock:
            end = self._timeout(timeout, time.time())
            if not sandbox.paused and end > sandbox.lease_end:
                raise E2BError(
                    400,
                    f"timeout {timeout} s reaches past this sandbox's lease, which ends in "
                    f"{max(0.0, sandbox.lease_end - time.time()):.0f} s (the server's --max-lifetime)",
                )
            sandbox.end_at = end

    async def pause(self, sandbox: Sandbox) -> bool:
        """Keep the desktop's running state as a checkpoint and give the replica back; False when paused already."""
        async with sandbox.lock:
            if sandbox.session is None:
                return False
            name = f"e2b-{sandbox.id}"
            try:
                await sandbox.session.checkpoint(name)
            except FleetError as exc:
                raise from_fleet(exc) from None
            sandbox.checkpoint = name
            session, sandbox.session = sandbox.session, None
            with contextlib.suppress(FleetError):
                await session.release()
            sandbox.processes.clear()
            log.info("e2b: sandbox %s paused as checkpoint %s", sandbox.id, name)
            return True

    async def resume(self, sandbox: Sandbox, timeout: float | None) -> bool:
        """A paused sandbox running again from its checkpoint (True), or the running one's timeout moved later
        (False; E2B's connect never shortens it)."""
        async with sandbox.lock:
            now = time.time()
            end = self._timeout(timeout, now)
            if sandbox.session is not None:
                if timeout is not None and end > sandbox.end_at:
                    sandbox.end_at = min(end, sandbox.lease_end)
                return False
            assert sandbox.checkpoint is not None
            if end - now > self.max_lifetime:
                raise E2BError(400, f"timeout {end - now:.0f} s is over this server's --max-lifetime")
            fleet = self.fleet(sandbox.key)
            try:
                session = await fleet.lease(f"e2b:{sandbox.id}", ttl=self.max_lifetime, checkpoint=sandbox.checkpoint)
            except FleetError as exc:
                raise from_fleet(exc) from None
            with contextlib.suppress(FleetError):
                await fleet.delete_checkpoint(sandbox.checkpoint)
            sandbox.session, sandbox.checkpoint = session, None
            sandbox.lease_end, sandbox.end_at = session.expires_at, end
            log.info("e2b: sandbox %s resumed on replica %s", sandbox.id, session.replica_id)
            return True

    async def fork(self, sandbox: Sandbox, count: int, timeout: float | None) -> list[Sandbox]:
        """``count`` new sandboxes from this one's running state (its desktop, memory and disk); it goes on."""
        async with sandbox.lock:
            if sandbox.session is None:
                raise E2BError(409, f"sandbox {sandbox.id} is paused: connect to it first")
            try:
                children = await sandbox.session.fork(count)
            except FleetError as exc:
                raise from_fleet(exc) from None
        now = time.time()
        made = []
        for child in children:
            twin = Sandbox(
                id=secrets.token_hex(10),
                owner=sandbox.owner,
                key=sandbox.key,
                template=sandbox.template,
                access_token=secrets.token_urlsafe(24),
                started_at=now,
                end_at=min(self._timeout(timeout, now), child.expires_at),
                lease_end=child.expires_at,
                metadata=dict(sandbox.metadata),
                envs=dict(sandbox.envs),
                auto_pause=sandbox.auto_pause,
                session=child,
            )
            self.sandboxes[twin.id] = twin
            made.append(twin)
        return made

    async def expire(self, now: float | None = None) -> list[str]:
        """End (or, with auto-pause, pause) every sandbox whose timeout has passed; their ids."""
        now = time.time() if now is None else now
        due = [s for s in list(self.sandboxes.values()) if s.end_at <= now and not (s.paused and s.auto_pause)]
        for sandbox in due:
            try:
                if sandbox.auto_pause and not sandbox.paused:
                    await self.pause(sandbox)
                else:
                    await self.kill(sandbox)
            except E2BError as exc:  # the pause failed: the sandbox ends instead of living on unbounded
                log.warning("e2b: sandbox %s: pausing at its timeout failed (%s); killing it", sandbox.id, exc)
                await self.kill(sandbox)
        return [s.id for s in due]

    async def close(self) -> None:
        """Kill every sandbox (leases released, checkpoints deleted) and close the connections."""
        for sandbox in list(self.sandboxes.values()):
            await self.kill(sandbox)
        for fleet in self._fleets.values():
            await fleet.aclose()
        self._fleets.clear()

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(list(self.sandboxes.values()))
