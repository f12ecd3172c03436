"""Clients are tenants (no VM: the host agent over the test fakes, with TestClient; the gateway over real host
agents on loopback): each client sees and touches only its own replicas, leases, episodes and OSGym vms (404 for
anyone else's), the warm pool and the host are the operator's, no root shell for clients, and identities cannot
be claimed with a header."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import ON_BEHALF_OF, VOUCHED_BY, load_clients
from osfleet.cli import cli as osfleet_cli
from osfleet.config import AgentConfig
from osfleet.errors import ConfigError
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.

OPERATOR = "operator-token-0123456789"
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789abc"
OP = {"Authorization": f"Bearer {OPERATOR}"}
A = {"Authorization": f"Bearer {ALICE}"}
B = {"Authorization": f"Bearer {BOB}"}
WAIT = [{"type": "wait", "seconds": 0}]
TASK = {
    "id": "fake-task",
    "instruction": "Run something.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": "yes"}}}],
}
OSGYM_TASK = {  # OSWorld's form, as OSGym's /reset takes it (scored in the evaluation jail)
    "id": "t1",
    "instruction": "i",
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "check"},
        "expected": {"type": "rule", "rules": {"expected": "yes"}},
    },
}


# --- the clients file -------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_a_clients_file_names_each_client_and_keeps_only_digests(tmp_path: Path) -> None:
    f = tmp_path / "clients"
    digest = hashlib.sha256(BOB.encode()).hexdigest()
    f.write_text(f"# trainers\n\nalice {ALICE}   # the first\n  bob   sha256:{digest}\n")
    clients = load_clients(f, OPERATOR)
    assert [c.name for c in clients] == ["alice", "bob"]
    assert clients[0].sha256 == hashlib.sha256(ALICE.encode()).digest()
    assert clients[1].sha256 == bytes.fromhex(digest)
    assert ALICE not in repr(clients)  # only digests are kept


@pytest.mark.integration
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"alice {ALICE}\nbob\n", "line 2: expected NAME TOKEN"),
        (f"alice {ALICE} extra\n", "line 1: expected NAME TOKEN"),
        (f"al/ice {ALICE}\n", "line 1: client name 'al/ice'"),
        (f"operator {ALICE}\n", "line 1: 'operator' is the operator"),
        ("alice short\n", "line 1: client alice's token is shorter than 16"),
        ("alice sha256:abc\n", "line 1: a sha256: token needs exactly 64 hex digits"),
        (f"alice {ALICE}\n\nalice {BOB}\n", "line 3: client alice is named twice"),
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: client bob's token is another client's too"),
        (f"alice {OPERATOR}\n", "line 1: client alice's token is the operator's token"),
    ],
)
def test_a_bad_clients_line_is_one_error_naming_the_line(tmp_path: Path, text: str, problem: str) -> None:
    f = tmp_path / "clients"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_clients(f, OPERATOR)
    assert str(err.value).startswith(f"clients file {f} {problem}")
    assert "\n" not in str(err.value)


@pytest.mark.integration
@pytest.mark.parametrize("command", ["host", "fleet"])
def test_serve_with_a_bad_clients_file_exits_with_one_line(tmp_path: Path, command: str) -> None:
    f, tok, hosts_tok = tmp_path / "clients", tmp_path / "token", tmp_path / "hosts-token"
    f.write_text(f"alice {ALICE}\nbob\n")
    tok.write_text(OPERATOR)
    hosts_tok.write_text("the-hosts-own-token-0123456789")
    args = [command, "serve", "--token-file", str(tok), "--clients-file", str(f)]
    if command == "fleet":
        args += ["--host", "h1=http://127.0.0.1:1", "--hosts-token-file", str(hosts_tok)]
    result = CliRunner().invoke(osfleet_cli, args)
    assert result.exit_code != 0
    why = "line 2: expected NAME TOKEN (two fields separated by spaces)"
    assert result.output.strip().splitlines() == [f"osfleet: error: clients file {f} {why}"]


@pytest.mark.integration
def test_the_gateway_refuses_to_serve_clients_with_its_hosts_token(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text(OPERATOR)
    args = [
        "fleet",
        "serve",
        "--host",
        "h1=http://127.0.0.1:1",
        "--hosts-token-file",
        str(tok),
        "--token-file",
        str(tok),
    ]
    result = CliRunner().invoke(osfleet_cli, args)
    assert result.exit_code != 0 and "is a host's token" in result.output


# --- one host agent, two clients --------------------------------------------------------------------------------
def config(tmp_path: Path, **over: Any) -> AgentConfig:
    f = tmp_path / "clients"
    f.write_text(f"alice {ALICE}\nbob {BOB}\n")
    return AgentConfig(token=OPERATOR, warm=0, clients=load_clients(f, OPERATOR), **over)


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=3)


@pytest.fixture
def client(fake: FakeHost, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(config(tmp_path), lambda: fake)) as c:
        yield c


def lease(c: TestClient, headers: dict[str, str]) -> tuple[str, str]:
    r = c.post("/v1/leases", json={"holder": "t"}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def attempts(rid: str, lid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every operation on a replica and its lease, as a client would send it."""
    return [
        ("POST", f"/v1/replicas/{rid}/step", {"lease_id": lid, "action_id": "x", "actions": WAIT, "observe": False}),
        ("POST", f"/v1/replicas/{rid}/reset", {"lease_id": lid, "task": TASK, "observe": False}),
        ("GET", f"/v1/replicas/{rid}/observation?lease_id={lid}", None),
        ("POST", f"/v1/replicas/{rid}/evaluate", {"lease_id": lid}),
        ("POST", f"/v1/replicas/{rid}/fork", {"lease_id": lid, "children": 1}),
        ("POST", f"/v1/replicas/{rid}/release", {"lease_id": lid}),
        ("DELETE", f"/v1/replicas/{rid}", None),
    ]


