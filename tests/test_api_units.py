"""Action strings, task model and reward arithmetic, OSWorld subset, auth and error mapping (no replica booted)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api import probes
from osfleet.api.app import create_app
from osfleet.api.operations import OPERATIONS
from osfleet.api.osgym_actions import ActionStringError, parse
from osfleet.config import AgentConfig
from osfleet.replicas.episodes import EpisodeStore
from osfleet.replicas.errors import CapacityError
from osfleet.replicas.input import InputError
from osfleet.tasks.model import CriterionResult, Match, TaskError, UnsupportedTaskError, parse_task, score
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.

TOKEN = "test-token-123"


@pytest.mark.integration
def test_osgym_action_strings() -> None:
    p = parse("click(10,20)&type(a & b, c)&hotkey(ctrl,s)&scroll(5,6,50)&scroll(5,6,-50)&left_double(1,2)")
    assert [a.type for a in p.actions] == ["click", "type", "hotkey", "scroll", "scroll", "double_click"]
    assert p.actions[1].text == "a & b, c"  # type: ignore[union-attr]
    assert p.actions[2].keys == ["ctrl", "s"]  # type: ignore[union-attr]
    assert p.actions[3].clicks < 0 < p.actions[4].clicks  # type: ignore[union-attr]
    assert not p.finish
    assert parse("finish()").finish and parse("call_user()").finish and parse("wait()").actions[0].type == "wait"
    assert parse("drag(1,2,3,4)&right_single(5,6)").actions[0].type == "drag"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("", "empty"),
        ("jump(1,2)", "unknown action 'jump'"),
        ("click(1)", "takes 2 numbers"),
        ("click(a,b)", "takes numbers"),
        ("click 1 2", "not an action call"),
        ("scroll(1,2)", "scroll"),
    ],
)
def test_malformed_osgym_actions_name_the_problem(action: str, message: str) -> None:
    with pytest.raises(ActionStringError, match=message):
        parse(action)


@pytest.mark.integration
def test_reward_is_the_weighted_share_and_success_needs_every_required_criterion() -> None:
    r = [
        CriterionResult(name="a", met=True, weight=3, required=True),
        CriterionResult(name="b", met=False, weight=1, required=False),
    ]
    ev = score(r)
    assert ev.reward == pytest.approx(0.75) and ev.success
    r[0].met, r[1].met = False, True
    ev = score(r)
    assert ev.reward == pytest.approx(0.25) and not ev.success
    assert score([]).reward == 0.0


@pytest.mark.integration
def test_match_semantics() -> None:
    assert Match(equals="x").check("x\n") and not Match(equals="x").check("xy")
    assert Match(include=["a"], exclude=["b"]).check("a c") and not Match(include=["a"], exclude=["b"]).check("a b")
    assert Match(regex=r"^\d+$").check("12\n")
    with pytest.raises(ValueError):
        Match()


def osworld(**over: object) -> dict[str, object]:
    task: dict[str, object] = {
        "id": "abc-123",
        "instruction": "Make a file.",
        "config": [
            {"type": "execute", "parameters": {"command": ["touch", "/tmp/x"]}},
            {"type": "sleep", "parameters": {"seconds": 0.1}},
            {"type": "launch", "parameters": {"command": "xterm"}},
            {"type": "open", "parameters": {"path": "/home/user/a.txt"}},
            {"type": "command", "parameters": {"command": "true", "shell": True}},
        ],
        "evaluator": {
            "func": ["exact_match", "check_include_exclude"],
            "result": [
                {"type": "vm_command_line", "command": "cat /tmp/x"},
                {"type": "vm_file", "path": "/tmp/x", "dest": "x"},
            ],
            "expected": [
                {"type": "rule", "rules": {"expected": "ok"}},
                {"type": "rule", "rules": {"include": ["o"], "exclude": ["fail"]}},
            ],
        },
    }
    task.update(over)
    return task


@pytest.mark.integration
def test_osworld_task_converts() -> None:
    t = parse_task(osworld())
    kinds = ["run", "sleep", "launch", "run", "launch", "run", "run"]  # open: the file exists, launch, wait
    assert t.source == "osworld" and [s.type for s in t.setup] == kinds
    assert [c.check.type for c in t.criteria] == ["osworld", "osworld"] and t.osworld and t.osworld.conj == "and"
    assert t.setup[0].command == "touch /tmp/x"  # type: ignore[union-attr]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"config": [{"type": "login", "parameters": {}}]}, "set-up type 'login': logs in to a web service"),
        ({"evaluator": {"func": "no_such_metric", "result": {}, "expected": {}}}, "metric 'no_such_metric'"),
        (
            {
                "evaluator": {
                    "func": "exact_match",
                    "result": {"type": "googledrive_file"},
                    "expected": {"type": "rule", "rules": {}},
                }
            },
            "result type 'googledrive_file'",
        ),
        ({"evaluator": {"func": ["exact_match"], "conj": "xor", "result": [], "expected": []}}, "conj 'xor'"),
    ],
)
def test_unsupported_osworld_types_are_refused_by_name(change: dict[str, object], named: str) -> None:
    with pytest.raises(UnsupportedTaskError, match=named):
        parse_task(osworld(**change))


@pytest.mark.integration
def test_bad_osfleet_task_is_one_line() -> None:
    with pytest.raises(TaskError, match="criteria"):
        parse_task({"id": "x", "instruction": "y", "criteria": []})


CONFIG = AgentConfig(token=TOKEN, warm=0, osgym_allowed_ips=("allowed-host",))


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path, ready=0)


@pytest.fixture
def client(fake: FakeHost) -> Iterator[TestClient]:
    with TestClient(create_app(CONFIG, lambda: fake)) as c:
        yield c


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.integration
def test_every_api_endpoint_needs_the_token(client: TestClient) -> None:
    """Every operation the OpenAPI publishes (but /health and the probes, open, and /metrics, loopback) answers
    401 without a valid token, before it looks at the request's body or ids."""
    spec = client.get("/openapi.json").json()["paths"]
    operations = [
        (method, path.replace("{rid}", "r-x"))
        for path, ops in spec.items()
        for method in ops
        if path not in {"/health", "/metrics", *probes.PATHS}
    ]
    for must in [
        ("delete", "/v1/replicas/r-x"),
        ("post", "/v1/replicas"),
        ("get", "/v1/host"),
        ("post", "/v1/replicas/r-x/fork"),
        ("post", "/v1/replicas/r-x/step"),
        ("post", "/shutdown"),
        ("put", "/v1/replicas/r-x/files"),
    ]:
        assert must in operations  # the list is the published API, not one written by hand
    assert len(operations) == len(OPERATIONS)  # every operation of the table, and nothing else
    for method, path in operations:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": TOKEN},
            {"Cookie": f"osfleet_ui={TOKEN}"},
        ):
            resp = client.request(method.upper(), path, headers=headers)
            assert resp.status_code == 401, (method, path, headers)
            assert resp.headers["www-authenticate"] == "Bearer"
            assert resp.json()["kind"] == "unauthorized"
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 401  # the test client is not on loopback
    assert client.get("/metrics", headers=AUTH).status_code == 200


