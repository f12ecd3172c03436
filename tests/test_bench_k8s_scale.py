"""``osfleet bench k8s-scale`` without a cluster: its sizes and label plan, what it reads of a process from
``/proc`` (this test's own process, and a folder laid out as /proc is), the gateway's answers it waits for (a real
HTTP server on loopback), and its table. The run itself needs a k8s lab (docs/benchmarks: the measured page)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from osfleet.bench.k8s_scale import (
    cost_over,
    find_processes,
    gateway_hosts,
    judged,
    label_plan,
    parse_sizes,
    sample_process,
    table,
    wait_for_gateway,
)
from osfleet.cli import cli
from osfleet.errors import ConfigError, OsfleetError
from tests.json_server import Request, json_server

pytestmark = pytest.mark.unit


def test_sizes_are_ascending_and_bad_ones_are_named() -> None:
    assert parse_sizes("200,10,50,10") == [10, 50, 200]
    with pytest.raises(ConfigError, match="comma"):
        parse_sizes("10;50")
    with pytest.raises(ConfigError, match="at least 1"):
        parse_sizes("0,5")


def test_the_label_plan_makes_exactly_the_first_kwok_nodes_hosts() -> None:
    nodes = [f"kwok-node-{i}" for i in (3, 1, 12, 2)]
    assert label_plan(nodes, 3) == (["kwok-node-1", "kwok-node-2"], ["kwok-node-3", "kwok-node-12"])
    assert label_plan(nodes, 1) == ([], ["kwok-node-1", "kwok-node-2", "kwok-node-3", "kwok-node-12"])
    with pytest.raises(ConfigError, match="--kwok-nodes 9"):
        label_plan(nodes, 10)


def test_a_process_is_read_from_proc(tmp_path: Path) -> None:
    import os

    me = sample_process(os.getpid())
    assert me is not None and me.rss_bytes > 10 * 2**20 and me.cpu_ticks > 0
    fake = tmp_path / "4242"
    fake.mkdir()
    # comm with a space and a parenthesis, as a process may name itself: fields are read after the last ")"
    (fake / "stat").write_text("4242 (odd) name) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0\n")
    (fake / "status").write_text("Name:\todd\nVmRSS:\t  2048 kB\n")
    (fake / "cmdline").write_bytes(b"/usr/bin/python3\0/venv/bin/osfleet\0fleet\0serve\0--port\x008443\0")
    got = sample_process(4242, tmp_path)
    assert got is not None and (got.cpu_ticks, got.rss_bytes) == (300, 2 * 2**20)
    assert find_processes(("osfleet", "fleet", "serve"), tmp_path) == [4242]
    assert find_processes(("osfleet", "host", "serve"), tmp_path) == []
    assert sample_process(999999, tmp_path) is None
    [row] = cost_over([4242], 0.05, tmp_path)
    assert row == {"pid": 4242, "cpu_percent": 0.0, "rss_mib": 2.0}


class _Gateway:
    """The gateway's next answers, in order (the last one repeats); only token ``t`` gets the body."""

    answers: list[tuple[int, dict[str, Any]]] = []

    @classmethod
    def answer(cls, request: Request) -> tuple[int, dict[str, Any]]:
        status, body = cls.answers.pop(0) if len(cls.answers) > 1 else cls.answers[0]
        return status, body if request.headers.get("Authorization") == "Bearer t" else {}


@pytest.fixture
def gateway() -> Iterator[str]:
    with json_server(_Gateway.answer) as (url, _):
        yield url


def test_the_gateway_is_waited_for_until_every_host_is_listed_and_judged(gateway: str) -> None:
    ctx = ssl.create_default_context()
    one = {"osfleet-node": {"healthy": True, "reason": None}}
    unjudged = {**one, "kwok-node-1": {"healthy": False, "reason": None}}
    down = {**one, "kwok-node-1": {"healthy": False, "reason": "connect: refused"}}
    _Gateway.answers = [(503, {"status": "failing"}), (200, {"hosts": one}), (200, {"hosts": unjudged}),
                        (200, {"hosts": down})]  # fmt: skip
    got = wait_for_gateway(gateway, "t", ctx, 2, timeout=30)
    assert got["hosts_seen"] == 2 and got["healthy"] == 1
    assert 0 < got["discovered_seconds"] <= got["judged_seconds"]
    assert judged(down) and not judged(unjudged)
    _Gateway.answers = [(503, {"status": "failing", "hosts": down})]  # no host healthy: 503, still the hosts
    assert gateway_hosts(gateway, "t", ctx) == down
    _Gateway.answers = [(200, {"hosts": one})]
    with pytest.raises(OsfleetError, match="listed 1 of 5 hosts"):
        wait_for_gateway(gateway, "t", ctx, 5, timeout=1)
    assert gateway_hosts("http://127.0.0.1:9", "t", ctx) is None  # nothing listens: no answer, no raise


def test_the_table_takes_the_busiest_gateway_replica() -> None:
    result = {"sizes": [{"hosts": 10, "up_seconds": 40.5, "discovered_seconds": 3.1, "judged_seconds": 5.0,
                         "gateway": [{"pid": 1, "cpu_percent": 2.5, "rss_mib": 90.0},
                                     {"pid": 2, "cpu_percent": 4.0, "rss_mib": 88.0}],
                         "apiserver": [{"pid": 3, "cpu_percent": 12.25, "rss_mib": 400.0}],
                         "preview_seconds": 9.0, "destroy_seconds": 20.0}]}  # fmt: skip
    lines = table(result).splitlines()
    assert len(lines) == 3
    assert lines[2] == "| 10 | 40.5 s | 3.1 s | 5.0 s | 4.0 % | 90.0 MiB | 12.2 % | 9.0 s | 20.0 s |"


def test_without_a_lab_the_command_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    out = CliRunner().invoke(cli, ["bench", "k8s-scale", "--hosts", "10,50"])
    assert out.exit_code != 0
    assert out.output.strip().splitlines()[-1] == "osfleet: error: no k8s lab is up: osfleet lab k8s up --kwok-nodes 49"
    bad = CliRunner().invoke(cli, ["bench", "k8s-scale", "--hosts", "ten"])
    assert bad.exit_code != 0 and "expected host counts" in bad.output
