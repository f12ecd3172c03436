"""The API's fake host answers as the real one does where the API's tests rely on it (``osfleet.api.host``).

mypy holds both to ``AgentHost`` (their members and signatures); what a type cannot say, the rule a call
follows, is shared code (``registry.usable``) and checked here on the fake: it once lost the failed and
recovering states, so a failed replica stepped through the fake where the real host answers 503.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from osfleet.replicas.records import State
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

TOKEN = "protocol-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("broken", [State.FAILED, State.RECOVERING])
def test_a_failed_replica_of_the_fake_is_an_infrastructure_failure_as_on_a_real_host(
    tmp_path: Path, broken: State
) -> None:
    fake = FakeHost(tmp_path, ready=1)
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake)) as client:
        lease = client.post("/v1/leases", json={"holder": "t"}, headers=AUTH).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        with fake.registry.locked(rid) as rec:  # what the monitor does when QEMU dies
            rec.move(State.FAILED, error="QEMU process is gone")
            if broken == State.RECOVERING:
                rec.move(State.RECOVERING)
        step = {"lease_id": lid, "action_id": "a1", "actions": [{"type": "wait", "seconds": 0}], "observe": False}
        r = client.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH)
        assert (r.status_code, r.json()["kind"]) == (503, "infrastructure"), r.text
        assert r.json()["error"].startswith(f"replica {rid} failed (") and "it is being rebuilt" in r.json()["error"]
        assert fake.applied == []  # nothing reached the guest