@pytest.mark.integration
def test_a_client_gets_404_for_anything_of_another_clients(client: TestClient, fake: FakeHost) -> None:
    rid, lid = lease(client, A)
    assert client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=A).status_code == 200
    pool = next(r.id for r in fake.replicas() if r.lease is None)
    for method, path, body in attempts(rid, lid) + attempts(pool, lid) + attempts("r-nosuch", lid):
        r = client.request(method, path, json=body, headers=B)
        assert r.status_code == 404 and r.json()["kind"] == "not_found", (method, path, r.text)
        if path.startswith(f"/v1/replicas/{rid}"):  # the same answer as for a replica that does not exist
            assert r.json()["error"] == f"no replica {rid}", r.text
    assert fake.applied == [] and fake.forked == []
    r = client.post(f"/v1/replicas/{rid}/step", json=attempts(rid, lid)[0][2], headers=A)
    assert r.status_code == 200 and len(fake.applied) == 1  # alice's replica went on untouched
    assert client.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=A).status_code == 200


@pytest.mark.integration
def test_files_and_tunnels_of_another_clients_lease_are_404(client: TestClient, fake: FakeHost) -> None:
    """The raw-body operations (files, tunnels: what OSWorld's harness rides on) check the lease's owner as the
    JSON ones do, before reading a byte or touching the guest."""
    rid, lid = lease(client, A)
    raw = {**B, "Content-Type": "application/octet-stream"}
    where = {"lease_id": lid, "path": "/home/user/notes.txt"}
    tunnel = {"lease_id": lid, "tunnel_id": "t-0"}
    for r in (
        client.get(f"/v1/replicas/{rid}/files", params=where, headers=B),
        client.put(f"/v1/replicas/{rid}/files", params=where, content=b"forged", headers=raw),
        client.post(f"/v1/replicas/{rid}/tunnels", json={"lease_id": lid, "port": 1337}, headers=B),
        client.put(f"/v1/replicas/{rid}/tunnel", params=tunnel, content=b"GET / HTTP/1.1", headers=raw),
        client.get(f"/v1/replicas/{rid}/tunnel", params={**tunnel, "wait": 0}, headers=B),
        client.delete(f"/v1/replicas/{rid}/tunnel", params=tunnel, headers=B),
    ):
        assert r.status_code == 404 and r.json()["kind"] == "not_found", (r.request.method, r.request.url, r.text)
        assert r.json()["error"] == f"no replica {rid}", r.text
    assert fake.applied == []


@pytest.mark.integration
def test_a_client_lists_only_what_it_holds_and_the_operator_everything(client: TestClient, fake: FakeHost) -> None:
    a = lease(client, A)[0]
    b = lease(client, B)[0]
    assert [x["id"] for x in client.get("/v1/replicas", headers=A).json()] == [a]
    assert [x["id"] for x in client.get("/v1/replicas", headers=B).json()] == [b]
    assert len(client.get("/v1/replicas", headers=OP).json()) == 3  # the warm pool is the operator's to see