@pytest.mark.integration
def test_errors_are_precise_json(client: TestClient) -> None:
    r = client.post("/v1/replicas/r-nosuch/evaluate", json={"lease_id": "x"}, headers=AUTH)
    assert r.status_code == 404 and r.json() == {"error": "no replica r-nosuch", "kind": "not_found"}
    r = client.post("/v1/leases", json={}, headers=AUTH)
    assert r.status_code == 503 and r.json()["kind"] == "capacity" and r.headers["retry-after"]
    r = client.post(
        "/v1/replicas/r-x/step", json={"lease_id": "l", "action_id": "1", "actions": [{"type": "fly"}]}, headers=AUTH
    )
    assert r.status_code == 422 and r.json()["kind"] == "invalid_request" and "fly" in r.text
    r = client.post("/v1/leases", json={"ttl_seconds": -1}, headers=AUTH)
    assert r.status_code == 422 and "ttl_seconds" in r.json()["error"]
    r = client.post("/step", json={"action": "click(1,2)", "vm_id": 7}, headers=AUTH)
    assert r.status_code == 404 and "vm 7" in r.json()["error"]


@pytest.mark.integration
def test_openapi_is_published(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/leases", "/v1/replicas/{rid}/step", "/reset", "/step", "/shutdown", "/screenshot", "/metrics"):
        assert p in paths


# --- hardening: restart-safe episodes, one error boundary, health, the contract ------------------------------
TASK = {
    "id": "fake-task",
    "instruction": "Run something.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": "yes"}}}],
}
SHELL = [{"type": "shell", "command": "echo hi >> /tmp/log"}]


def _lease(c: TestClient) -> tuple[str, str]:
    r = c.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


