"""One MCP session's desktop: a replica leased on first use, released when the session ends.

Why lazily: an MCP client lists tools (and may never call one) before it acts; a desktop is leased only when a
tool needs it. Why per session and not per server: two agents sharing one MCP server must never see each other's
screen. The lease has a TTL on the fleet's side, so a server that dies without releasing loses its desktop back
to the fleet when the TTL runs out; a lease that ran out (or that the fleet took back) is forgotten here, and the
next tool call leases a new desktop, saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from osfleet.client import AsyncFleet, AsyncSession, FleetError, LeaseError, NotFoundError
from osfleet.client.types import StepResult

log = logging.getLogger(__name__)

RELEASE_SECONDS = 60.0  # giving a desktop back when a session ends, however it ends


@dataclass(frozen=True)
class DeskOptions:
    holder: str = "osfleet-mcp"
    ttl: float | None = None  # seconds; the fleet's default when None
    wait: float = 300.0  # seconds a lease waits for a free replica


class LeaseLost(FleetError):
    """The desktop's lease ran out or the fleet took the replica back; the next call leases a new one."""


class Desk:
    """The desktop of one MCP session (see the module's docstring)."""

    def __init__(self, fleet: AsyncFleet, options: DeskOptions) -> None:
        self.fleet = fleet
        self.options = options
        self._session: AsyncSession | None = None
        self._lock = asyncio.Lock()
        self.leases = 0  # how many desktops this session has leased (more than one after a lease ran out)

    @property
    def session(self) -> AsyncSession | None:
        return self._session

    async def desktop(self) -> AsyncSession:
        """The session's leased desktop, leased now if it has none."""
        async with self._lock:
            if self._session is None:
                self._session = await self.fleet.lease(
                    self.options.holder, ttl=self.options.ttl, wait=self.options.wait
                )
                self.leases += 1
                log.info("MCP session leased %s", self._session.replica_id)
            return self._session

    async def step(self, actions: Sequence[dict[str, Any]], *, observe: bool = False) -> StepResult:
        """One step on the desktop; an action that failed in the guest is a ``FleetError`` with its reason."""
        result = await self.call(lambda s: s.step(list(actions), observe=observe))
        if result.failed:
            first = result.failed[0]
            raise FleetError(f"{first.type} failed: {first.error}", kind="action_failed")
        return result

    async def call(self, use: Any) -> Any:
        """``await use(session)`` on the desktop; a lease that ran out is forgotten and said so."""
        session = await self.desktop()
        try:
            return await use(session)
        except (LeaseError, NotFoundError) as exc:
            if exc.kind in ("lease", "not_found", None):
                await self._forget(session)
                raise LeaseLost(
                    f"{exc}; the desktop's lease ran out or the fleet took it back: the next call leases a new "
                    "desktop (reset it to a task first)",
                    status=exc.status,
                    kind="lease",
                ) from None
            raise

    async def _forget(self, session: AsyncSession) -> None:
        async with self._lock:
            if self._session is session:
                self._session = None
        session.released = True  # nothing to give back: the fleet has it already

    async def close(self) -> None:
        """Give the desktop back (the session ended): shielded, so a cancelled session still releases it."""
        session, self._session = self._session, None
        with anyio.move_on_after(RELEASE_SECONDS, shield=True) as scope:
            if session is not None:
                try:
                    await session.release()
                    log.info("MCP session released %s", session.replica_id)
                except FleetError as exc:  # the fleet keeps it until the lease's TTL: nothing else to do here
                    log.warning("could not release %s: %s", session.replica_id, exc)
            await self.fleet.aclose()
        if scope.cancelled_caught:
            log.warning("releasing the desktop took over %.0f s; its lease's TTL will end it", RELEASE_SECONDS)
