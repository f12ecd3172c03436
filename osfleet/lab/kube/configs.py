"""Certificates and configuration files of the k8s lab: one CA, a certificate per component, and the files each
component reads (kubeconfigs, the kubelet's and kube-proxy's configurations, containerd's, the CNI network,
CoreDNS's Corefile, kwok's stages).

Client certificates carry the users and groups Kubernetes' RBAC bootstraps rules for (``system:node:<name>`` in
``system:nodes``, ``system:kube-controller-manager``, ...), so each component has exactly the rights the
upstream defaults give it; the admin kubeconfig (``system:masters``) is the operator's, and what
``osfleet infra env`` exports.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from osfleet.lab.kube.state import CGROUP_ROOT, CLUSTER_DOMAIN, KWOK_POD_CIDR, NODE_NAME, KubeLabState
from osfleet.tls import KeyPair, issue, make_ca

CA_DAYS = 30  # a lab lives for hours; a month is ample and short
# (file stem, user, groups): the client certificates; each gets a kubeconfig of the same stem.
CLIENTS = (
    ("admin", "osfleet-admin", ("system:masters",)),
    ("controller-manager", "system:kube-controller-manager", ()),
    ("scheduler", "system:kube-scheduler", ()),
    ("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
    ("kube-proxy", "system:kube-proxy", ()),
    ("coredns", "system:osfleet-coredns", ()),
    ("kwok", "system:osfleet-kwok", ()),
)
BRIDGE = "osfk8s0"


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _pair(d: Path, stem: str, pair: KeyPair) -> None:
    _write(d / f"{stem}.crt", pair.cert_pem)
    _write(d / f"{stem}.key", pair.key_pem, 0o600)


def write_pki(s: KubeLabState) -> None:
    """The CA, the servers' certificates (API server, kubelet), the clients' and the service-account key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d, a = s.dir / "pki", s.addresses
    ca = make_ca("osfleet k8s lab CA", days=CA_DAYS)
    _pair(d, "ca", ca)
    api_names = [a.node, a.kubernetes_service, "127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
                 "kubernetes.default.svc", f"kubernetes.default.svc.{CLUSTER_DOMAIN}"]  # fmt: skip
    _pair(d, "apiserver", issue(ca, api_names, CA_DAYS))
    _pair(d, "kubelet-serving", issue(ca, [a.node, NODE_NAME], CA_DAYS))
    # The API server's identity towards the kubelets (logs, exec): authorised by the kubelet's webhook.
    _pair(d, "apiserver-kubelet-client", issue(ca, [], CA_DAYS, common_name="kube-apiserver-kubelet-client",
                                               groups=("system:masters",), server=False, client=True))  # fmt: skip
    for stem, user, groups in CLIENTS:
        _pair(d, stem, issue(ca, [], CA_DAYS, common_name=user, groups=groups, server=False, client=True))
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    _write(d / "service-account.key", private.decode(), 0o600)
    _write(d / "service-account.pub", public.decode())


def kubeconfig(s: KubeLabState, stem: str) -> str:
    """A kubeconfig with the certificates inlined (so it can be copied as one file)."""
    d = s.dir / "pki"

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "osfleet-lab",
                      "cluster": {"server": s.api_url, "certificate-authority-data": b64(d / "ca.crt")}}],
        "users": [{"name": stem, "user": {"client-certificate-data": b64(d / f"{stem}.crt"),
                                          "client-key-data": b64(d / f"{stem}.key")}}],
        "contexts": [{"name": "osfleet-lab", "context": {"cluster": "osfleet-lab", "user": stem}}],
        "current-context": "osfleet-lab",
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


def write_kubeconfigs(s: KubeLabState) -> None:
    for stem, _, _ in CLIENTS:
        _write(s.dir / f"{stem}.kubeconfig", kubeconfig(s, stem), 0o600)


