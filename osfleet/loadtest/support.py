"""Shared pieces of the Locust scenarios in this package: options, the host sampler, trajectory records.

Imported by the locustfiles only (it imports locust). The sampler runs on the master (or the only
process) and polls the host agent's /v1/host, so disk use, replicas by state and host CPU/RAM are
measured under load and written beside Locust's own CSV files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import WorkerRunner

_lock = threading.Lock()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument("--token", default="", env_var="OSFLEET_API_TOKEN", help="host agent bearer token")
    parser.add_argument(
        "--run-dir",
        default="runs/locust",
        env_var="OSFLEET_RUN_DIR",
        help="where JSONL results and samples are written",
    )
    parser.add_argument(
        "--sample-seconds", type=float, default=2.0, env_var="OSFLEET_SAMPLE_SECONDS", help="host sampling interval"
    )
    parser.add_argument(
        "--ca-file",
        default="",
        env_var="OSFLEET_CA_FILE",
        help="for an https --host: verify it against this CA (PEM) instead of the system's CAs",
    )


def _options(env: Environment) -> Any:
    if env.parsed_options is None:
        raise RuntimeError("osfleet's Locust scenarios need Locust's parsed options")
    return env.parsed_options


def run_dir(env: Environment) -> Path:
    path = Path(_options(env).run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def headers(env: Environment) -> dict[str, str]:
    token = _options(env).token
    return {"Authorization": f"Bearer {token}"} if token else {}


def verify(env: Environment) -> str | bool:
    """What ``requests`` verifies an https host against: ``--ca-file`` alone when given, else the system's CAs
    (never nothing)."""
    ca_file = _options(env).ca_file
    if ca_file and not Path(ca_file).is_file():
        raise ValueError(f"--ca-file {ca_file}: no such file")
    return str(ca_file) if ca_file else True


def setup_user(user: Any) -> None:
    """What every scenario's user does first: verify an https host as ``verify`` says."""
    user.client.verify = verify(user.environment)


def why(response: Any, limit: int) -> str:
    """What a failed response says: its body, or the connection's error when there was no answer (status 0: a
    refused connection, a certificate not trusted)."""
    text = response.text or ""
    return (text or repr(response.error or "no answer"))[:limit]


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """One line per record, flushed at once: a crash loses at most the line being written."""
    line = json.dumps(record) + "\n"
    with _lock, open(path, "a") as f:
        f.write(line)
        f.flush()


@events.test_start.add_listener
def _start_sampler(environment: Environment, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner) or not environment.host:
        return
    out = run_dir(environment) / "samples.jsonl"
    client_headers = headers(environment)
    trust = verify(environment)

    def loop() -> None:
        import requests

        while True:
            try:
                r = requests.get(f"{environment.host}/v1/host", headers=client_headers, timeout=10, verify=trust)
                append_jsonl(out, r.json() if r.ok else {"time": time.time(), "error": f"HTTP {r.status_code}"})
            except requests.RequestException as exc:
                append_jsonl(out, {"time": time.time(), "error": str(exc)[:200]})
            gevent.sleep(_options(environment).sample_seconds)

    environment.osfleet_sampler = gevent.spawn(loop)  # type: ignore[attr-defined]


@events.test_stop.add_listener
def _stop_sampler(environment: Environment, **_: Any) -> None:
    sampler = getattr(environment, "osfleet_sampler", None)
    if sampler is not None:
        sampler.kill()


def process_tag() -> str:
    return f"{os.getpid()}"
