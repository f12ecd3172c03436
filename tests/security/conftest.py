"""Fixtures the red-team tests share: the evaluation sandbox, and the real host agent's app over a test host."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.tasks.jail.sandbox import Limits, Sandbox


@pytest.fixture(scope="module")
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One sandbox for a test file, under its module's ``LIMITS`` (else the defaults, 40 s of wall time)."""
    sandbox = Sandbox(getattr(request.module, "LIMITS", Limits(wall_seconds=40)))
    sandbox.start()
    yield sandbox
    sandbox.close()


Serve = Callable[[Any, str, dict[str, str]], TestClient]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """``serve(host, operator_token, {client: token})``: the host agent's app (``create_app``) over ``host``, with
    those tokens; closed after the test."""
    with contextlib.ExitStack() as stack:

        def make(host: Any, operator: str, clients: dict[str, str]) -> TestClient:
            listed = tmp_path / "clients"
            listed.write_text("".join(f"{name} {token}\n" for name, token in clients.items()))
            config = AgentConfig(token=operator, warm=0, clients=load_clients(listed, operator))
            return stack.enter_context(TestClient(create_app(config, lambda: host)))

        yield make
