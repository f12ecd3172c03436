"""The gateway's hosts found in Kubernetes (``osfleet.fleet.discovery``): agent pods and nodes as the API server
reports them (lightkube's own models), real host agents on loopback behind them (fake guests, no VM), the pool's
real polling. The cluster itself is the one thing stood in for here (a cluster runs in the slow k8s tests)."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from lightkube.models.core_v1 import NodeSpec, PodCondition, PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from osfleet.fleet.discovery import Discovery, KubeDiscovery, host_name
from osfleet.fleet.hostclient import HostClient, HostConnectError
from osfleet.fleet.hosts import HostPool
from osfleet.tls import issue, make_ca
from tests.fakes import FakeHost
from tests.test_fleet import free_port

pytestmark = pytest.mark.unit

TOKEN = "agent-token"
LABELS = "app.kubernetes.io/name=osfleet-agent"


class LoopbackAgent:
    """A real host agent (uvicorn) on one loopback address, over a fake host kept in ``folder``."""

    def __init__(self, folder: Path, addr: str, port: int) -> None:
        self.host, self.addr, self.port = FakeHost(folder, ready=1, max_replicas=4), addr, port
        app = create_app(AgentConfig(token=TOKEN), lambda: self.host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=addr, port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def agents(tmp_path: Path, port: int) -> Iterator[list[LoopbackAgent]]:
    made: list[LoopbackAgent] = []
    yield made
    for a in made:
        a.stop()


def pod(name: str, node: str | None, ip: str | None, ready: bool = True, deleting: bool = False) -> Pod:
    return Pod(
        metadata=ObjectMeta(
            name=name, namespace="osfleet", deletionTimestamp="2026-01-01T00:00:00Z" if deleting else None
        ),
        spec=PodSpec(containers=[], nodeName=node),
        status=PodStatus(podIP=ip, conditions=[PodCondition(type="Ready", status="True" if ready else "False")]),
    )


def node(name: str, cordoned: bool = False) -> Node:
    return Node(metadata=ObjectMeta(name=name), spec=NodeSpec(unschedulable=cordoned or None))


def discovery(port: int, **over: Any) -> Discovery:
    return Discovery(
        **{"selector": LABELS, "namespace": "osfleet", "port": port, "token": TOKEN, "scheme": "http", **over}
    )


def test_nodes_joining_moving_cordoned_and_gone_are_followed(
    tmp_path: Path, port: int, agents: list[LoopbackAgent]
) -> None:
    async def scenario() -> None:
        async with HostClient() as client, HostClient() as polls:
            pool = HostPool([], client, "gateway-under-test", polls)
            kd = KubeDiscovery(discovery(port), pool)
            agents.append(LoopbackAgent(tmp_path / "a", "127.0.0.1", port))
            kd.on_pod("ADDED", pod("agent-x1", "node-a.example", "127.0.0.1"))
            kd.on_pod("ADDED", pod("agent-y1", None, None))  # not scheduled yet: nothing to route
            await pool.poll_once()
            (a,) = pool.hosts
            assert a.name == "node-a-example" and a.entry.url == f"http://127.0.0.1:{port}" and a.healthy

            # A pod Kubernetes reports not Ready takes no work, whatever its agent answers.
            agents.append(LoopbackAgent(tmp_path / "b", "127.0.0.2", port))
            kd.on_pod("ADDED", pod("agent-z1", "node-b", "127.0.0.2", ready=False))
            await pool.poll_once()
            b = pool.get("node-b")
            assert not b.healthy and b.reason == "the agent pod agent-z1 on node node-b is not Ready"
            kd.on_pod("MODIFIED", pod("agent-z1", "node-b", "127.0.0.2"))
            await pool.poll_once()
            assert b.healthy

            # Cordoned (kubectl drain): drained with the reason, and its polls do not bring it back.
            kd.on_node("MODIFIED", node("node-a.example", cordoned=True))
            await pool.poll_once()
            assert not a.healthy and a.reason == "node node-a.example is cordoned or drained"
            kd.on_node("MODIFIED", node("node-a.example"))
            await pool.poll_once()
            assert a.healthy

            # The agent pod replaced (deleted, the DaemonSet's new one elsewhere): the host keeps its name and
            # place, so fleet ids naming it stay valid, and serves again from the new address once polled.
            kd.on_pod("MODIFIED", pod("agent-x1", "node-a.example", "127.0.0.1", deleting=True))
            assert not a.healthy and "agent-x1 on node node-a.example is gone" in a.reason
            agents[0].stop()
            agents[0] = LoopbackAgent(tmp_path / "a", "127.0.0.3", port)  # its records on the node's disk
            kd.on_pod("ADDED", pod("agent-x2", "node-a.example", "127.0.0.3", ready=False))
            kd.on_pod("DELETED", pod("agent-x1", "node-a.example", "127.0.0.1"))  # late: the old pod's end
            kd.on_pod("MODIFIED", pod("agent-x2", "node-a.example", "127.0.0.3"))
            assert pool.get("node-a-example") is a and a.index == 0 and a.entry.url == f"http://127.0.0.3:{port}"
            assert not a.healthy  # until polled at its new address
            await pool.poll_once()
            assert a.healthy

            # Ready but silent: treated as any host that stops answering.
            agents[1].stop()
            for _ in range(2):
                await pool.poll_once()
            assert not b.healthy and b.reason.startswith("host node-b is not answering its health checks")

            # A node that leaves keeps its entry, drained with the reason (its replicas' calls get a 503 naming it).
            kd.on_node("DELETED", node("node-a.example"))
            await pool.poll_once()
            assert not a.healthy and a.reason == "node node-a.example left the cluster"

    asyncio.run(scenario())


def test_a_node_cordoned_before_its_agent_pod_shows_up_starts_drained(tmp_path: Path, port: int) -> None:
    async def scenario() -> None:
        async with HostClient() as client, HostClient() as polls:
            pool = HostPool([], client, "gateway-under-test", polls)
            kd = KubeDiscovery(discovery(port), pool)
            kd.on_node("ADDED", node("node-c", cordoned=True))
            kd.on_pod("ADDED", pod("agent-c", "node-c", "127.0.0.1"))
            assert pool.get("node-c").reason == "node node-c is cordoned or drained"

    asyncio.run(scenario())


class FakeWatches:
    """Stands in for the API server's watch streams (lightkube's AsyncClient.watch), one list of events per kind."""

    def __init__(self, events: dict[type, list[tuple[str, Any]]]) -> None:
        self.events, self.calls, self.closed = events, [], False

    def watch(self, res: type, **kw: Any) -> AsyncIterator[tuple[str, Any]]:
        self.calls.append((res, kw))

        async def stream() -> AsyncIterator[tuple[str, Any]]:
            for e in self.events.get(res, []):
                yield e
            await asyncio.Event().wait()  # a watch stays open

        return stream()

    async def close(self) -> None:
        self.closed = True


def test_the_watches_ask_for_the_agent_pods_of_the_namespace_and_the_nodes(port: int) -> None:
    async def scenario() -> FakeWatches:
        fake = FakeWatches({Pod: [("ADDED", pod("agent-1", "node-1", "127.0.0.1"))], Node: [("ADDED", node("node-1"))]})
        async with HostClient() as client, HostClient() as polls:
            pool = HostPool([], client, "gateway-under-test", polls)
            task = asyncio.create_task(KubeDiscovery(discovery(port), pool, lambda: fake).run())
            for _ in range(100):
                if pool.known("node-1"):
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool.get("node-1").entry.url == f"http://127.0.0.1:{port}"
        return fake

    fake = asyncio.run(scenario())
    assert [(res, kw["namespace"] if res is Pod else None) for res, kw in fake.calls] == [
        (Pod, "osfleet"),
        (Node, None),
    ]
    assert fake.calls[0][1]["labels"] == {"app.kubernetes.io/name": "osfleet-agent"}
    assert fake.closed


def test_host_names_from_node_names_and_bad_selectors() -> None:
    assert host_name("ip-10-0-0-5.ec2.internal") == "ip-10-0-0-5-ec2-internal"
    assert host_name("Node_A") == "node-a"
    assert len(host_name("n" * 80)) == 63
    from osfleet.errors import ConfigError

    with pytest.raises(ConfigError, match="expected key=value"):
        discovery(1, selector="app").labels()


def test_an_agent_is_verified_for_the_name_its_certificate_gives_not_its_address(tmp_path: Path) -> None:
    """Pods' addresses change, so the agents' certificate names their Service; the gateway checks that name."""
    ca = make_ca("test CA")
    pair = issue(ca, ["osfleet-agent.osfleet.svc"])
    (tmp_path / "ca.pem").write_text(ca.cert_pem)
    (tmp_path / "cert.pem").write_text(pair.cert_pem)
    (tmp_path / "key.pem").write_text(pair.key_pem)

    async def scenario() -> None:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server, HostClient() as client:
            client.verify_with(url, tmp_path / "ca.pem")
            with pytest.raises(HostConnectError):
                await client.get(url + "/health", timeout=5)
            client.verify_with(url, tmp_path / "ca.pem", "osfleet-agent.osfleet.svc")
            assert (await client.get(url + "/health", timeout=5)).content == b"ok"

    asyncio.run(scenario())
