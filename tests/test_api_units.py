"""Action strings, task model and reward arithmetic, OSWorld subset, auth and error mapping (no replica booted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.osgym_actions import ActionStringError, parse
from osfleet.config import AgentConfig, Settings
from osfleet.images import GoldenImage
from osfleet.replicas.manager import ReplicaHost
from osfleet.tasks.model import CriterionResult, Match, TaskError, UnsupportedTaskError, parse_task, score

TOKEN = "test-token-123"


def test_osgym_action_strings() -> None:
    p = parse("click(10,20)&type(a & b, c)&hotkey(ctrl,s)&scroll(5,6,50)&scroll(5,6,-50)&left_double(1,2)")
    assert [a.type for a in p.actions] == ["click", "type", "hotkey", "scroll", "scroll", "double_click"]
    assert p.actions[1].text == "a & b, c"  # type: ignore[union-attr]
    assert p.actions[2].keys == ["ctrl", "s"]  # type: ignore[union-attr]
    assert p.actions[3].clicks < 0 < p.actions[4].clicks  # type: ignore[union-attr]
    assert not p.finish
    assert parse("finish()").finish and parse("call_user()").finish and parse("wait()").actions[0].type == "wait"
    assert parse("drag(1,2,3,4)&right_single(5,6)").actions[0].type == "drag"


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


def test_osworld_subset_converts() -> None:
    t = parse_task(osworld())
    assert t.source == "osworld" and [s.type for s in t.setup] == ["run", "sleep", "launch", "launch", "run"]
    assert [c.check.type for c in t.criteria] == ["command_output", "file_content"]
    assert t.setup[0].command == "touch /tmp/x"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"config": [{"type": "download", "parameters": {}}]}, "set-up type 'download'"),
        ({"evaluator": {"func": "compare_table", "result": {}, "expected": {}}}, "metric 'compare_table'"),
        (
            {
                "evaluator": {
                    "func": "exact_match",
                    "result": {"type": "cloud_file"},
                    "expected": {"type": "rule", "rules": {}},
                }
            },
            "result type 'cloud_file'",
        ),
        ({"evaluator": {"func": ["exact_match"], "conj": "or", "result": [], "expected": []}}, "conj 'or'"),
    ],
)
def test_unsupported_osworld_types_are_refused_by_name(change: dict[str, object], named: str) -> None:
    with pytest.raises(UnsupportedTaskError, match=named):
        parse_task(osworld(**change))


def test_bad_osfleet_task_is_one_line() -> None:
    with pytest.raises(TaskError, match="criteria"):
        parse_task({"id": "x", "instruction": "y", "criteria": []})


@pytest.fixture
def client(golden: GoldenImage, settings: Settings) -> Iterator[TestClient]:
    config = AgentConfig(token=TOKEN, warm=0, osgym_allowed_ips=("allowed-host",))
    app = create_app(config, lambda: ReplicaHost(golden, settings, warm=0, auto_recover=False))
    with TestClient(app) as c:
        yield c


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_every_api_endpoint_needs_the_token(client: TestClient) -> None:
    for method, path in [
        ("post", "/v1/leases"),
        ("get", "/v1/replicas"),
        ("post", "/v1/replicas/r-x/reset"),
        ("get", "/v1/replicas/r-x/observation"),
        ("post", "/v1/replicas/r-x/step"),
        ("post", "/v1/replicas/r-x/evaluate"),
        ("post", "/v1/replicas/r-x/release"),
        ("post", "/reset"),
        ("post", "/step"),
        ("post", "/shutdown"),
        ("get", "/screenshot"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            resp = getattr(client, method)(path, headers=headers)
            assert resp.status_code == 401, (method, path, headers)
            assert resp.headers["www-authenticate"] == "Bearer"
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 401  # the test client is not on loopback
    assert client.get("/metrics", headers=AUTH).status_code == 200


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


def test_openapi_is_published(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/leases", "/v1/replicas/{rid}/step", "/reset", "/step", "/shutdown", "/screenshot", "/metrics"):
        assert p in paths