@pytest.mark.integration
def test_the_warm_pool_and_the_host_are_the_operators(client: TestClient, fake: FakeHost) -> None:
    for method, path, body, status in [("POST", "/v1/replicas", {"count": 1}, 202), ("GET", "/v1/host", None, 200)]:
        r = client.request(method, path, json=body, headers=A)
        assert r.status_code == 403 and r.json()["kind"] == "forbidden", path
        assert client.request(method, path, json=body, headers=OP).status_code == status, path
    assert client.get("/metrics", headers=A).status_code == 403
    pool = next(r.id for r in fake.replicas() if r.lease is None)
    assert client.delete(f"/v1/replicas/{pool}", headers=A).status_code == 404
    assert client.delete(f"/v1/replicas/{pool}", headers=OP).status_code == 200
    mine = lease(client, A)[0]
    assert client.delete(f"/v1/replicas/{mine}", headers=A).status_code == 200  # a client retires its own


@pytest.mark.integration
def test_a_lease_of_one_client_is_not_released_by_another_and_a_released_one_says_so(client: TestClient) -> None:
    rid, lid = lease(client, A)
    assert client.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=B).status_code == 404
    assert client.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=A).status_code == 200
    r = client.post(f"/v1/replicas/{rid}/step", json=attempts(rid, lid)[0][2], headers=A)
    assert r.status_code == 409 and "was released" in r.json()["error"]  # its own: told why
    r = client.post(f"/v1/replicas/{rid}/step", json=attempts(rid, lid)[0][2], headers=B)
    assert r.status_code == 404  # another's: not even told that it existed


@pytest.mark.integration
def test_no_root_shell_for_clients_unless_the_host_allows_it(fake: FakeHost, tmp_path: Path) -> None:
    root = {"action_id": "r", "observe": False, "actions": [{"type": "shell", "command": "id -u", "as_root": True}]}
    root_task = {**TASK, "setup": [{"type": "run", "command": "chmod 777 /etc", "as_root": True}]}
    root_check = {
        **TASK,
        "criteria": [
            {"name": "x", "check": {"type": "command_output", "command": "id", "as_root": True, "exit_code": 0}}
        ],
    }
    with TestClient(create_app(config(tmp_path), lambda: fake)) as c:
        rid, lid = lease(c, A)
        r = c.post(f"/v1/replicas/{rid}/step", json={**root, "lease_id": lid}, headers=A)
        assert r.status_code == 403 and r.json()["kind"] == "forbidden" and "as_root" in r.json()["error"]
        for task in (root_task, root_check):
            r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": task}, headers=A)
            assert r.status_code == 403 and "as_root" in r.json()["error"]
        assert fake.applied == []
        user = {**root, "lease_id": lid, "action_id": "u", "actions": [{"type": "shell", "command": "id -u"}]}
        assert c.post(f"/v1/replicas/{rid}/step", json=user, headers=A).status_code == 200  # as the desktop user
        assert c.post(f"/v1/replicas/{rid}/step", json={**root, "lease_id": lid}, headers=OP).status_code == 200
        assert (
            c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": root_task}, headers=OP).status_code
            == 200
        )
        spec = c.get("/openapi.json").json()["paths"]["/v1/replicas/{rid}/step"]["post"]["responses"]
        assert "as_root" in spec["403"]["description"]
    fake.applied.clear()
    with TestClient(create_app(config(tmp_path, allow_agent_root=True), lambda: fake)) as c:
        rid, lid = lease(c, A)
        assert c.post(f"/v1/replicas/{rid}/step", json={**root, "lease_id": lid}, headers=A).status_code == 200
        assert len(fake.applied) == 1


@pytest.mark.integration
def test_only_the_operators_token_may_name_the_client_it_acts_for(client: TestClient) -> None:
    rid, lid = lease(client, A)
    # bob cannot claim to be alice: the header is ignored for a client's token
    assert client.get("/v1/replicas", headers={**B, ON_BEHALF_OF: "alice"}).json() == []
    step = {"lease_id": lid, "action_id": "x", "actions": WAIT, "observe": False}
    assert client.post(f"/v1/replicas/{rid}/step", json=step, headers={**B, ON_BEHALF_OF: "alice"}).status_code == 404
    # the operator's token (the gateway's) names a client of that gateway: a client's rights and no more, and
    # not the host's own alice (names from two authorities are two principals: tests/security/test_principals.py)
    as_alice = {**OP, ON_BEHALF_OF: "alice", VOUCHED_BY: "gw-1"}
    mine, _ = lease(client, as_alice)
    assert [x["id"] for x in client.get("/v1/replicas", headers=as_alice).json()] == [mine]
    assert client.get("/v1/host", headers=as_alice).status_code == 403
    assert client.get("/v1/replicas", headers={**OP, ON_BEHALF_OF: "bob", VOUCHED_BY: "gw-1"}).json() == []
    for bad in ({ON_BEHALF_OF: "no spaces allowed", VOUCHED_BY: "gw-1"}, {ON_BEHALF_OF: "alice"}):
        assert client.get("/v1/replicas", headers={**OP, **bad}).status_code == 401


