"""A stand-in for a guest's bash under ``osfleet e2b serve``'s commands: it reads the launching and following steps
(``osfleet.e2b.guest_commands``) and answers their frames from a script of what each command prints, so the
server, the fleet's real host agent and E2B's real SDK run without a VM. What it cannot be is the real bash running
those scripts: tests/test_e2b_scripts.py runs them with bash, tests/test_e2b_vm.py in a real guest."""

from __future__ import annotations

import base64
import itertools
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from osfleet.api.app import create_app as create_agent_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.e2b.app import create_app as create_e2b_app
from osfleet.e2b.guest_commands import MAX_CHUNK
from osfleet.e2b.sandboxes import SandboxBook
from tests.scripted_guest import SCREEN, DesktopHost, ScriptedGuest
from tests.test_fleet import free_port

LAUNCH = re.compile(r"mkdir /tmp/\.osfleet-e2b/(\w+) && printf %s (\S*) \| base64 -d >\S+/cmd && printf %s (\S*) \|")
CWD = re.compile(r"printf %s (\S*) \| base64 -d >\S+/cwd")
FOLLOW = re.compile(r"^d=/tmp/\.osfleet-e2b/(\w+)\no=(\d+)\ne=(\d+)\n", re.M)
KILL = re.compile(r"kill -s (\w+) -- -(\d+)$")
REMOVE = re.compile(r"rm -rf -- /tmp/\.osfleet-e2b/(\w+)$")


@dataclass
class Look:
    """What a command has printed (all of it so far) and its exit status (None: running) at one look."""

    out: bytes = b""
    err: bytes = b""
    status: int | None = 0


@dataclass
class Launched:
    command: str
    env: str
    cwd: str
    nonce: str
    pid: int
    looks: list[Look]
    seen: int = 0
    killed: int | None = None

    def now(self) -> Look:
        look = self.looks[min(self.seen, len(self.looks) - 1)]
        if self.killed is not None:
            return Look(look.out, look.err, self.killed)
        return look


@dataclass
class E2BGuest(ScriptedGuest):
    """``programs``: a command's looks in order (the launch sees the first, each following step the next, the last
    one stays); a command not in it ends at once with status 0 and no output."""

    programs: dict[str, list[Look]] = field(default_factory=dict)
    launched: list[Launched] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def __post_init__(self) -> None:
        super().__init__({}, SCREEN)

    def by_nonce(self, nonce: str) -> Launched:
        return next(x for x in self.launched if x.nonce == nonce)

    def guest_exec(self, domain: str, argv: list[str], timeout: float) -> tuple[int, str, str]:
        command = argv[-1]
        self.commands.append(command)
        self.log.append(command)
        inner = shlex.split(command)[-1] if "/bin/bash -c" in command else command
        if m := LAUNCH.search(inner):
            nonce, cmd, env = m.group(1), base64.b64decode(m.group(2)).decode(), base64.b64decode(m.group(3)).decode()
            cwd = base64.b64decode(CWD.search(inner).group(1)).decode()  # type: ignore[union-attr]
            looks = self.programs.get(cmd, [Look()])
            self.launched.append(Launched(cmd, env, cwd, nonce, next(self._pids), looks))
            return 0, self._frame(self.launched[-1], 0, 0), ""
        if m := FOLLOW.search(inner):
            running = self.by_nonce(m.group(1))
            running.seen += 1
            return 0, self._frame(running, int(m.group(2)), int(m.group(3))), ""
        if m := KILL.search(command):
            running = next((x for x in self.launched if x.pid == int(m.group(2))), None)
            if running is None or running.now().status is not None:
                return 1, "", "no such process\n"
            running.killed = 128 + (9 if m.group(1) == "KILL" else 15)
            return 0, "", ""
        if m := REMOVE.search(command):
            self.removed.append(m.group(1))
            return 0, "", ""
        return super().guest_exec(domain, argv, timeout)

    @staticmethod
    def _frame(running: Launched, out: int, err: int) -> str:
        look = running.now()
        status = "-" if look.status is None else str(look.status)
        chunks = [
            base64.b64encode(data[start : start + MAX_CHUNK]).decode()
            for data, start in ((look.out, out), (look.err, err))
        ]
        return f"osfleet-e2b {running.pid} {status} {len(look.out)} {len(look.err)}\n{chunks[0]}\n{chunks[1]}\n"


# --- the stack the SDK is pointed at: a real host agent over the stand-in guest, and osfleet e2b serve ---------------
OPERATOR = "operator-token-e2b-0123456789"
ALICE = "alice-token-e2b-0123456789"
BOB = "bob-token-e2b-0123456789ab"


class Served:
    """A host agent (uvicorn, loopback) with clients alice and bob over a ``DesktopHost`` whose guest is an
    ``E2BGuest``, and ``osfleet e2b serve``'s app over it: ``url`` is what E2B_API_URL and E2B_SANDBOX_URL name."""

    def __init__(self, home: Path, max_lifetime: float = 3600.0, ready: int = 2) -> None:
        self.guest = E2BGuest()
        self.host = DesktopHost(home / "host", ready=ready, guest=self.guest)
        (home / "clients").write_text(f"alice {ALICE}\nbob {BOB}\n")
        config = AgentConfig(token=OPERATOR, clients=load_clients(home / "clients", OPERATOR))
        self.agent = ThreadServer(create_agent_app(config, lambda: self.host))
        self.fleet_url = self.agent.url
        self.book = SandboxBook(self.fleet_url, max_lifetime=max_lifetime, lease_wait=5.0)
        self.e2b = ThreadServer(create_e2b_app(self.book))
        self.url = self.e2b.url

    def leased(self) -> list[str]:
        """The replicas leased now (the host's own view)."""
        return [r.id for r in self.host.replicas() if r.lease is not None]

    def stop(self) -> None:
        self.e2b.stop()
        self.agent.stop()


class ThreadServer:
    """An ASGI app served by uvicorn in a thread (its lifespan run), on ``port`` of ``host`` (a free one of
    127.0.0.1 by default)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
