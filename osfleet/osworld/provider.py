"""desktop-env's provider and VM manager for osfleet: a ``DesktopEnv`` leases one replica and talks to it locally.

``OsfleetProvider`` follows ``desktop_env.providers.base.Provider``'s methods as ``DesktopEnv`` calls them
(``register`` makes it a virtual subclass; desktop-env is never imported here, so this module loads without it):

- ``start_emulator(path_to_vm, headless, os_type)``: lease a replica from the fleet (once; a later call while the
  lease is held does nothing) and start its protocol server on 127.0.0.1;
- ``get_ip_address(path_to_vm)``: ``"127.0.0.1:<server>:<chrome>:<vnc>:<vlc>"``, the form ``DesktopEnv`` reads
  the four ports from. Chrome's is a ``PortForward`` of the lease to the guest's 1337, where OSWorld's tasks start
  Chrome's DevTools (each connection a tunnel: Playwright's DevTools WebSocket included); VLC's is a relay of the
  guest's port 8080, request by request (``osfleet.osworld.guest_http``); VNC's is a loopback port held closed
  (``ClosedPort``): a connection to it is refused at once, never reaching a VNC server of the machine running
  the benchmark;
- ``revert_to_snapshot(path_to_vm, "init_state")``: reset the replica to its image's initial state (with less
  than ``renew_below_seconds`` left on the lease, or a lease the fleet took back, the replica is given back and
  the next ``start_emulator`` leases a fresh one); returns ``path_to_vm``, so ``DesktopEnv`` keeps it;
- ``stop_emulator(path_to_vm)``: stop the server, give the replica back (idempotent);
- ``save_state``: not served (osfleet's checkpoints would be its natural match; not wired yet).

``path_to_vm`` is the fleet's URL (``OsfleetVMManager.get_vm_path`` gives ``$OSFLEET_URL``); the fleet keeps the
register of who holds which replica, so the manager's bookkeeping methods have nothing to do.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from osfleet.client import Fleet, FleetError, LeaseError, NotFoundError
from osfleet.osworld.endpoints import Desktop, Endpoints
from osfleet.osworld.guest_http import GuestHttpRelay
from osfleet.osworld.server import LOOPBACK, ProtocolServer
from osfleet.osworld.settings import HarnessSettings

log = logging.getLogger(__name__)

# Chrome's DevTools port is forwarded through a tunnel of the lease (osfleet.client.forward); VLC's HTTP interface is
# relayed request by request (osfleet.osworld.guest_http); VNC is a loopback port held closed (the module's docstring).
# Chrome's DevTools in the guest: OSWorld's tasks launch Chrome with --remote-debugging-port=1337 (on the VM's
# loopback) and socat to expose it as 9222 outside the VM; a tunnel reaches the loopback itself, so 1337 directly.
CHROME_GUEST_PORT = 1337
VLC_GUEST_PORT = 8080  # the office image's VLC HTTP interface (golden_images/guest/osworld/vlcrc)
OSWORLD_SNAPSHOT = "init_state"  # DesktopEnv's default snapshot name: the image's initial state here
OS_TYPE = "Ubuntu"  # what osfleet's desktops are, as OSWorld names it


class LeasedDesktop(Desktop, Protocol):
    """A lease on a replica: ``osfleet.client.Session``'s methods the provider uses besides the endpoints'."""

    @property
    def expires_at(self) -> float: ...

    def reset(self, task: Any = None, **options: Any) -> Any: ...

    def release(self) -> None: ...

    def forward(self, guest_port: int, local_port: int = 0) -> Listening: ...


class Listening(Protocol):
    """A loopback port held for the lease (``osfleet.client.PortForward``)."""

    port: int

    def stop(self) -> None: ...


class FleetClient(Protocol):
    def lease(self, holder: str = ..., *, ttl: float | None = ..., wait: float = ...) -> LeasedDesktop: ...

    def close(self) -> None: ...


Connect = Callable[[str, str | None, str | None], FleetClient]


def connect(url: str, token: str | None, token_file: str | None) -> FleetClient:
    return Fleet(url, token, token_file=token_file)


class ClosedPort:
    """A loopback port bound and never listening: a connection to it is refused at once, and no other program
    can listen on it while it is held (the socket is bound without ``SO_REUSEADDR``)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((LOOPBACK, 0))
        self.port: int = self._sock.getsockname()[1]

    def stop(self) -> None:
        self._sock.close()


@dataclass
class _Held:
    """One leased replica with what was started for it."""

    session: LeasedDesktop
    endpoints: Endpoints
    server: ProtocolServer
    chrome: Listening
    vlc: GuestHttpRelay
    vnc: ClosedPort

    def close(self) -> None:
        for part in (self.server, self.chrome, self.vlc, self.vnc):
            part.stop()
        self.endpoints.recorder.close()
        try:
            self.session.release()
        except FleetError as exc:  # the lease ends with its TTL anyway
            log.warning("giving back replica %s failed (its lease runs out by itself): %s", self.session, exc)