@pytest.mark.system
def test_osgym_vms_are_their_clients_and_an_expired_vm_never_drives_a_newer_one(
    client: TestClient, fake: FakeHost
) -> None:
    r = client.post("/reset", json={"task_config": OSGYM_TASK, "timeout": 600}, headers=A)
    assert r.status_code == 200, r.text
    vm = r.json()["vm_id"]
    for method, path, body in [
        ("POST", "/step", {"action": "click(1,2)", "vm_id": vm}),
        ("GET", f"/screenshot?vmId={vm}", None),
        ("POST", "/shutdown", {"vm_id": vm}),
    ]:
        assert client.request(method, path, json=body, headers=B).status_code == 404, path
    assert client.post("/shutdown", json={"vm_id": "all"}, headers=B).status_code == 200  # bob's all: none
    assert client.post("/step", json={"action": "click(1,2)", "vm_id": vm}, headers=A).status_code == 200
    assert [a[0] for a in fake.applied] and len(fake.applied) == 1
    # alice's vm expires; her next vm lands on the same replica: the old id is refused, never mapped to the new
    rid = next(r.id for r in fake.replicas() if r.lease is not None)
    with fake.registry.locked(rid) as rec:
        assert rec.lease is not None
        rec.lease.expires_at = 0  # its time is up
    for due_rid, due_lease in fake.leases.expired_leases():
        fake.release(due_rid, due_lease)  # what the monitor does
    for other in [r.id for r in fake.replicas() if r.id != rid]:
        fake.retire(other)  # so the next vm is on the same replica
    r = client.post("/reset", json={"task_config": OSGYM_TASK, "timeout": 600}, headers=A)
    assert r.status_code == 200 and r.json()["vm_id"] != vm
    # its episode ended and the replica's new one has another vm id: the old id names no vm (never the new one)
    assert client.post("/step", json={"action": "click(3,4)", "vm_id": vm}, headers=A).status_code == 404
    assert len(fake.applied) == 1  # nothing reached the newer vm
    assert client.post("/step", json={"action": "click(3,4)", "vm_id": r.json()["vm_id"]}, headers=A).status_code == 200


@pytest.mark.system
def test_osgym_finish_releases_the_vm_even_when_scoring_fails(client: TestClient, fake: FakeHost) -> None:
    vm = client.post("/reset", json={"task_config": OSGYM_TASK, "timeout": 600}, headers=A).json()["vm_id"]
    rid = next(r.id for r in fake.replicas() if r.lease is not None)

    def broken(*args: Any, **kw: Any) -> dict[str, Any]:
        raise TimeoutError("the guest agent did not answer")  # an infrastructure failure while scoring

    fake.shell = broken  # type: ignore[method-assign]
    r = client.post("/step", json={"action": "finish()", "vm_id": vm}, headers=A)
    assert r.status_code == 503 and r.json()["kind"] == "infrastructure"
    assert fake.get(rid).lease is None  # released all the same
    assert client.post("/step", json={"action": "wait()", "vm_id": vm}, headers=A).status_code == 404