def kubelet_config(s: KubeLabState) -> str:
    pki = s.dir / "pki"
    doc = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine has cgroup v1 only (a VM whose init is not systemd); v1.35+ refuses it unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "address": s.addresses.node,
        "readOnlyPort": 0,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [s.addresses.node],
        "resolvConf": str(s.dir / "resolv.conf"),  # no upstream servers: nothing outside the cluster resolves
        "containerRuntimeEndpoint": f"unix://{s.containerd_socket}",
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "maxPods": 60,
        # A busy shared machine: evict only when really short (defaults evict at 10 % free disk).
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                         "nodefs.inodesFree": "2%"},
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "hairpinMode": "hairpin-veth",
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "nodeStatusReportFrequency": "20s",
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


def kube_proxy_config(s: KubeLabState) -> str:
    doc = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(s.dir / "kube-proxy.kubeconfig")},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": s.addresses.pods,
        "bindAddress": s.addresses.node,
        "healthzBindAddress": f"{s.addresses.node}:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": ["primary"],  # the node's address only: no NodePort on loopback (route_localnet)
        # Leave the kernel's connection-tracking settings alone (nf_conntrack_max is machine-wide).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    return yaml.safe_dump(doc, sort_keys=False)


CAP_SYS_RESOURCE = 24


def can_lower_oom_scores(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this machine's root may set a negative ``oom_score_adj`` (CAP_SYS_RESOURCE). Some sandboxes (this
    Firecracker VM) drop that capability: runc then fails every pod sandbox ("failed to update
    /proc/self/oom_score_adj: Permission denied", containerd gives pause -998) unless containerd keeps the
    scores at or above its own (``restrict_oom_score_adj``)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def containerd_config(s: KubeLabState, pause_ref: str) -> str:
    c, tools = s.dir / "containerd", Path(s.tools)
    cni = tools.parent / "cni"
    return f"""# containerd of the osfleet k8s lab (osfleet lab k8s up): its own root, state and socket.
version = 3
root = "{c / "root"}"
state = "{c / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{s.containerd_socket}"

[ttrpc]
  address = "{s.containerd_socket}.ttrpc"

[debug]
  address = "{c / "debug.sock"}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{c / "opt"}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause_ref}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  enable_selinux = false
  restrict_oom_score_adj = {"false" if can_lower_oom_scores() else "true"}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni}"]
    conf_dir = "{s.dir / "cni" / "conf"}"
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{tools / "runc"}"
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(s: KubeLabState) -> str:
    """The node's pod network: one bridge, addresses from the pods' /26, no masquerade (nothing leaves)."""
    doc = {
        "cniVersion": "1.0.0",
        "name": "osfleet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": s.addresses.pods}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(s.dir / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(doc, indent=2)


def corefile(s: KubeLabState) -> str:
    """Cluster DNS on the node's address; names outside the cluster get no answer (no forwarder). No ``bind``: the
    multi-call binary carries only the plugins this file uses, and in the lab's network namespace every address
    on port 53 is the node's anyway."""
    node = s.addresses.node
    return f""".:53 {{
    errors
    ready {node}:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {s.dir / "coredns.kubeconfig"}
        pods insecure
    }}
    cache 30
    loadbalance
}}
"""


# What CoreDNS and kwok may do (read Services, EndpointSlices, Namespaces, Pods; kwok plays the kubelet of its
# nodes), bound to their certificates' users.
RBAC = """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:osfleet-coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:osfleet-coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:osfleet-coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:osfleet-coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:osfleet-kwok"}
rules:
- apiGroups: [""]
  resources: [nodes, nodes/status, pods, pods/status]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:osfleet-kwok"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:osfleet-kwok"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:osfleet-kwok"}]
"""


def kwok_node(name: str, index: int, kvm: bool) -> dict[str, object]:
    """A simulated node: kwok plays its kubelet (it manages nodes annotated ``kwok.x-k8s.io/node=fake``); its
    taint keeps every pod that does not tolerate it on real nodes, its address is a loopback one."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "type": "kwok", "osfleet.io/simulated": "true"}  # fmt: skip
    if kvm:
        labels["osfleet.io/kvm"] = "true"
    addr = f"127.65.{index // 250}.{index % 250 + 1}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake",
                                                                     "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": addr}],
        },
    }  # fmt: skip


KWOK_ARGS = ("--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", f"--cidr={KWOK_POD_CIDR}",
             "--node-ip=127.65.255.254", "--node-lease-duration-seconds=40")  # fmt: skip
