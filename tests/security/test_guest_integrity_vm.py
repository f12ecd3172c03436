"""Red team on a real replica: an agent (a client's token, acting as the desktop user) plants code where Python
and the shell look for it, then asks for its evaluation. Nothing planted runs inside a getter, and the getters
report what the guest really has.

Planted: ``~/json.py`` (first on ``sys.path`` for a ``python3 -c`` run in the home folder), a user
site-packages ``.pth`` and ``usercustomize`` (run by every interpreter with user site-packages on), and
``python3``/``google-chrome`` shims in ``~/.local/bin`` and ``~/bin``. Each writes a ``forged-*`` file when it
runs. The task's getters: a command's output (``vm_command_line``, running ``python3 -c`` with ``import json``,
as OSWorld's task files do) and the accessibility tree (osfleet's query script in the guest). Office image (it has
AT-SPI); through the real API with a clients file, the real ReplicaHost, libvirt and guest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig, Settings
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
A = {"Authorization": f"Bearer {ALICE}"}
PLANT = r"""
site=~/.local/lib/python3.11/site-packages
mkdir -p "$site" ~/.local/bin ~/bin
printf 'open("/home/user/forged-json", "w").write("1")\ndumps = lambda *a, **k: "FORGED"\n' > ~/json.py
echo 'import os; open("/home/user/forged-pth", "w").write("1")' > "$site/zz.pth"
echo 'open("/home/user/forged-usercustomize", "w").write("1")' > "$site/usercustomize.py"
for d in ~/.local/bin ~/bin; do
  for p in python3 python google-chrome; do
    printf '#!/bin/sh\ntouch /home/user/forged-path\nexec /usr/bin/%s "$@"\n' "$p" > "$d/$p"; chmod +x "$d/$p"
  done
done
"""
TASK = {
    "id": "guest-integrity",
    "instruction": "Nothing to do.",
    "evaluator": {
        "func": ["exact_match", "check_accessibility_tree"],
        "conj": "and",
        "result": [
            {"type": "vm_command_line", "command": ["python3", "-c", "import json; print(json.dumps([1]))"]},
            {"type": "accessibility_tree"},
        ],
        "expected": [
            {"type": "rule", "rules": {"expected": "[1]\n"}},
            {"type": "rule", "rules": [{"selectors": ["application"], "exact": False}]},
        ],
    },
}


@pytest.fixture
def api(office_image: GoldenImage, settings: Settings, tmp_path: Path) -> Iterator[tuple[TestClient, ReplicaHost]]:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\n")
    made: list[ReplicaHost] = []

    def factory() -> ReplicaHost:
        made.append(ReplicaHost(office_image, settings, warm=1, max_replicas=1, auto_recover=False))
        return made[0]

    cfg = AgentConfig(token=OPERATOR, warm=1, clients=load_clients(clients, OPERATOR))
    with TestClient(create_app(cfg, factory)) as client:
        host = made[0]
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not any(r.state == "ready" for r in host.replicas()):
                time.sleep(0.5)
            yield client, host
        finally:
            host.stop_background()
            host.down()


def step(c: TestClient, rid: str, lid: str, command: str) -> str:
    body = {"lease_id": lid, "action_id": command[:16], "observe": False,
            "actions": [{"type": "shell", "command": command, "timeout": 60}]}  # fmt: skip
    r = c.post(f"/v1/replicas/{rid}/step", json=body, headers=A)
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["ok"], result
    return str(result.get("stdout", ""))


def test_code_the_agent_plants_never_runs_inside_a_getter(api: tuple[TestClient, ReplicaHost]) -> None:
    c, _ = api
    r = c.post("/v1/leases", json={"holder": "agent"}, headers=A)
    assert r.status_code == 201, r.text
    rid, lid = r.json()["replica_id"], r.json()["lease_id"]
    r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=A)
    assert r.status_code == 200, r.text
    step(c, rid, lid, PLANT)
    # the plants work for the agent's own commands (they are the agent's): the test would prove nothing otherwise
    assert "forged" in step(c, rid, lid, "cd ~ && python3 -c 'import json; print(json.dumps(1))'").lower()
    step(c, rid, lid, "rm -f /home/user/forged-*")
    r = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=A)
    assert r.status_code == 200, r.text
    evaluation = r.json()
    assert evaluation["criteria"][0]["score"] == 1.0, evaluation  # the real json module printed [1]
    assert len(evaluation["criteria"]) == 2, evaluation  # the accessibility tree was read (conj and: no early 0)
    ran = step(c, rid, lid, "ls /home/user/ | grep '^forged-' || true").split()
    assert ran == [], f"planted code ran inside a getter: {ran}"
    c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=A)