@pytest.mark.integration
def test_a_restarted_agent_replays_a_retried_step_once_and_still_evaluates(tmp_path: Path) -> None:
    first = FakeHost(tmp_path, ready=1)
    with TestClient(create_app(CONFIG, lambda: first)) as c:
        rid, lid = _lease(c)
        assert (
            c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH).status_code == 200
        )
        step = {"lease_id": lid, "action_id": "a-1", "actions": SHELL, "observe": False}
        assert c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).json()["replayed"] is False
    # the agent is gone (its memory with it); a new one starts on the same host
    second = FakeHost(tmp_path, ready=1)
    second.files = dict(first.files)  # the guest kept its state: only the agent restarted
    with TestClient(create_app(CONFIG, lambda: second)) as c:
        r = c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH)
        assert r.status_code == 200 and r.json()["replayed"] is True and r.json()["results"][0]["ok"] is True
        assert second.applied == []  # not applied again
        r = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH)
        assert r.status_code == 200 and r.json()["reward"] == 1.0
        assert c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH).status_code == 200
    assert not list((tmp_path / "replicas" / rid).glob("episode*"))  # its episode ended with the lease


@pytest.mark.integration
def test_a_step_interrupted_by_a_crash_is_not_applied_again(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, ready=1)
    with TestClient(create_app(CONFIG, lambda: host)) as c:
        rid, lid = _lease(c)
        c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=AUTH)
    # what the episode's log holds when the process died between "pending" and "applied"
    with open(EpisodeStore(tmp_path / "replicas").path(rid, lid, ".log"), "a") as log:
        log.write('{"pending":"a-1"}\n')
    step = {"lease_id": lid, "action_id": "a-1", "actions": SHELL, "observe": False}
    again = FakeHost(tmp_path, ready=1)
    with TestClient(create_app(CONFIG, lambda: again)) as c:
        r = c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH)
        assert (
            r.status_code == 503 and r.json()["kind"] == "infrastructure" and "outcome is unknown" in r.json()["error"]
        )
        assert again.applied == []


