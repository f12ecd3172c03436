"""Running osfleet's Locust scenarios (shipped in ``osfleet.loadtest``) headless against a host agent, results
into a run directory, and a local host agent to run them against (the main job's)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.loadtest import locustfile
from osfleet.replicas.records import RecordStore

AGENT_START_TIMEOUT_SECONDS = 120.0


def _get(url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, Any]:
    """GET ``url``: (status, parsed JSON body); a refused or failed connection raises ``OSError``."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalAgent:
    """``osfleet host serve`` on a free loopback port, with a fresh token; stopped with ``stop()``."""

    def __init__(self, warm: int, log: Path, image: str | None = None) -> None:
        self.settings = Settings.from_env()
        self.before = _replica_ids(self.settings)
        self.image = image
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_urlsafe(24)
        cmd = [sys.executable, "-m", "osfleet", "host", "serve", "--port", str(self.port), "--warm", str(warm)]
        if image:
            cmd += ["--image", image]
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, "OSFLEET_API_TOKEN": self.token}, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + AGENT_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                raise OsfleetError(f"host agent exited with {self.proc.returncode}; see {log}")
            try:
                if _get(f"{self.url}/health", timeout=2)[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise OsfleetError(f"host agent did not answer within {AGENT_START_TIMEOUT_SECONDS:.0f} s; see {log}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def wait_ready(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, reps = _get(f"{self.url}/v1/replicas", headers=self.headers, timeout=10)
            if status != 200:
                raise OsfleetError(f"the host agent answered HTTP {status} to GET /v1/replicas; see {self.log.name}")
            if sum(r["state"] == "ready" for r in reps) >= count:
                return
            time.sleep(0.5)
        raise OsfleetError(f"the host agent's warm pool did not reach {count} ready replicas in {timeout:.0f} s")

    def stop(self) -> None:
        """Stop the agent, then retire the replicas made since it started (its warm pool would refill
        any retired while it runs; replicas outlive an agent by design, so they go after it stops)."""
        try:
            self._stop_process()
        finally:
            made = sorted(_replica_ids(self.settings) - self.before)
            if made:
                from osfleet.replicas.manager import ReplicaHost
                from osfleet.vm.images import find_image

                with ReplicaHost(find_image(self.image, self.settings), self.settings, auto_recover=False) as host:
                    host.adopt()
                    host.down([r for r in made if r in {x.id for x in host.replicas()}])

    def _stop_process(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()


@contextmanager
def local_agent(warm: int, log: Path, image: str | None = None) -> Iterator[LocalAgent]:
    agent = LocalAgent(warm, log, image)
    try:
        yield agent
    finally:
        agent.stop()


def run_locust(
    scenario: str,
    url: str,
    token: str,
    run_dir: Path,
    users: int,
    run_time: str,
    extra: list[str] | None = None,
    spawn_rate: float = 1.0,
) -> int:
    """Run the Locust scenario ``scenario`` headless; Locust's CSV files and log land in ``run_dir``."""
    if importlib.util.find_spec("locust") is None:
        raise OsfleetError("the load tests need Locust: install osfleet[loadtest]")
    try:
        path = locustfile(scenario)
    except ValueError as exc:
        raise OsfleetError(str(exc)) from None
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(path),
        "--headless",
        "--host",
        url,
        "-u",
        str(users),
        "-r",
        str(spawn_rate),
        "-t",
        run_time,
        "--csv",
        str(run_dir / scenario),
        "--csv-full-history",
        "--exit-code-on-error",
        "0",
        "--stop-timeout",
        "120",
        "--run-dir",
        str(run_dir),
        *(extra or []),
    ]
    log = run_dir / f"{scenario}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env={**os.environ, "OSFLEET_API_TOKEN": token}, stdout=f, stderr=subprocess.STDOUT)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=150)
            raise
    if code != 0:
        raise OsfleetError(f"Locust {scenario} exited with {code}; see {log}")
    return code


def _replica_ids(settings: Settings) -> set[str]:
    records, _ = RecordStore(settings.replicas_dir).load_all()
    return {r.id for r in records}
