"""Liveness and readiness apart (``osfleet.api.probes``): a host that cannot serve leaves its Service, and is not
restarted in a loop; a probe needs no token and learns nothing but ``status``."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

OK = {"status": "ok"}
FAILING = {"status": "failing"}


def test_an_agent_whose_monitor_died_is_not_ready_but_alive(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path, ready=1)
    with TestClient(create_app(AgentConfig(token="t"), lambda: fake)) as agent:
        for path in ("/livez", "/readyz"):  # no token: a kubelet has none
            r = agent.get(path)
            assert (r.status_code, r.json()) == (200, OK)
        fake.alive = False  # its failure monitor or warm pool thread died: it cannot recover replicas
        r = agent.get("/readyz")
        assert (r.status_code, r.json()) == (503, FAILING)  # out of the Service ...
        r = agent.get("/livez")
        assert (r.status_code, r.json()) == (200, OK)  # ... but not restarted: the process answers
        assert agent.get("/health").status_code == 503  # /health, the gateway's poll, as before


def test_a_gateway_with_no_healthy_host_is_not_ready_but_alive() -> None:
    unreachable = HostEntry(name="gone", url="http://127.0.0.1:9", token="x")
    with TestClient(create_gateway("gw-token", [unreachable], osgym_allowed_ips=())) as gateway:
        r = gateway.get("/readyz")
        assert (r.status_code, r.json()) == (503, FAILING)
        r = gateway.get("/livez")
        assert (r.status_code, r.json()) == (200, OK)
        assert "gone" not in gateway.get("/readyz").text  # host names are the operator's to know
