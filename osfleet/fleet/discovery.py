"""The gateway's hosts found in Kubernetes: the pods of the host-agent DaemonSet and the nodes they run on.

Inside a cluster the gateway does not need a host list: it watches the agent pods (a label selector in its own
namespace) and the nodes, with a service account that may only read those (the ``k8s`` stack's Role and
ClusterRole), so nodes that join or leave are followed with no change of configuration.

A host is a node: its name in fleet ids is the node's (made a valid host name), and its URL the address of the
agent pod there now. That keeps a replica's fleet id valid across its agent's restart: the DaemonSet's new pod
on the same node adopts the node's replicas (their records are on the node's disk) and the host's URL simply
moves to it. Kubernetes' view is one reason a host is out of service; the gateway's own polling (``hosts.py``)
is the other: a pod reported Ready whose agent does not answer is drained like any silent host. Holds by
Kubernetes' view, each with its reason (a host serves only with none):

- ``pod``: no agent pod on the node (deleted, evicted, not scheduled yet) or the pod is not Ready;
- ``node``: the node is cordoned or drained (``spec.unschedulable``), or left the cluster.

A node that goes away keeps its host entry, drained with the reason, so calls for its replicas are answered
503 with that reason (an infrastructure failure, never a reward) rather than 404.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.errors import ConfigError
from osfleet.fleet.hosts import HostEntry, HostPool

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0  # a watch that broke (API server restarting, a network blip) is resumed after this
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Discovery:
    """Where the agents are: pods matching ``selector`` in ``namespace``, serving ``scheme`` on ``port``.

    ``token``/``ca_file``: the agents' operator token and the CA their certificate is verified against;
    ``tls_name``: the name their certificate is verified for (pods' addresses change, so they are not in it);
    ``kubeconfig``: outside a cluster, the cluster to watch (inside, the pod's service account)."""

    selector: str
    namespace: str | None
    port: int
    token: str
    scheme: str = "https"
    ca_file: Path | None = None
    tls_name: str | None = None
    kubeconfig: Path | None = None

    def labels(self) -> dict[str, str]:
        """``key=value[,key=value]`` as lightkube's label filter."""
        out = {}
        for part in self.selector.split(","):
            key, eq, value = part.strip().partition("=")
            if not eq or not key:
                raise ConfigError(f"--discover-pods {self.selector!r}: expected key=value[,key=value]")
            out[key] = value
        return out


def host_name(node: str) -> str:
    """A node's name as a fleet host name (lower case letters, digits and dashes, at most 63)."""
    name = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-")[:63]
    if not name:
        raise ValueError(f"node name {node!r} gives no host name")
    return name


def _ready(pod: Any) -> bool:
    conds = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


class KubeDiscovery:
    """Keeps a ``HostPool`` in step with the cluster: one task watching the agent pods, one watching nodes."""

    def __init__(self, d: Discovery, pool: HostPool, client_factory: Callable[[], Any] | None = None) -> None:
        self.d = d
        self.pool = pool
        self._client_factory = client_factory or self._client
        self._pod_of_node: dict[str, str] = {}  # node -> the agent pod that serves it now
        self._node_holds: dict[str, str | None] = {}  # node -> why it takes no work (cordoned, gone), or None

    def _client(self) -> Any:
        from lightkube import AsyncClient, KubeConfig

        config = KubeConfig.from_file(self.d.kubeconfig) if self.d.kubeconfig else KubeConfig.from_env()
        return AsyncClient(config, namespace=self.namespace(), trust_env=False)

    def namespace(self) -> str:
        if self.d.namespace:
            return self.d.namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except OSError:
            raise ConfigError("--discover-namespace is needed outside a pod (no service account namespace)") from None

    async def run(self) -> None:
        """Watch pods and nodes until cancelled; a broken watch is resumed (the pool keeps its last view)."""
        client = self._client_factory()
        try:
            await asyncio.gather(self._watch(client, "pods"), self._watch(client, "nodes"))
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                await close()

    async def _watch(self, client: Any, kind: str) -> None:
        from lightkube.resources.core_v1 import Node, Pod
        from lightkube.types import OnErrorAction, OnErrorResult

        def retry(exc: Exception, count: int) -> OnErrorResult:
            log.warning("watching %s broke (%s); resuming in %.0f s", kind, str(exc)[:160], RETRY_SECONDS)
            return OnErrorResult(OnErrorAction.RETRY, sleep=RETRY_SECONDS)

        if kind == "pods":
            stream = client.watch(Pod, namespace=self.namespace(), labels=self.d.labels(), on_error=retry)
        else:
            stream = client.watch(Node, on_error=retry)
        async for event, obj in stream:
            if kind == "pods":
                self.on_pod(event, obj)
            else:
                self.on_node(event, obj)

    # --- events (plain methods: tested without a cluster) ---------------------------------------------------------
    def on_pod(self, event: str, pod: Any) -> None:
        node = pod.spec.nodeName if pod.spec else None
        if not node:
            return  # not scheduled yet: no host to speak of
        name, pod_name = host_name(node), pod.metadata.name
        current = self._pod_of_node.get(node)
        gone = event == "DELETED" or pod.metadata.deletionTimestamp is not None
        if gone:
            if current == pod_name:
                del self._pod_of_node[node]
                self.pool.hold(name, "pod", f"the agent pod {pod_name} on node {node} is gone; waiting for another")
            return
        ip = pod.status.podIP if pod.status else None
        if not ip:
            return
        self._pod_of_node[node] = pod_name
        url = f"{self.d.scheme}://{ip}:{self.d.port}"
        self.pool.upsert(HostEntry(name=name, url=url, token=self.d.token, ca_file=self.d.ca_file), self.d.tls_name)
        self.pool.hold(name, "node", self._node_holds.get(node))  # its node's state may have come first
        if _ready(pod):
            self.pool.hold(name, "pod", None)
        else:
            self.pool.hold(name, "pod", f"the agent pod {pod_name} on node {node} is not Ready")

    def on_node(self, event: str, node: Any) -> None:
        node_name = node.metadata.name
        if event == "DELETED":
            reason: str | None = f"node {node_name} left the cluster"
        elif node.spec is not None and node.spec.unschedulable:
            reason = f"node {node_name} is cordoned or drained"
        else:
            reason = None
        self._node_holds[node_name] = reason
        name = host_name(node_name)
        if self.pool.known(name):  # else no agent there (yet): applied when its pod shows up
            self.pool.hold(name, "node", reason)
