"""One contract: the host agent and the gateway publish the same operations, from one table, and the error
kinds mean the same on the server, the gateway and the client.

No replica is booted: the apps are built (their OpenAPI is made from the mounted routes) and compared.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from fastapi import Query
from fastapi.testclient import TestClient

from osfleet.api import errors as server_errors
from osfleet.api import probes
from osfleet.api.app import create_app
from osfleet.api.auth import Caller, Operator
from osfleet.api.contract import Routes
from osfleet.api.models import LeaseBody, ObservationQuery, StepRequest
from osfleet.api.operations import EVALUATE, OBSERVATION, OPERATIONS, RETIRE, Operation
from osfleet.client import errors as client_errors
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from osfleet.protocol.errors import KINDS, STATUS, kind_of
from tests.fakes import FakeHost

REPO = Path(__file__).resolve().parent.parent
TOKEN = "t" * 32


def _host_openapi() -> dict[str, Any]:
    return create_app(AgentConfig(token=TOKEN), lambda: FakeHost(Path("/nonexistent"))).openapi()


def _gateway_openapi() -> dict[str, Any]:
    return create_gateway(TOKEN, [HostEntry(name="h1", url="http://127.0.0.1:9", token=TOKEN)]).openapi()


def _operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m.upper(), p): op for p, ops in spec["paths"].items() for m, op in ops.items()}


def _schemas_used(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    """Every component schema an operation refers to, followed through nested references."""
    out: dict[str, Any] = {}
    todo = [operation]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in out:
                    out[name] = spec["components"]["schemas"][name]
                    todo.append(out[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return out


@pytest.mark.integration  # over a second: kept out of the unit tier's 2 minutes
def test_the_gateway_publishes_exactly_the_host_agents_operations() -> None:
    host, gateway = _host_openapi(), _gateway_openapi()
    host_ops, gateway_ops = _operations(host), _operations(gateway)
    table = {(op.method, op.path) for op in OPERATIONS}
    assert table <= set(host_ops) and table <= set(gateway_ops)
    # /health differs by design (a host's replicas, a gateway's hosts); the probes and /metrics are each app's own;
    # everything else is the table's
    meta = {("GET", "/health"), ("GET", "/metrics"), *(("GET", path) for path in probes.PATHS)}
    assert set(host_ops) - table == set(gateway_ops) - table == meta
    for key in sorted(table):
        assert gateway_ops[key] == host_ops[key], key
        assert _schemas_used(gateway, gateway_ops[key]) == _schemas_used(host, host_ops[key]), key


@pytest.mark.integration  # over a second: kept out of the unit tier's 2 minutes
def test_the_lease_id_bound_is_the_same_everywhere() -> None:
    """The drift that started this: a lease id of 400 characters on the gateway and 200 on the host."""
    for spec in (_host_openapi(), _gateway_openapi()):
        (param,) = [p for p in _operations(spec)[("GET", OBSERVATION.path)]["parameters"] if p["name"] == "lease_id"]
        assert param["schema"]["maxLength"] == 200
        assert spec["components"]["schemas"]["LeaseBody"]["properties"]["lease_id"]["maxLength"] == 200


@pytest.mark.unit
def test_a_handler_that_declares_what_the_table_does_not_is_refused() -> None:
    routes = Routes(OPERATIONS)

    def hand_written_query(rid: str, who: Caller, lease_id: str = Query(max_length=400)) -> None: ...

    with pytest.raises(RuntimeError, match="lease_id"):
        routes.mount(OBSERVATION, hand_written_query)

    def other_body(rid: str, req: StepRequest, who: Caller) -> None: ...

    with pytest.raises(RuntimeError, match="req"):
        routes.mount(EVALUATE, other_body)

    def wrong_caller(rid: str, req: LeaseBody, who: Operator) -> None: ...

    with pytest.raises(RuntimeError, match="who"):
        routes.mount(EVALUATE, wrong_caller)

    def no_caller(rid: str) -> None: ...

    with pytest.raises(RuntimeError, match="lacks: caller"):
        routes.mount(RETIRE, no_caller)

    def fine(rid: str, query: Annotated[ObservationQuery, Query()], who: Caller) -> None: ...

    routes.mount(OBSERVATION, fine)
    with pytest.raises(RuntimeError, match="two handlers"):
        routes.mount(OBSERVATION, fine)


@pytest.mark.unit
def test_a_server_missing_an_operation_does_not_start() -> None:
    extra = Operation("checkpoint", "POST", "/v1/replicas/{rid}/checkpoints", "save", body=LeaseBody)
    routes = Routes((*OPERATIONS[:1], extra))

    def lease(req: Any, who: Caller) -> None: ...

    with pytest.raises(RuntimeError, match="without a handler: lease, checkpoint"):
        routes.complete()


@pytest.mark.unit
def test_every_error_kind_has_one_status_and_one_client_exception() -> None:
    assert set(STATUS) == set(KINDS) == set(client_errors.BY_KIND)
    for kind, status in STATUS.items():
        err = client_errors.from_response(status, {"error": "x", "kind": kind}, "call")
        assert type(err) is client_errors.BY_KIND[kind] and err.status == status
    # a server exception's kind and status come from the same table
    for cls, kind in server_errors.KIND:
        assert kind in STATUS, cls
    assert server_errors.classify(server_errors.Forbidden("no")) == (403, "forbidden")


@pytest.mark.unit
def test_a_policy_refusal_is_forbidden_on_the_client_not_an_infrastructure_failure() -> None:
    err = client_errors.from_response(403, {"error": "a client may not run a root shell", "kind": "forbidden"}, "step")
    assert isinstance(err, client_errors.ForbiddenError)
    assert not isinstance(err, client_errors.InfrastructureError)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (409, {"kind": "busy"}, "busy"),
        (409, None, "lease"),  # no kind named: the status's usual one
        (404, {"kind": "capacity"}, "not_found"),  # a kind that does not fit its status is not believed
        (502, "<html>bad gateway</html>", "infrastructure"),  # a proxy in between
        (413, {"kind": "too_large"}, "too_large"),
    ],
)
def test_the_kind_of_an_answer(status: int, body: Any, kind: str) -> None:
    assert kind_of(status, body) == kind


@pytest.mark.unit
def test_a_hosts_refusal_relayed_by_the_gateway_keeps_its_kind_and_status() -> None:
    """The dashboard's gateway backend passes a host's answer on as it was (it mapped 403 and 409 by hand)."""
    for kind, status in STATUS.items():
        relayed = server_errors.relayed(status, {"error": "why", "kind": kind}, "h1")
        assert server_errors.classify(relayed) == (status, kind)
        assert str(relayed) == "h1: why"


@pytest.mark.unit
def test_a_whole_number_sent_as_a_float_is_that_integer_and_nothing_else_passes_for_one() -> None:
    """JSON Schema's integer takes 3867.0 (schemathesis sends it): a request model takes it as 3867, and stays
    strict about the rest."""
    from pydantic import ValidationError

    from osfleet.protocol.models import TunnelRequest

    assert TunnelRequest.model_validate({"lease_id": "l", "port": 3867.0}).port == 3867
    for bad in (3867.5, "3867", True):
        with pytest.raises(ValidationError, match="port"):
            TunnelRequest.model_validate({"lease_id": "l", "port": bad})


@pytest.mark.system
def test_the_protocol_imports_nothing_but_pydantic() -> None:
    """osfleet.protocol is what a client-only install relies on: it may not reach the server's modules."""
    code = (
        "import sys\n"
        "import osfleet.protocol.models, osfleet.protocol.errors, osfleet.protocol.tasks\n"
        "ours = sorted(m for m in sys.modules if m.startswith('osfleet') and not m.startswith('osfleet.protocol'))\n"
        "assert ours == ['osfleet'], ours\n"
        "third = {m.split('.')[0] for m in sys.modules} & {'fastapi', 'libvirt', 'yaml', 'PIL', 'httpx2', 'click'}\n"
        "assert not third, third\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.system
def test_the_client_imports_without_the_servers_packages() -> None:
    """osfleet.client, osfleet.gym and the message helpers with libvirt, FastAPI, Fabric, Pulumi, Locust (and the
    rest of the host's packages) made unimportable."""
    code = (
        "import sys, importlib.abc\n"
        "HOST = {'libvirt', 'fastapi', 'fabric', 'invoke', 'paramiko', 'pulumi', 'locust', 'uvicorn', 'starlette',\n"
        "        'prometheus_client', 'psutil', 'jinja2', 'wsproto'}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in HOST:\n"
        "            raise ModuleNotFoundError('blocked: ' + name, name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import osfleet.client, osfleet.client.messages, osfleet.gym\n"
        "from osfleet.client import Fleet, AsyncFleet\n"
        "from osfleet.cli import cli\n"
        "from click.testing import CliRunner\n"
        "r = CliRunner().invoke(cli, ['host', 'serve'])\n"
        "assert r.exit_code == 1 and \"pip install 'osfleet[host]'\" in r.stderr, (r.exit_code, r.stderr)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.unit
def test_the_gateway_answers_a_relayed_operation_with_fleet_ids() -> None:
    """A relayed operation goes to the host its fleet id names (here none answers: 503, kind infrastructure)."""
    with TestClient(create_gateway(TOKEN, [HostEntry(name="h1", url="http://127.0.0.1:9", token=TOKEN)])) as gw:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = gw.post("/v1/replicas/h1.r1/evaluate", json={"lease_id": "h1.l1"}, headers=auth)
        assert r.status_code == 503 and r.json()["kind"] == "infrastructure"
        r = gw.post("/v1/replicas/h1.r1/evaluate", json={"lease_id": "h2.l1"}, headers=auth)
        assert r.status_code == 409 and "does not hold a replica on host h1" in r.json()["error"]
        r = gw.post("/v1/replicas/h1.r1/evaluate", json={"lease_id": "x" * 201}, headers=auth)
        assert r.status_code == 422
