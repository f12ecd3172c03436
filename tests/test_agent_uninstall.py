"""A host agent in a DaemonSet's pod tells a restart from an uninstall by asking for its DaemonSet (a real HTTP
server on loopback plays the API server): it tears the node's replicas down only when the DaemonSet is being
deleted or gone, or its account was removed after it could read it; anything unclear keeps them. The whole path
on a real cluster (``pulumi destroy`` leaves no replica domain) is in ``osfleet bench k8s-faults`` and
``tests/test_k8s_e2e.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.api.uninstall import DAEMONSET_ENV, DaemonSetOwner, check_at_start, uninstalled
from tests.json_server import Request, json_server

pytestmark = pytest.mark.unit


class _ApiServer:
    """What the API server answers now (a test sets it), and what it was asked."""

    answer: tuple[int, Any] = (200, {})
    seen: list[Request] = []


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[DaemonSetOwner]:
    (tmp_path / "token").write_text("sa-token\n")
    with json_server(lambda _request: _ApiServer.answer) as (url, seen):
        _ApiServer.seen = seen
        yield DaemonSetOwner(url, "osfleet", "osfleet-agent", tmp_path / "token", None)


def test_the_daemonset_there_is_a_restart_and_the_replicas_stay(owner: DaemonSetOwner) -> None:
    said: list[str] = []
    _ApiServer.answer = (200, {"kind": "DaemonSet", "metadata": {"name": "osfleet-agent"}})
    assert check_at_start(owner, said.append) is True and said == []
    asked = _ApiServer.seen[-1]
    assert (asked.method, asked.path) == ("GET", "/apis/apps/v1/namespaces/osfleet/daemonsets/osfleet-agent")
    assert asked.headers["Authorization"] == "Bearer sa-token"
    assert owner.verdict(True) == "present"
    assert uninstalled(owner, True, said.append) is False
    assert "a restart" in said[-1]


@pytest.mark.parametrize(
    ("answer", "readable_at_start", "verdict"),
    [
        ((200, {"metadata": {"deletionTimestamp": "2026-12-05T18:00:00Z"}}), True, "deleting"),  # foreground delete
        ((404, {"reason": "NotFound"}), True, "gone"),
        ((404, {"reason": "NotFound"}), False, "gone"),
        ((403, {"reason": "Forbidden"}), True, "gone"),  # its Role removed with the stack after it could read
        ((401, {"reason": "Unauthorized"}), True, "gone"),  # its account removed: its token no longer valid
        ((403, {"reason": "Forbidden"}), False, "unknown"),  # never could: a misconfiguration, not an uninstall
        ((500, {}), True, "unknown"),
        ((200, ["not", "an", "object"]), True, "unknown"),
    ],
)
def test_verdicts(owner: DaemonSetOwner, answer: tuple[int, Any], readable_at_start: bool, verdict: str) -> None:
    _ApiServer.answer = answer
    assert owner.verdict(readable_at_start) == verdict
    said: list[str] = []
    assert uninstalled(owner, readable_at_start, said.append) is (verdict in ("deleting", "gone"))
    assert len(said) == 1 and "osfleet/osfleet-agent" in said[0]


def test_an_api_server_that_does_not_answer_keeps_the_replicas(owner: DaemonSetOwner, tmp_path: Path) -> None:
    silent = DaemonSetOwner("http://127.0.0.1:9", "osfleet", "osfleet-agent", owner.token_file, None)
    said: list[str] = []
    assert silent.read() == (None, None)
    assert uninstalled(silent, True, said.append) is False and "the replicas stay" in said[0]
    assert check_at_start(silent, said.append) is False and "no answer" in said[-1]
    tokenless = DaemonSetOwner(owner.api, "osfleet", "osfleet-agent", tmp_path / "missing", None)
    assert tokenless.verdict(True) == "unknown"


def test_only_a_pod_of_the_stacks_daemonset_has_an_owner(tmp_path: Path) -> None:
    account = tmp_path / "serviceaccount"
    env = {DAEMONSET_ENV: "osfleet-agent", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert DaemonSetOwner.from_env(env, account) is None  # no account mounted
    account.mkdir()
    (account / "token").write_text("t")
    (account / "namespace").write_text("fleet-a\n")
    (account / "ca.crt").write_text("pem")
    got = DaemonSetOwner.from_env(env, account)
    assert got == DaemonSetOwner("https://10.96.0.1:443", "fleet-a", "osfleet-agent", account / "token",
                                 account / "ca.crt")  # fmt: skip
    assert (
        DaemonSetOwner.from_env({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account).api == "https://[fd00::1]:443"
    )
    assert DaemonSetOwner.from_env({k: v for k, v in env.items() if k != DAEMONSET_ENV}, account) is None
    assert DaemonSetOwner.from_env({DAEMONSET_ENV: "osfleet-agent"}, account) is None  # not in a cluster
    assert uninstalled(None, True, print) is False and check_at_start(None, print) is False
