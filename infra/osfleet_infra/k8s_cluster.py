"""What the ``k8s`` stack asks the cluster before it declares anything, so that bad input is one line at
preview rather than an ``up`` that waits ten minutes for pods that can never run:

- the cluster answers at all (the kubeconfig the engine's provider uses: ``KUBECONFIG``);
- some node carries the KVM label (the agent DaemonSet's node selector matches nothing otherwise);
- a ``containerImage`` that nodes cannot pull (``localhost/...`` as ``osfleet image container`` names them, or
  ``imagePullPolicy: Never``) is on at least one KVM node;
- the address clients reach the gateway's NodePort at: a schedulable real node's (ExternalIP, else InternalIP);
  simulated nodes (kwok) carry a NoSchedule taint and are never it.

Read with lightkube (the client the gateway's discovery uses), with a short timeout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from osfleet_infra.settings import ConfigError

TIMEOUT_SECONDS = 10.0
NEVER_PULLED = ("localhost/",)


class ClusterError(pulumi.RunError):
    """The cluster cannot be asked (no kubeconfig, nothing answers): one line naming the kubeconfig."""


@dataclass(frozen=True)
class ClusterFacts:
    kvm_nodes: tuple[str, ...]
    image_nodes: tuple[str, ...]  # KVM nodes that hold the image already
    address: str | None  # where a NodePort is reached from outside the cluster


def kubeconfig_path() -> str:
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def read_cluster(label: tuple[str, str], image: str, pull_policy: str) -> ClusterFacts:
    """Ask the cluster; raise ``ClusterError``/``ConfigError`` with one line when the stack cannot work there."""
    nodes = _nodes()
    kvm = [n for n in nodes if (n.metadata.labels or {}).get(label[0]) == label[1]]
    if not kvm:
        raise ConfigError(
            "kvmNodeLabel",
            f"no node of the cluster is labelled {label[0]}={label[1]} (label the KVM nodes: "
            f"kubectl label node NAME {label[0]}={label[1]})",
        )
    holding = tuple(n.metadata.name for n in kvm if _holds(n, image))
    if not holding and (pull_policy == "Never" or image.startswith(NEVER_PULLED)):
        raise ConfigError(
            "containerImage",
            f"{image} is on none of the {len(kvm)} KVM node(s) and cannot be pulled; build and import it with "
            "'osfleet image container' (or push it to a registry the nodes pull from)",
        )
    return ClusterFacts(tuple(n.metadata.name for n in kvm), holding, _address(nodes))


def _nodes() -> list[Any]:
    import httpx2
    from lightkube import Client, KubeConfig
    from lightkube import ConfigError as KubeConfigError
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Node

    path = kubeconfig_path()
    try:
        config = KubeConfig.from_env()
        context = config.get()
        if context is None:
            raise ClusterError(
                f"kubeconfig {path} names no current context (run 'osfleet lab k8s up', or set KUBECONFIG)"
            )
        server = context.cluster.server
        client = Client(config, timeout=httpx2.Timeout(TIMEOUT_SECONDS), trust_env=False)
        return list(client.list(Node))
    except KubeConfigError as exc:
        raise ClusterError(f"kubeconfig {path}: {exc} (run 'osfleet lab k8s up', or set KUBECONFIG)") from None
    except FileNotFoundError:
        raise ClusterError(f"kubeconfig {path}: no such file (run 'osfleet lab k8s up', or set KUBECONFIG)") from None
    except (httpx2.HTTPError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"kubeconfig {path}: the cluster at {server} is unreachable ({reason})") from None
    except ApiError as exc:
        raise ClusterError(f"kubeconfig {path}: the cluster at {server} refused to list nodes ({exc})") from None


def _holds(node: Any, image: str) -> bool:
    images = (node.status.images if node.status else None) or []
    return any(image in (i.names or []) for i in images)


def _ready(node: Any) -> bool:
    conds = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


def _address(nodes: list[Any]) -> str | None:
    """A Ready node that takes ordinary pods (no NoSchedule taint, not cordoned): its ExternalIP, else InternalIP."""
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        taints = (node.spec.taints if node.spec else None) or []
        if not _ready(node) or (node.spec and node.spec.unschedulable) or any(t.effect == "NoSchedule" for t in taints):
            continue
        addresses = {a.type: a.address for a in ((node.status.addresses if node.status else None) or [])}
        found = addresses.get("ExternalIP") or addresses.get("InternalIP")
        if found:
            return str(found)
    return None
