"""The k8s lab's one state file and its layout on disk: what ``up`` made, so ``down`` removes exactly that.

Everything of the cluster lives under one folder (``$OSFLEET_HOME/k8s-lab``) and one network namespace
(``osfl-k8s``): the control plane, containerd, the kubelet and the pods' bridge all run in that namespace, so
the cluster's iptables rules, routes and forwarding setting are the namespace's and vanish with it, and a pod
has no route off the machine (the namespace's only link is the veth to this machine, with no default route).
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from osfleet.config import Settings
from osfleet.errors import ConfigError

NETNS = "osfl-k8s"  # also the prefix of the veth pair (osfl-k8s-h on this machine, osfl-k8s-n in the namespace)
NODE_NAME = "osfleet-node"
NAME_PREFIX = "osfleet-k8s-"  # the node's replicas (OSFLEET_NAME_PREFIX of its host agent)
CGROUP_ROOT = "osfleet-k8s"  # the kubelet's cgroup root under every v1 hierarchy
CLUSTER_DOMAIN = "cluster.local"
KVM_LABEL = ("osfleet.io/kvm", "true")
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
KWOK_POD_CIDR = "127.64.0.0/16"  # kwok's simulated pods answer at loopback addresses: never a real network
# The kubelet sets these on start; ``down`` puts back what was there before ``up``.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)  # fmt: skip
STATE_NAME = "k8s-lab.json"


def lab_root(settings: Settings | None = None) -> Path:
    """The k8s lab's folder on this machine."""
    return (settings or Settings.from_env()).home / "k8s-lab"


@dataclass(frozen=True)
class Addresses:
    """The lab's addresses, all inside one /24 no address or route of this machine uses.

    ``.0/30``: the veth link (this machine .1, the node .2: the API server, NodePorts, CoreDNS); ``.64/26``: the
    node's pods (bridge ``osfk8s0``, gateway .65); ``.128/25``: Service ClusterIPs (the API server's at .129).
    """

    subnet: str

    @property
    def net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    def _at(self, offset: int) -> str:
        return str(self.net.network_address + offset)

    @property
    def host(self) -> str:
        return self._at(1)

    @property
    def node(self) -> str:
        return self._at(2)

    @property
    def pods(self) -> str:
        return f"{self._at(64)}/26"

    @property
    def services(self) -> str:
        return f"{self._at(128)}/25"

    @property
    def kubernetes_service(self) -> str:
        return self._at(129)


@dataclass
class KubeLabState:
    """What ``up`` made: the folder, the addresses, the processes, the kwok nodes, the sysctls it found."""

    root: str
    subnet: str
    tools: str  # the cluster's bin folder (scripts/build-k8s)
    kwok_nodes: int = 0
    kwok_kvm: bool = False
    pids: dict[str, int] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    ready: bool = False

    @property
    def addresses(self) -> Addresses:
        return Addresses(self.subnet)

    @property
    def dir(self) -> Path:
        return Path(self.root)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def api_url(self) -> str:
        return f"https://{self.addresses.node}:6443"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def node_home(self) -> Path:
        """The real node's osfleet store (its host agent's OSFLEET_HOME: golden images, replicas' disks)."""
        return self.dir / "node"

    @property
    def memory_dir(self) -> Path:
        """The node's RAM files of saved replica states (tmpfs, as /dev/shm/osfleet is for a bare-metal host)."""
        return Path("/dev/shm") / "osfleet-k8s"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def state_path(root: Path) -> Path:
    return root / STATE_NAME


def load(root: Path) -> KubeLabState | None:
    """The k8s lab's state, or None when none is up."""
    path = state_path(root)
    if not path.exists():
        return None
    try:
        return KubeLabState(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"unreadable k8s lab state {path} ({exc}); run 'osfleet lab k8s down'") from None


def save(state: KubeLabState) -> None:
    """Written atomically (temporary file, fsync, rename): a crash never leaves half a state file."""
    path = state_path(state.dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state.to_json(), f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
