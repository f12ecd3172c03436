"""The host agent on real replicas (TCG here): native contract, OSGym clients, bad input, infrastructure faults."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from osfleet.api.app import create_app
from osfleet.config import AgentConfig, Settings
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage
from tests.conftest import VENV_BIN, free_port

pytestmark = pytest.mark.vm
TOKEN = "api-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def api(golden: GoldenImage, settings: Settings, no_leftovers: None) -> Iterator[tuple[TestClient, ReplicaHost]]:
    hosts: list[ReplicaHost] = []

    def factory() -> ReplicaHost:
        hosts.append(ReplicaHost(golden, settings, warm=1, auto_recover=False))
        return hosts[0]

    app = create_app(AgentConfig(token=TOKEN, warm=1, osgym_allowed_ips=("testclient",)), factory)
    with TestClient(app) as client:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(r.state == "ready" for r in hosts[0].replicas()):
            time.sleep(0.2)
        try:
            yield client, hosts[0]
        finally:
            hosts[0].stop_background()
            hosts[0].down()


def lease(client: TestClient, ttl: float | None = None) -> tuple[str, str]:
    r = client.post("/v1/leases", json={"holder": "test", **({"ttl_seconds": ttl} if ttl else {})}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def post(client: TestClient, rid: str, what: str, body: dict[str, object]) -> dict[str, object]:
    r = client.post(f"/v1/replicas/{rid}/{what}", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_oracle_scores_1_noop_scores_0_and_a_retried_step_applies_once(api: tuple[TestClient, ReplicaHost]) -> None:
    client, _ = api
    rid, lid = lease(client)
    reset = post(client, rid, "reset", {"lease_id": lid, "task_id": "cli-write-note"})
    assert reset["instruction"] and reset["observation"]["width"] == 1280  # type: ignore[index]
    assert post(client, rid, "evaluate", {"lease_id": lid})["reward"] == 0.0
    post(client, rid, "step", {"lease_id": lid, "action_id": "noop", "actions": [{"type": "wait", "seconds": 0.2}]})
    assert post(client, rid, "evaluate", {"lease_id": lid})["reward"] == 0.0

    oracle = [
        {"type": "cli_command", "command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"},
        {"type": "cli_command", "command": "echo once >> ~/applied"},
    ]
    first = post(client, rid, "step", {"lease_id": lid, "action_id": "a1", "actions": oracle, "observe": False})
    again = post(client, rid, "step", {"lease_id": lid, "action_id": "a1", "actions": oracle, "observe": False})
    assert not first["replayed"] and again["replayed"] and again["results"] == first["results"]
    ev = post(client, rid, "evaluate", {"lease_id": lid})
    assert ev["reward"] == 1.0 and ev["success"] is True
    (check,) = post(
        client,
        rid,
        "step",
        {
            "lease_id": lid,
            "action_id": "c",
            "observe": False,
            "actions": [{"type": "shell", "command": "cat ~/applied"}],
        },
    )["results"]  # type: ignore[misc]
    assert check["stdout"] == "once\n"
    obs = client.get(f"/v1/replicas/{rid}/observation", params={"lease_id": lid, "format": "jpeg"}, headers=AUTH)
    assert Image.open(io.BytesIO(base64.b64decode(obs.json()["screenshot"]))).size == (1280, 800)
    assert post(client, rid, "release", {"lease_id": lid})["released"] is True


def test_bad_input_gets_precise_errors_and_loses_nothing(api: tuple[TestClient, ReplicaHost]) -> None:
    client, host = api
    rid, lid = lease(client)
    post(client, rid, "reset", {"lease_id": lid, "task_id": "cli-write-note", "observe": False})

    def step(actions: list[dict[str, object]], lease_id: str = lid, action_id: str = "x") -> object:
        return client.post(
            f"/v1/replicas/{rid}/step",
            json={"lease_id": lease_id, "action_id": action_id, "actions": actions},
            headers=AUTH,
        )

    r = step([{"type": "click", "x": 5000, "y": 10}])
    assert r.status_code == 422 and "off the 1280x800 screen" in r.json()["error"]  # type: ignore[attr-defined]
    r = step([{"type": "type", "text": "bell\x07"}])
    assert r.status_code == 422 and "cannot type '\\x07'" in r.json()["error"]  # type: ignore[attr-defined]
    r = step([{"type": "hotkey", "keys": ["ctrl", "hyper"]}])
    assert r.status_code == 422 and "unknown key 'hyper'" in r.json()["error"]  # type: ignore[attr-defined]
    r = step([{"type": "wait"}], lease_id="someone-else")
    assert r.status_code == 409 and r.json()["kind"] == "lease"  # type: ignore[attr-defined]
    r = client.post(
        f"/v1/replicas/{rid}/reset",
        json={
            "lease_id": lid,
            "task": {
                "id": "t",
                "instruction": "i",
                "config": [{"type": "googledrive", "parameters": {}}],
                "evaluator": {},
            },
        },
        headers=AUTH,
    )
    assert r.status_code == 422 and "'googledrive'" in r.json()["error"]
    r = client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task_id": "no-such-task"}, headers=AUTH)
    assert r.status_code == 404
    # A guest command that times out is an error result; the replica survives.
    r = step([{"type": "shell", "command": "sleep 60", "timeout": 1}], action_id="slow")
    assert r.status_code == 200 and "timed out" in r.json()["results"][0]["error"]  # type: ignore[attr-defined]
    r = step([{"type": "shell", "command": "echo alive"}], action_id="after")
    assert r.json()["results"][0]["stdout"] == "alive\n"  # type: ignore[attr-defined]
    # An expired lease cannot act.
    rid2, lid2 = rid, lid
    post(client, rid2, "release", {"lease_id": lid2})
    rid3, lid3 = lease(client, ttl=0.5)
    time.sleep(1.0)
    r = client.post(f"/v1/replicas/{rid3}/evaluate", json={"lease_id": lid3}, headers=AUTH)
    assert r.status_code == 409 and "expired" in r.json()["error"]
    assert all(rec.state != "failed" for rec in host.replicas())


def test_an_infrastructure_failure_is_never_a_reward_of_0(api: tuple[TestClient, ReplicaHost]) -> None:
    client, host = api
    rid, lid = lease(client)
    post(client, rid, "reset", {"lease_id": lid, "task_id": "cli-write-note", "observe": False})
    pid = host.virt.qemu_pid(host.get(rid).domain)
    assert pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    r = client.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH)
    assert r.status_code == 503 and r.json()["kind"] == "infrastructure" and "reward" not in r.json()
    metrics = client.get("/metrics", headers=AUTH).text
    assert 'osfleet_failures_total{kind="infrastructure"}' in metrics


def test_an_osgym_client_runs_reset_steps_finish(api: tuple[TestClient, ReplicaHost]) -> None:
    client, _ = api
    task = {
        "id": "osgym-echo",
        "instruction": "Write osgym into ~/osgym.txt from the terminal.",
        "config": [{"type": "execute", "parameters": {"command": ["rm", "-f", "/home/user/osgym.txt"]}}],
        "evaluator": {
            "func": "check_include_exclude",
            "result": {"type": "vm_command_line", "command": "cat /home/user/osgym.txt"},
            "expected": {"type": "rule", "rules": {"include": ["osgym"], "exclude": ["No such file"]}},
        },
    }
    # OSGym clients send no token: the allow-listed address is enough.
    r = client.post("/reset", json={"task_config": task, "timeout": 600})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"screenshot", "problem", "vm_id"} and isinstance(body["vm_id"], int)
    assert Image.open(io.BytesIO(base64.b64decode(body["screenshot"]))).size == (1280, 800)
    vm = body["vm_id"]
    shot = client.get("/screenshot", params={"vmId": vm}).json()
    assert shot["vm_id"] == vm and shot["screenshot"]
    # a wait after the click (the terminal gets the pointer a moment later on a busy TCG host), and three after
    # typing: the command runs in xterm a moment later
    action = "click(200,200)&wait()&type(echo osgym > ~/osgym.txt\n)&wait()&wait()&wait()"
    r = client.post("/step", json={"action": action, "vm_id": vm})
    assert r.status_code == 200 and r.json()["is_finish"] is False and r.json()["reward"] == 0
    r = client.post("/step", json={"action": "click(99999,5)", "vm_id": vm})
    assert r.status_code == 422 and "off the" in r.json()["error"]
    # Another client's shutdown("all") does not touch this client's vm.
    other = client.post("/shutdown", json={"vm_id": "all"}, headers=AUTH)
    assert other.status_code == 200
    r = client.post("/step", json={"action": "finish()", "vm_id": vm})
    assert r.status_code == 200, r.text
    assert r.json()["is_finish"] is True and r.json()["reward"] == 1.0
    # finish() released the vm
    assert client.post("/step", json={"action": "wait()", "vm_id": vm}).status_code == 404


def test_a_killed_agent_restarts_and_the_episode_goes_on(
    golden: GoldenImage, settings: Settings, no_leftovers: None, tmp_path: Path
) -> None:
    """The host agent process is killed (SIGKILL) between two steps; a new one adopts the leased replica, a
    retried step is replayed (applied once in the guest) and evaluate still scores the task."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    osf = str(VENV_BIN / "osfleet")

    def serve(port: int) -> subprocess.Popen[bytes]:
        cmd = [osf, "host", "serve", "--port", str(port), "--warm", "1", "--token-file", str(token)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", headers=AUTH, timeout=2).json()
                if health["replicas"].get("ready"):
                    return proc
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        proc.kill()
        raise AssertionError("the host agent did not become ready")

    port = free_port()
    agent = serve(port)
    url = f"http://127.0.0.1:{port}"
    try:
        r = httpx.post(f"{url}/v1/leases", json={"holder": "t"}, headers=AUTH, timeout=30)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        body = {"lease_id": lid, "task_id": "cli-write-note", "observe": False}
        assert httpx.post(f"{url}/v1/replicas/{rid}/reset", json=body, headers=AUTH, timeout=120).status_code == 200
        oracle = [
            {"type": "cli_command", "command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"},
            {"type": "cli_command", "command": "echo once >> ~/applied"},
        ]
        step = {"lease_id": lid, "action_id": "s1", "actions": oracle, "observe": False}
        first = httpx.post(f"{url}/v1/replicas/{rid}/step", json=step, headers=AUTH, timeout=120).json()
        assert first["replayed"] is False
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
        agent = serve(port)
        again = httpx.post(f"{url}/v1/replicas/{rid}/step", json=step, headers=AUTH, timeout=120)
        assert again.status_code == 200, again.text
        assert again.json()["replayed"] is True and again.json()["results"] == first["results"]
        check = {
            "lease_id": lid,
            "action_id": "s2",
            "observe": False,
            "actions": [{"type": "shell", "command": "cat ~/applied"}],
        }
        out = httpx.post(f"{url}/v1/replicas/{rid}/step", json=check, headers=AUTH, timeout=120).json()
        assert out["results"][0]["stdout"] == "once\n"
        ev = httpx.post(f"{url}/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH, timeout=120)
        assert ev.status_code == 200 and ev.json()["reward"] == 1.0
    finally:
        agent.send_signal(signal.SIGINT)
        agent.wait(120)
        subprocess.run([osf, "replicas", "down", "--all"], capture_output=True, timeout=300, check=False)


def test_forked_children_carry_the_episode_and_score_on_their_own(api: tuple[TestClient, ReplicaHost]) -> None:
    client, _ = api
    rid, lid = lease(client)
    post(client, rid, "reset", {"lease_id": lid, "task_id": "cli-write-note", "observe": False})
    half = [{"type": "cli_command", "command": "mkdir -p ~/notes"}]
    post(client, rid, "step", {"lease_id": lid, "action_id": "half", "actions": half, "observe": False})
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 2}, headers=AUTH)
    assert r.status_code == 201, r.text
    (a, la), (b, lb) = ((c["replica_id"], c["lease_id"]) for c in r.json()["children"])
    finish = [{"type": "cli_command", "command": "echo 'buy milk' > ~/notes/todo.txt"}]
    post(client, a, "step", {"lease_id": la, "action_id": "finish", "actions": finish, "observe": False})
    assert post(client, a, "evaluate", {"lease_id": la})["reward"] == 1.0  # the parent's task came along
    assert post(client, b, "evaluate", {"lease_id": lb})["reward"] == 0.0  # b did not finish it
    assert post(client, rid, "evaluate", {"lease_id": lid})["reward"] == 0.0  # nor did the parent
    look = [{"type": "shell", "command": "test -d ~/notes && echo forked-after-mkdir"}]
    done = post(client, b, "step", {"lease_id": lb, "action_id": "ls", "observe": False, "actions": look})
    assert done["results"][0]["stdout"] == "forked-after-mkdir\n"  # type: ignore[index]
    sample = client.get("/v1/host", headers=AUTH).json()
    assert [f["children"] for f in sample["forks"]] == [2]
    for child, child_lease in ((a, la), (b, lb)):
        assert post(client, child, "release", {"lease_id": child_lease})["released"] is True
    assert client.get("/v1/host", headers=AUTH).json()["forks"] == []  # both children went back to s0
    post(client, rid, "release", {"lease_id": lid})


def test_a_step_queued_on_an_ended_lease_never_touches_the_next_holders_replica(
    golden: GoldenImage, settings: Settings, no_leftovers: None, tmp_path: Path
) -> None:
    """The race of tests/test_tenants.py on a real replica: A's slow step, A's second request queued behind it,
    A's lease ended, B leasing the same replica and writing a file in its guest; A's second request (which would
    overwrite that file) is refused, and B's guest, replica and episode are as B left them."""
    from tests.test_tenants import config, race

    made: list[ReplicaHost] = []

    def factory() -> ReplicaHost:
        made.append(ReplicaHost(golden, settings, warm=1, max_replicas=1, auto_recover=False))
        return made[0]

    with TestClient(create_app(config(tmp_path), factory)) as client:
        host = made[0]
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not any(r.state == "ready" for r in host.replicas()):
                time.sleep(0.2)

            def guest_file(rid: str) -> str:
                return str(host.shell(rid, "cat /tmp/b.txt", 30)["stdout"])

            race(client, host, [{"type": "shell", "command": "echo A > /tmp/b.txt"}], guest_file)
            assert guest_file(host.replicas()[0].id) == "B\n"
        finally:
            host.stop_background()
            host.down()