# --- leases are checked where the replica is touched: the race ------------------------------------------------
def race(c: TestClient, host: Any, second: list[dict[str, Any]], b_files: Callable[[str], object]) -> None:
    """A's slow step holds the replica; A's second request on the same lease is queued behind it; A's lease ends
    (released the way the monitor ends an expired one) and B leases the replica, resets it and steps; only then
    does A's second request reach the host. It must be refused, and B's replica, guest files and episode must be
    as B left them. ``second``: A's second batch (it reaches the guest only if the lease check fails);
    ``b_files(rid)``: what B's guest holds, to compare."""
    rid, lid = lease(c, A)
    r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=A)
    assert r.status_code == 200, r.text
    slow_gate, slow_in, queued, b_done = (threading.Event() for _ in range(4))
    act = host.act

    def gated(replica: str, actions: list[Any], claim: Any = None) -> Any:
        if actions[0].type == "wait" and not slow_in.is_set():  # A's slow step, inside the replica's lock
            with host.leases.touching(replica, claim):
                slow_in.set()
                slow_gate.wait(60)
            return act(replica, actions, claim)
        if actions == parsed_second:  # A's queued request: it goes on once B holds the replica
            queued.set()
            b_done.wait(60)
        return act(replica, actions, claim)

    from osfleet.api.models import StepRequest

    parsed_second = StepRequest.model_validate(
        {"lease_id": lid, "action_id": "a2", "actions": second, "observe": False}
    ).actions
    host.act = gated
    answers: dict[str, Any] = {}

    def step(name: str, action_id: str, actions: list[dict[str, Any]]) -> None:
        body = {"lease_id": lid, "action_id": action_id, "actions": actions, "observe": False}
        answers[name] = c.post(f"/v1/replicas/{rid}/step", json=body, headers=A)

    slow = threading.Thread(target=step, args=("slow", "a1", [{"type": "wait", "seconds": 0}]))
    slow.start()
    assert slow_in.wait(60)
    again = threading.Thread(target=step, args=("again", "a2", second))
    again.start()
    slow_gate.set()
    assert queued.wait(60)  # A's second request holds A's episode and is about to touch the replica
    slow.join(60)
    assert answers["slow"].status_code == 200
    assert host.release(rid, lid) is True  # A's lease ends (as the monitor ends an expired one)
    b_rid, b_lid = lease(c, B)
    assert b_rid == rid  # the same replica, B's now
    r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": b_lid, "task": TASK, "observe": False}, headers=B)
    assert r.status_code == 200, r.text
    mine = [{"type": "shell", "command": "echo B > /tmp/b.txt"}]
    body = {"lease_id": b_lid, "action_id": "b1", "actions": mine, "observe": False}
    assert c.post(f"/v1/replicas/{rid}/step", json=body, headers=B).status_code == 200
    episode_dir = host.settings.replicas_dir / rid
    before = {p.name: p.read_bytes() for p in episode_dir.glob(f"episode-{b_lid}*")}
    generation, guest = host.get(rid).generation, b_files(rid)
    b_done.set()
    again.join(60)
    assert answers["again"].status_code == 409 and answers["again"].json()["kind"] == "lease", answers["again"].text
    assert "was released" in answers["again"].json()["error"]
    after = {p.name: p.read_bytes() for p in episode_dir.glob(f"episode-{b_lid}*")}
    assert before and after == before  # B's episode: not a byte of A's request in it
    assert host.get(rid).generation == generation and host.get(rid).lease.id == b_lid
    assert b_files(rid) == guest  # B's guest: nothing of A's reached it
    host.act = act
    body = {**body, "action_id": "b2", "actions": [{"type": "wait", "seconds": 0}]}
    assert c.post(f"/v1/replicas/{rid}/step", json=body, headers=B).status_code == 200  # B goes on


@pytest.mark.integration
def test_a_step_queued_on_an_ended_lease_never_touches_the_next_holders_replica(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path / "home", ready=1)
    with TestClient(create_app(config(tmp_path), lambda: fake)) as c:
        second = [{"type": "shell", "command": "echo A > /tmp/b.txt"}]
        race(c, fake, second, lambda rid: [a for r, a in fake.applied if r == rid])


@pytest.mark.integration
def test_release_waits_for_the_step_under_way(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path / "home", ready=1)
    fake.act_gate = threading.Event()
    with TestClient(create_app(config(tmp_path), lambda: fake)) as c:
        rid, lid = lease(c, A)
        answers: dict[str, Any] = {}
        body = {"lease_id": lid, "action_id": "a1", "actions": WAIT, "observe": False}
        slow = threading.Thread(
            target=lambda: answers.update(step=c.post(f"/v1/replicas/{rid}/step", json=body, headers=A))
        )
        slow.start()
        assert fake.acting.wait(30)
        release = threading.Thread(
            target=lambda: answers.update(
                release=c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=A)
            )
        )
        release.start()
        try:
            release.join(0.5)  # a bounded look for what must not happen: the lease ending under the step
            assert release.is_alive() and fake.get(rid).lease is not None and fake.get(rid).generation == 1
        finally:
            fake.act_gate.set()
        slow.join(30)
        release.join(30)
        assert answers["step"].status_code == 200 and answers["release"].status_code == 200
        assert fake.get(rid).lease is None and fake.get(rid).generation == 2  # reset after the step, not under it