class Registration:
    """What ``register`` set up: the settings, one client per fleet URL (shared by every ``DesktopEnv`` of the
    process), and the live providers (stopped at exit, so a runner that forgets ``close()`` leaks no replica)."""

    def __init__(self, settings: HarnessSettings, connect: Connect = connect) -> None:
        self.settings = settings
        self._connect = connect
        self._fleets: dict[str, FleetClient] = {}
        self._lock = threading.Lock()
        self.providers: weakref.WeakSet[OsfleetProvider] = weakref.WeakSet()

    def reconfigure(self, settings: HarnessSettings, connect: Connect) -> None:
        """New settings for the leases that follow; a fleet client already made keeps its token."""
        with self._lock:
            self.settings, self._connect = settings, connect

    def fleet(self, url: str) -> FleetClient:
        with self._lock:
            if url not in self._fleets:
                self._fleets[url] = self._connect(url, *self.settings.credentials())
            return self._fleets[url]

    def close(self) -> None:
        for provider in list(self.providers):
            provider.stop_emulator("")
        with self._lock:
            fleets, self._fleets = list(self._fleets.values()), {}
        for fleet in fleets:
            fleet.close()


class OsfleetVMManager:
    """desktop-env's ``VMManager`` for osfleet (see the module's docstring)."""

    checked_and_cleaned = True

    def __init__(self, registration: Registration) -> None:
        self._registration = registration

    def get_vm_path(self, os_type: str = OS_TYPE, region: str | None = None, **kwargs: Any) -> str:
        """The fleet's URL: ``path_to_vm`` of a ``DesktopEnv`` given none."""
        return self._registration.settings.fleet_url()

    def initialize_registry(self, **kwargs: Any) -> None:
        """Nothing to do: the fleet keeps the register of leases."""

    def add_vm(self, vm_path: str, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the fleet keeps the register of leases."""

    def delete_vm(self, vm_path: str, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the fleet keeps the register of leases."""

    def occupy_vm(self, vm_path: str, pid: int, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the fleet keeps the register of leases."""

    def check_and_clean(self, **kwargs: Any) -> None:
        """Nothing to do: a lease nobody gives back ends with its TTL."""

    def list_free_vms(self, **kwargs: Any) -> list[str]:
        """The fleet, not this process, knows its free replicas: none are listed here."""
        return []


class OsfleetProvider:
    """desktop-env's ``Provider`` for osfleet (see the module's docstring)."""

    def __init__(self, registration: Registration, region: str | None = None) -> None:
        self.region = region
        self._registration = registration
        self._lock = threading.Lock()
        self._held: _Held | None = None
        registration.providers.add(self)

    def __repr__(self) -> str:
        held = self._held
        return f"<OsfleetProvider {held.session if held else 'not leased'}>"

    @property
    def desktop(self) -> LeasedDesktop | None:
        """The leased replica's session, while there is one."""
        return self._held.session if self._held is not None else None

    def start_emulator(self, path_to_vm: str, headless: bool = True, os_type: str = OS_TYPE) -> None:
        if os_type.lower() != OS_TYPE.lower():
            raise ValueError(f"osfleet's desktops are {OS_TYPE}, not {os_type}")
        with self._lock:
            if self._held is None:
                self._held = self._lease(path_to_vm)

    def _lease(self, path_to_vm: str) -> _Held:
        settings = self._registration.settings
        fleet = self._registration.fleet(settings.fleet_url(path_to_vm))
        session = fleet.lease(settings.holder, ttl=settings.lease_seconds, wait=settings.lease_wait_seconds)
        started: list[Listening | ProtocolServer | GuestHttpRelay | ClosedPort] = []
        try:
            endpoints = Endpoints(session)
            server = ProtocolServer(endpoints).start()
            started.append(server)
            chrome = session.forward(CHROME_GUEST_PORT)
            started.append(chrome)
            vlc = GuestHttpRelay(endpoints.shell, VLC_GUEST_PORT).start()
            started.append(vlc)
            vnc = ClosedPort()
        except BaseException:
            for thing in reversed(started):
                thing.stop()
            session.release()
            raise
        log.info("leased %s; OSWorld's server for it on %s:%d", session, LOOPBACK, server.port)
        return _Held(session, endpoints, server, chrome, vlc, vnc)

    def get_ip_address(self, path_to_vm: str) -> str:
        held = self._held
        if held is None:
            raise RuntimeError("no replica is leased: DesktopEnv calls start_emulator first")
        return f"{LOOPBACK}:{held.server.port}:{held.chrome.port}:{held.vnc.port}:{held.vlc.port}"

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise NotImplementedError("saving a replica's state from desktop-env is not wired to osfleet's checkpoints")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        if snapshot_name != OSWORLD_SNAPSHOT:
            raise ValueError(
                f"osfleet resets a replica to its image's initial state ({OSWORLD_SNAPSHOT!r}), not {snapshot_name!r}"
            )
        with self._lock:
            held = self._held
            if held is None:
                return path_to_vm  # start_emulator leases one, freshly reset
            if held.session.expires_at - time.time() < self._registration.settings.renew_below_seconds:
                log.info("lease on %s ends soon: giving it back, the next start leases a new replica", held.session)
            else:
                try:
                    held.session.reset(observe=False)
                    return path_to_vm
                except (LeaseError, NotFoundError) as exc:
                    log.warning("replica %s is no longer leased (%s): the next start leases a new one", held, exc)
            self._held = None
        held.close()
        return path_to_vm

    def stop_emulator(self, path_to_vm: str, region: str | None = None, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            held.close()