@pytest.mark.integration
def test_an_unexpected_error_is_a_503_infrastructure_not_a_500(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    rid, lid = _lease(client)
    fake.act_error = RuntimeError("a bug in a lower layer")
    r = client.post(
        f"/v1/replicas/{rid}/step", json={"lease_id": lid, "action_id": "x", "actions": SHELL}, headers=AUTH
    )
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json() == {
        "error": f"POST /v1/replicas/{rid}/step: unexpected RuntimeError: a bug in a lower layer",
        "kind": "infrastructure",
    }


@pytest.mark.integration
def test_health_fails_when_a_background_thread_died(fake: FakeHost, client: TestClient) -> None:
    assert client.get("/health").status_code == 200
    fake.alive = False
    r = client.get("/health", headers=AUTH)
    assert r.status_code == 503 and r.json()["status"] == "failing" and "stopped" in r.json()["problem"]


@pytest.mark.system
def test_osgym_step_without_a_task_or_after_expiry_is_a_4xx(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    r = client.post("/reset", json={"task_config": osworld(), "timeout": 1}, headers=AUTH)
    assert r.status_code == 200, r.text
    vm = r.json()["vm_id"]
    time.sleep(1.1)  # the OSGym lease (timeout) runs out
    r = client.post("/step", json={"action": "click(1,2)", "vm_id": vm}, headers=AUTH)
    assert r.status_code == 409 and r.json()["kind"] == "lease"
    r = client.post("/step", json={"action": "click(1,2)", "vm_id": vm + 1}, headers=AUTH)
    assert r.status_code == 404


@pytest.mark.integration
def test_an_unknown_task_id_is_404_and_a_broken_task_is_422(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    rid, lid = _lease(client)
    r = client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task_id": "nope"}, headers=AUTH)
    assert r.status_code == 404 and "no built-in task 'nope'" in r.json()["error"]
    r = client.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": {"id": "x"}}, headers=AUTH)
    assert r.status_code == 422 and r.json()["kind"] == "invalid_request" and "task.osfleet" in r.json()["error"]


@pytest.mark.integration
def test_scale_up_beyond_capacity_is_503_capacity(fake: FakeHost, client: TestClient) -> None:
    def refuse(count: int, mode: object = None) -> None:
        raise CapacityError("this host can take 0 more replica(s) (maximum 1); asked for 5")

    fake.up_async = refuse  # type: ignore[method-assign]
    r = client.post("/v1/replicas", json={"count": 5}, headers=AUTH)
    assert r.status_code == 503 and r.json()["kind"] == "capacity" and r.headers["retry-after"]


@pytest.mark.integration
def test_the_openapi_documents_every_error_status(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    step = paths["/v1/replicas/{rid}/step"]["post"]["responses"]
    assert {"200", "401", "404", "409", "422", "503"} <= set(step)
    assert "Retry-After" in step["503"]["headers"]
    assert step["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "text/plain; version=0.0.4" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "503" in paths["/health"]["get"]["responses"]


@pytest.mark.integration
def test_a_refused_step_can_be_retried_with_the_same_action_id(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    rid, lid = _lease(client)
    step = {"lease_id": lid, "action_id": "x", "actions": SHELL, "observe": False}
    fake.act_error = InputError("click: coordinates (5000, 10) are off the 64x40 screen")
    assert client.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).status_code == 422
    fake.act_error = None
    r = client.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH)
    assert r.status_code == 200 and r.json()["replayed"] is False and len(fake.applied) == 1


@pytest.mark.integration
def test_a_body_that_is_not_json_is_a_422_and_405_names_every_method(client: TestClient) -> None:
    r = client.post("/shutdown", content=b"\xff\x12", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["kind"] == "invalid_request"
    r = client.options("/v1/replicas", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"


@pytest.mark.integration
def test_requests_take_exactly_what_the_schema_says(client: TestClient) -> None:
    r = client.post("/shutdown", json={"vm_id": False}, headers=AUTH)
    assert r.status_code == 422  # false is not a vm id
    r = client.post("/shutdown", json={"vm_id": 3.0}, headers=AUTH)
    assert r.status_code == 404  # 3.0 is (JSON Schema says so), and there is no vm 3
    r = client.post("/v1/replicas", json={"count": "2"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"].startswith("count:")


@pytest.mark.integration
def test_fork_leases_each_child_to_the_caller_with_the_parents_task(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    rid, lid = _lease(client)
    assert (
        client.post(
            f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task_id": "cli-write-note"}, headers=AUTH
        ).status_code
        == 200
    )
    step = {"lease_id": lid, "action_id": "before-fork", "actions": SHELL, "observe": False}
    assert client.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).status_code == 200
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 2}, headers=AUTH)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["parent_id"] == rid and len(body["children"]) == 2
    for child in body["children"]:
        cid, clid = child["replica_id"], child["lease_id"]
        assert cid != rid and clid != lid
        # the parent's applied step is known to the child: retried by its id, it is replayed, not applied again
        again = {**step, "lease_id": clid}
        r = client.post(f"/v1/replicas/{cid}/step", json=again, headers=AUTH)
        assert r.status_code == 200 and r.json()["replayed"] is True
        # the task came along: evaluate works on the child
        assert client.post(f"/v1/replicas/{cid}/evaluate", json={"lease_id": clid}, headers=AUTH).status_code == 200
    assert len(fake.applied) == 1


@pytest.mark.integration
def test_fork_needs_the_parents_lease_and_room(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(1)
    rid, lid = _lease(client)
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": "someone-else", "children": 1}, headers=AUTH)
    assert r.status_code == 409 and "does not hold" in r.json()["error"]
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 8}, headers=AUTH)
    assert r.status_code == 503 and r.json()["kind"] == "capacity"
    r = client.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 0}, headers=AUTH)
    assert r.status_code == 422
    assert fake.forked == []


INFEASIBLE = {"id": "impossible", "instruction": "Make Chrome play DVDs.", "evaluator": {"func": "infeasible"}}


@pytest.mark.integration
def test_osworld_special_actions() -> None:
    p = parse("FAIL")
    assert p.finish and p.declared_infeasible and not p.actions
    assert parse("DONE").finish and not parse("DONE").declared_infeasible
    assert parse("WAIT").actions[0].type == "wait" and not parse("WAIT").finish
    assert not parse("FAIL&click(1,2)").declared_infeasible  # only the last action says it, as in OSWorld


@pytest.mark.integration
def test_an_infeasible_task_scores_the_agents_declared_failure(fake: FakeHost, client: TestClient) -> None:
    fake.up_async(2)
    rid, lid = _lease(client)
    reset = {"lease_id": lid, "task": INFEASIBLE}
    assert client.post(f"/v1/replicas/{rid}/reset", json=reset, headers=AUTH).status_code == 200

    def step(action_id: str, actions: list[dict[str, object]]) -> float:
        body = {"lease_id": lid, "action_id": action_id, "actions": actions}
        assert client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH).status_code == 200
        r = client.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH)
        assert r.status_code == 200, r.text
        return float(r.json()["reward"])

    assert step("a1", [{"type": "click", "x": 1, "y": 1}]) == 0.0
    assert step("a2", [{"type": "terminate", "status": "failure"}]) == 1.0
    assert step("a3", [{"type": "terminate", "status": "success"}]) == 0.0  # the last action counts
    # Through OSGym, OSWorld's own FAIL action ends the episode with its score.
    r = client.post("/reset", json={"task_config": INFEASIBLE, "timeout": 600}, headers=AUTH)
    assert r.status_code == 200, r.text
    r = client.post("/step", json={"action": "FAIL", "vm_id": r.json()["vm_id"]}, headers=AUTH)
    assert r.status_code == 200 and r.json()["is_finish"] and r.json()["reward"] == 1.0
