"""The ``k8s`` stack: the host agent as a privileged DaemonSet on KVM-labelled nodes, its token in a Secret,
and Locust master + workers with the locustfile in a ConfigMap.

With ``gatewayDiscovery: true``, a fleet gateway (``gatewayReplicas`` pods, default 2, behind a NodePort Service:
``fleetUrl`` is a node's address and that port) that finds the agents in the cluster itself: it watches the
DaemonSet's pods and the nodes with a service account that may read only those (``osfleet.fleet.discovery``), so
nodes joining and leaving need no change of configuration. With a static ``kvmNodes`` list (hosts on their
nodes' addresses), a gateway over that list instead. The gateway has a token of its own (config
``gatewayToken``, secret; by default derived one-way from the agents' token) that its clients — Locust
included — use; only the gateway holds the agents' token (a mounted file), so a gateway client cannot call an
agent as its operator.

Every listener speaks HTTPS with certificates the stack makes (``CertificateAuthority``, as on bare metal): the
agents' for their Service names and the KVM nodes' addresses (Secret ``osfleet-agent-tls``), the gateway's for its
Service names (``osfleet-gateway-tls``); the CA's certificate alone (``osfleet-ca``) is what the gateway and
Locust mount to verify them. Probes use HTTPS (the kubelet does not verify probe certificates).

Before declaring anything the program asks the cluster (``k8s_cluster.py``): that it answers, that a node carries
the KVM label, that an image nodes cannot pull is on one of them, and which address reaches a NodePort; each
failure is one line. ``osfleet lab k8s up`` makes a cluster on this machine that fits.

Nodes are expected to run libvirtd themselves (prepared like any KvmHost); the agent reaches it through the
node's libvirt socket and keeps images and records in a hostPath store. The agent's requests reserve what
its warm replicas use on the node (the QEMU processes run under the node's libvirtd, outside the pod).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any

import pulumi

from osfleet.api.probes import LIVENESS_PATH, READINESS_PATH
from osfleet.tls import dns_names_of
from osfleet_infra.components import CertificateAuthority, secret
from osfleet_infra.settings import REPO, Common, ConfigError, bool_value, list_value

DEFAULT_NAMESPACE = "osfleet"
DEFAULT_NODE_LABEL = "osfleet.io/kvm=true"
DEFAULT_STORE = "/var/lib/osfleet"
DEFAULT_MEMORY_DIR = "/dev/shm/osfleet"
DEFAULT_NAME_PREFIX = "osfleet-"
DEFAULT_LOCUST_WORKERS = 2
DEFAULT_GATEWAY_REPLICAS = 2
SERVICE_TYPES = ("NodePort", "ClusterIP", "LoadBalancer")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
# Per-replica footprint; set them from a run's measured figures (osfleet report prints them).
DEFAULT_REPLICA_MEMORY_MIB = 350
DEFAULT_REPLICA_CPU = 0.25
AGENT_MEMORY_MIB = 512
AGENT_CPU = 0.5
# Where the node's libvirtd makes each domain's channel sockets (the agent talks to its guests' helpers there).
LIBVIRT_CHANNELS = "/var/lib/libvirt/qemu/channel/target"
LOCUST_RUN_TIME = "60s"  # the short load the Locust master starts by itself once its workers joined
# An init container's wait (argv: URL, CA file) until the URL answers at all, for up to 10 minutes.
WAIT_FOR_URL = """
import ssl, sys, time, urllib.error, urllib.request
url, ca = sys.argv[1], sys.argv[2]
context = ssl.create_default_context(cafile=ca)
for _ in range(300):
    try:
        urllib.request.urlopen(url, timeout=5, context=context)
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except OSError as exc:
        print(f"waiting for {url}: {exc}", flush=True)
        time.sleep(2)
sys.exit(f"{url} did not answer in 10 minutes")
"""
LOCUSTFILE = REPO / "loadtest" / "trajectories.py"
AGENT_LABELS = {"app.kubernetes.io/name": "osfleet-agent", "app.kubernetes.io/part-of": "osfleet"}
AGENT_ACCOUNT = "osfleet-agent"  # its service account and Role: read its own DaemonSet (osfleet/api/uninstall.py)
GATEWAY_LABELS = {"app.kubernetes.io/name": "osfleet-gateway", "app.kubernetes.io/part-of": "osfleet"}


GATEWAY_PORT = 8090
# How long a starting agent or gateway may take to answer at all (adopting a node's replicas, a first poll of its
# hosts) before its liveness counts: STARTUP_PERIOD_SECONDS x STARTUP_FAILURES.
STARTUP_PERIOD_SECONDS = 5
STARTUP_FAILURES = 120


def probes(core: Any, port: int) -> dict[str, Any]:
    """A container's probes (``osfleet.api.probes``): restarted only when its process stops answering
    (``/livez``), out of its Service while it cannot serve (``/readyz``), e.g. an agent whose failure monitor died,
    a gateway with no healthy host; liveness waits for a slow start first."""

    def get(path: str, **timing: int) -> Any:
        return core.ProbeArgs(http_get=core.HTTPGetActionArgs(path=path, port=port, scheme="HTTPS"), **timing)

    return {
        "startup_probe": get(LIVENESS_PATH, period_seconds=STARTUP_PERIOD_SECONDS, failure_threshold=STARTUP_FAILURES),
        "liveness_probe": get(LIVENESS_PATH, period_seconds=10, failure_threshold=3),
        "readiness_probe": get(READINESS_PATH, period_seconds=5, failure_threshold=2),
    }


TLS_DIR = "/run/osfleet-tls"  # a pod's own certificate and key (tls.crt, tls.key)
CA_DIR = "/run/osfleet-ca"  # the stack CA's certificate (ca.crt), to verify others


def service_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by inside the cluster (what its pods' certificate must name)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True)
class K8sConfig:
    kvm_nodes: tuple[tuple[str, str], ...]  # (name, address) of each KVM node: a static host list for the gateway
    namespace: str
    container_image: str
    node_label: tuple[str, str]
    store: str
    locust_workers: int
    replica_memory_mib: int
    replica_cpu: float
    discover: bool = False  # the gateway finds the agents in the cluster (pods of the DaemonSet) instead
    gateway_replicas: int = DEFAULT_GATEWAY_REPLICAS
    service_type: str = "NodePort"
    fleet_address: str | None = None  # where clients reach the gateway (default: a node's, asked of the cluster)
    memory_dir: str = DEFAULT_MEMORY_DIR
    name_prefix: str = DEFAULT_NAME_PREFIX
    pull_policy: str = "IfNotPresent"
    check_cluster: bool = True

    @property
    def gateway(self) -> bool:
        return bool(self.kvm_nodes) or self.discover


def read_k8s(cfg: pulumi.Config) -> K8sConfig:
    from osfleet.imaging.container import newest_reference

    image = cfg.get("containerImage") or newest_reference()  # the image 'osfleet image container' built here
    if not image:
        raise ConfigError(
            "containerImage", "missing; run 'osfleet image container', or set it to your registry's osfleet image"
        )
    label = cfg.get("kvmNodeLabel") or DEFAULT_NODE_LABEL
    key, eq, value = label.partition("=")
    if not eq or not key or not value:
        raise ConfigError("kvmNodeLabel", f"{label!r} is not key=value")
    workers = cfg.get_int("locustWorkers")
    workers = DEFAULT_LOCUST_WORKERS if workers is None else workers
    if workers < 0:
        raise ConfigError("locustWorkers", f"{workers} is negative")
    nodes = []
    for spec in list_value(cfg, "kvmNodes") or []:
        node, eq, addr = str(spec).partition("=")
        if not eq or not node or not addr:
            raise ConfigError("kvmNodes", f"{spec!r} is not name=address")
        nodes.append((node, addr))
    discover = bool_value(cfg, "gatewayDiscovery", not nodes)  # a gateway in front unless hosts are listed
    if discover and nodes:
        raise ConfigError("gatewayDiscovery", "true and a kvmNodes list: the gateway finds its hosts one way")
    replicas = cfg.get_int("gatewayReplicas")
    replicas = DEFAULT_GATEWAY_REPLICAS if replicas is None else replicas
    if not 1 <= replicas <= 20:
        raise ConfigError("gatewayReplicas", f"{replicas} is out of range 1..20")
    service_type = cfg.get("gatewayServiceType") or "NodePort"
    if service_type not in SERVICE_TYPES:
        raise ConfigError("gatewayServiceType", f"{service_type!r} is not one of {', '.join(SERVICE_TYPES)}")
    pull = cfg.get("imagePullPolicy") or "IfNotPresent"
    if pull not in PULL_POLICIES:
        raise ConfigError("imagePullPolicy", f"{pull!r} is not one of {', '.join(PULL_POLICIES)}")
    prefix = cfg.get("namePrefix") or DEFAULT_NAME_PREFIX
    if not re.fullmatch(r"osfleet-([a-z0-9]+-)?", prefix):
        raise ConfigError("namePrefix", f"{prefix!r} must look like 'osfleet-' or 'osfleet-<letters/digits>-'")
    mem = cfg.get_int("replicaMemoryMiB") or DEFAULT_REPLICA_MEMORY_MIB
    cpu = cfg.get_float("replicaCpu") or DEFAULT_REPLICA_CPU
    return K8sConfig(
        kvm_nodes=tuple(nodes),
        namespace=cfg.get("namespace") or DEFAULT_NAMESPACE, container_image=image, node_label=(key, value),
        store=cfg.get("imageStorePath") or DEFAULT_STORE, locust_workers=workers, replica_memory_mib=mem,
        replica_cpu=cpu, discover=discover, gateway_replicas=replicas, service_type=service_type,
        fleet_address=cfg.get("fleetAddress") or None, memory_dir=cfg.get("memoryDir") or DEFAULT_MEMORY_DIR,
        name_prefix=prefix, pull_policy=pull, check_cluster=bool_value(cfg, "checkCluster", True),
    )  # fmt: skip


def agent_resources(warm: int, k: K8sConfig) -> dict[str, dict[str, str]]:
    """Requests for the agent plus its warm replicas; limits leave the agent room to start more."""
    mem = AGENT_MEMORY_MIB + warm * k.replica_memory_mib
    cpu = AGENT_CPU + warm * k.replica_cpu
    return {
        "requests": {"memory": f"{mem}Mi", "cpu": f"{int(cpu * 1000)}m"},
        "limits": {"memory": f"{2 * mem}Mi", "cpu": f"{int(2 * cpu * 1000)}m"},
    }


def _host_path(core: Any, name: str, path: str, kind: str) -> Any:
    return core.VolumeArgs(name=name, host_path=core.HostPathVolumeSourceArgs(path=path, type=kind))


def _secret_volume(core: Any, name: str, secret: str) -> Any:
    return core.VolumeArgs(name=name, secret=core.SecretVolumeSourceArgs(secret_name=secret))


def _secret_env(core: Any, secret: str) -> Any:
    """OSFLEET_API_TOKEN from a Secret's ``token`` key."""
    return core.EnvVarArgs(
        name="OSFLEET_API_TOKEN",
        value_from=core.EnvVarSourceArgs(secret_key_ref=core.SecretKeySelectorArgs(name=secret, key="token")),
    )


class K8sFleet(pulumi.ComponentResource):
    """Namespace, secrets and certificates; the host-agent DaemonSet + Service; with ``kvmNodes`` or
    ``gatewayDiscovery`` the fleet gateway (Deployment + Service, and for discovery a service account that may only
    read the agent pods and the nodes); Locust's ConfigMap, master and workers. Built in that order, one method per
    stage."""

    def __init__(
        self,
        name: str,
        k: K8sConfig,
        common: Common,
        opts: pulumi.ResourceOptions | None = None,
        gateway_token: pulumi.Output[str] | None = None,
        fleet_address: str | None = None,
    ) -> None:
        """``gateway_token``: the gateway's own (default: derived from the agents' token, see ``derived_token``);
        ``fleet_address``: where clients reach the gateway's NodePort (``fleetUrl``)."""
        super().__init__("osfleet:infra:K8sFleet", name, None, opts)
        self.name, self.k, self.common = name, k, common
        self.child = pulumi.ResourceOptions(parent=self)
        self.agent_port = common.agent_port
        self._namespace_and_secrets(k.fleet_address or fleet_address)
        self._agent()
        self.fleet_url: pulumi.Output[str] | None = None
        self.gateway_token: pulumi.Output[str] | None = None
        client_secret = "osfleet-agent-token"  # what Locust calls with: the agents' token without a gateway
        if k.gateway:
            self.gateway_token = gateway_token or secret(common.token.apply(derived_token))
            self._gateway(fleet_address)
            client_secret = "osfleet-gateway-token"
        self.locust: list[pulumi.Resource] = []
        if k.locust_workers:
            self._locust(client_secret)
        self.register_outputs({"agent_url": self.agent_url, "fleet_url": self.fleet_url})

    def _kube(self) -> Any:
        import pulumi_kubernetes as kube

        return kube

    def _namespace_and_secrets(self, fleet_address: str | None) -> None:
        """The namespace, the stack's CA, the agents' token and certificate, the CA's certificate."""
        kube, k, name = self._kube(), self.k, self.name
        meta, core = kube.meta.v1.ObjectMetaArgs, kube.core.v1
        self.namespace = core.Namespace(name, metadata=meta(name=k.namespace), opts=self.child)
        self.ns = ns = self.namespace.metadata.name
        agent_names = service_names("osfleet-agent", k.namespace) + [addr for _, addr in k.kvm_nodes]
        gateway_names = service_names("osfleet-gateway", k.namespace) + ([fleet_address] if fleet_address else [])
        self.ca = CertificateAuthority(
            f"{name}-tls", f"osfleet {pulumi.get_stack()} k8s CA", dns_names_of(agent_names + gateway_names),
            opts=self.child,
        )  # fmt: skip
        self.agent_cert = self.ca.certificate(f"{name}-agent-tls", agent_names, self)
        self.tls_secret = core.Secret(
            f"{name}-agent-tls", metadata=meta(name="osfleet-agent-tls", namespace=ns), type="kubernetes.io/tls",
            string_data={"tls.crt": self.agent_cert.cert_pem, "tls.key": secret(self.agent_cert.key_pem)},
            opts=self.child,
        )  # fmt: skip
        self.ca_secret = core.Secret(
            f"{name}-ca", metadata=meta(name="osfleet-ca", namespace=ns),
            string_data={"ca.crt": self.ca.cert_pem}, opts=self.child,
        )  # fmt: skip
        self.secret = core.Secret(
            f"{name}-token", metadata=meta(name="osfleet-agent-token", namespace=ns),
            string_data={"token": self.common.token}, opts=self.child,
        )  # fmt: skip

    def _agent(self) -> None:
        """``osfleet host serve`` as a privileged DaemonSet on the KVM nodes, with the node's /dev/kvm, libvirt
        socket, store and RAM-file folder at the same paths as on the node (libvirtd there opens what it names)."""
        kube, port, ns = self._kube(), self.agent_port, self.ns
        meta, core = kube.meta.v1.ObjectMetaArgs, kube.core.v1
        env, mounts, volumes = self._agent_node_access()
        account = self._agent_account()
        self.daemonset = self._agent_daemonset(env, mounts, volumes, account)
        self.agent_service = core.Service(
            f"{self.name}-agent-svc",
            metadata=meta(name="osfleet-agent", namespace=ns, labels=AGENT_LABELS),
            spec=core.ServiceSpecArgs(selector=AGENT_LABELS, ports=[core.ServicePortArgs(port=port, target_port=port)]),
            opts=self.child,
        )
        self.agent_url = pulumi.Output.concat("https://osfleet-agent.", ns, f".svc:{port}")

    def _agent_node_access(self) -> tuple[list[Any], list[Any], list[Any]]:
        """The agent's environment, mounts and volumes: what of the node it reaches, each at the node's own path."""
        core, k, common = self._kube().core.v1, self.k, self.common
        env = [_secret_env(core, "osfleet-agent-token"), core.EnvVarArgs(name="OSFLEET_HOME", value=k.store),
               core.EnvVarArgs(name="OSFLEET_TENANCY", value=common.tenancy),
               core.EnvVarArgs(name="OSFLEET_K8S_DAEMONSET", value="osfleet-agent")]  # fmt: skip
        mounts = [
            core.VolumeMountArgs(name="kvm", mount_path="/dev/kvm"),
            core.VolumeMountArgs(name="store", mount_path=k.store),
            core.VolumeMountArgs(name="libvirt", mount_path="/var/run/libvirt"),
            core.VolumeMountArgs(name="channels", mount_path=LIBVIRT_CHANNELS),
            core.VolumeMountArgs(name="tls", mount_path=TLS_DIR, read_only=True),
        ]
        volumes = [
            _host_path(core, "kvm", "/dev/kvm", "CharDevice"),
            _host_path(core, "store", k.store, "DirectoryOrCreate"),
            _host_path(core, "libvirt", "/var/run/libvirt", "Directory"),
            _host_path(core, "channels", LIBVIRT_CHANNELS, "DirectoryOrCreate"),
            _secret_volume(core, "tls", "osfleet-agent-tls"),
        ]
        if k.discover:  # the shape of the one-machine lab and of nodes shared with other tenants' agents
            env += [core.EnvVarArgs(name="OSFLEET_NAME_PREFIX", value=k.name_prefix),
                    core.EnvVarArgs(name="OSFLEET_MEMORY_DIR", value=k.memory_dir)]  # fmt: skip
            mounts.append(core.VolumeMountArgs(name="memory", mount_path=k.memory_dir))
            volumes.append(_host_path(core, "memory", k.memory_dir, "DirectoryOrCreate"))
        return env, mounts, volumes

    def _agent_account(self) -> list[Any]:
        """The agent's service account: it may ``get`` its own DaemonSet, nothing else, so that at shutdown it
        tells a restart (the DaemonSet is there: the next pod adopts the node's replicas) from an uninstall (it is
        being deleted or gone: it tears them down; ``osfleet/api/uninstall.py``). The DaemonSet depends on these,
        so ``destroy`` deletes it, and its pods shut down, while the account may still read it."""
        kube, name, ns, child = self._kube(), self.name, self.ns, self.child
        meta, core, rbac = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.rbac.v1
        sa = core.ServiceAccount(f"{name}-agent-sa", metadata=meta(name=AGENT_ACCOUNT, namespace=ns), opts=child)
        role = rbac.Role(
            f"{name}-agent-owner", metadata=meta(name=AGENT_ACCOUNT, namespace=ns),
            rules=[rbac.PolicyRuleArgs(api_groups=["apps"], resources=["daemonsets"], resource_names=["osfleet-agent"],
                                       verbs=["get"])],
            opts=child,
        )  # fmt: skip
        binding = rbac.RoleBinding(
            f"{name}-agent-owner", metadata=meta(name=AGENT_ACCOUNT, namespace=ns),
            role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=AGENT_ACCOUNT),
            subjects=[rbac.SubjectArgs(kind="ServiceAccount", name=AGENT_ACCOUNT, namespace=ns)], opts=child,
        )  # fmt: skip
        return [sa, role, binding]

    def _agent_daemonset(self, env: list[Any], mounts: list[Any], volumes: list[Any], account: list[Any]) -> Any:
        kube, k, common, port, ns = self._kube(), self.k, self.common, self.agent_port, self.ns
        meta, core, apps = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.apps.v1
        return apps.DaemonSet(
            f"{self.name}-agent",
            metadata=meta(name="osfleet-agent", namespace=ns, labels=AGENT_LABELS),
            spec=apps.DaemonSetSpecArgs(
                selector=kube.meta.v1.LabelSelectorArgs(match_labels=AGENT_LABELS),
                template=core.PodTemplateSpecArgs(
                    metadata=meta(labels=AGENT_LABELS),
                    spec=core.PodSpecArgs(
                        node_selector={k.node_label[0]: k.node_label[1]},
                        # A node daemon: the label picks the nodes, whatever NoSchedule taints they carry.
                        tolerations=[core.TolerationArgs(operator="Exists", effect="NoSchedule")]
                        if k.discover else None,
                        # With a static host list, each agent answers on its node's address (the gateway's list).
                        host_network=bool(k.kvm_nodes) or None,
                        dns_policy="ClusterFirstWithHostNet" if k.kvm_nodes else None,
                        service_account_name=AGENT_ACCOUNT,
                        automount_service_account_token=True,  # to read its own DaemonSet at shutdown
                        termination_grace_period_seconds=30,
                        containers=[
                            core.ContainerArgs(
                                name="agent",
                                image=k.container_image,
                                image_pull_policy=k.pull_policy,
                                command=["osfleet", "host", "serve", "--bind", "0.0.0.0", "--port", str(port),
                                         "--warm", str(common.warm), "--mode", common.mode,
                                         "--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"],
                                env=env,
                                ports=[core.ContainerPortArgs(container_port=port, name="api")],
                                security_context=core.SecurityContextArgs(privileged=True),
                                volume_mounts=mounts,
                                **probes(core, port),
                                resources=core.ResourceRequirementsArgs(**agent_resources(common.warm, k)),
                            )
                        ],
                        volumes=volumes,
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions.merge(self.child, pulumi.ResourceOptions(depends_on=account)),
        )  # fmt: skip

    def _gateway(self, fleet_address: str | None) -> None:
        """``osfleet fleet serve`` over the agents, as a Deployment behind a Service: its clients' token is its
        own; the agents' token is a file only it mounts. With discovery it watches the agent pods and the nodes
        with a service account that may read only those."""
        address = self.k.fleet_address or fleet_address
        self._gateway_secrets(address)
        hosts, account, rbac_objects = self._gateway_hosts()
        self.gateway = self._gateway_deployment(hosts, account, rbac_objects)
        self._gateway_service(address)

    def _gateway_secrets(self, address: str | None) -> None:
        """The gateway's clients' token, and its certificate for its Service names and the fleet's address."""
        kube, k, name, ns, child = self._kube(), self.k, self.name, self.ns, self.child
        meta, core = kube.meta.v1.ObjectMetaArgs, kube.core.v1
        core.Secret(
            f"{name}-gateway-token", metadata=meta(name="osfleet-gateway-token", namespace=ns),
            string_data={"token": self.gateway_token}, opts=child,
        )  # fmt: skip
        names = service_names("osfleet-gateway", k.namespace) + ([address] if address else [])
        gateway_cert = self.ca.certificate(f"{name}-gateway-tls", names, self)
        core.Secret(
            f"{name}-gateway-tls", metadata=meta(name="osfleet-gateway-tls", namespace=ns), type="kubernetes.io/tls",
            string_data={"tls.crt": gateway_cert.cert_pem, "tls.key": secret(gateway_cert.key_pem)},
            opts=child,
        )  # fmt: skip

    def _gateway_hosts(self) -> tuple[list[str], str | None, list[Any]]:
        """How the gateway finds its hosts (``fleet serve`` arguments), and the service account discovery needs with
        its RBAC objects."""
        k = self.k
        if k.discover:
            hosts = ["--discover-pods", ",".join(f"{a}={b}" for a, b in AGENT_LABELS.items()),
                     "--discover-port", str(self.agent_port),
                     "--hosts-tls-name", f"osfleet-agent.{k.namespace}.svc"]  # fmt: skip
            return hosts, *self._gateway_account()
        static = [a for node, addr in k.kvm_nodes for a in ("--host", f"{node}=https://{addr}:{self.agent_port}")]
        return static, None, []

    def _gateway_deployment(self, hosts: list[str], account: str | None, rbac_objects: list[Any]) -> Any:
        """The gateway's pods; they depend on their account's RBAC objects, so that ``up`` starts no pod whose
        watches are refused yet, and ``destroy`` takes the pods down before what they read with."""
        kube, k, name, ns, child = self._kube(), self.k, self.name, self.ns, self.child
        meta, core, apps = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.apps.v1
        tls_args = ["--hosts-ca-file", f"{CA_DIR}/ca.crt", "--tls-cert", f"{TLS_DIR}/tls.crt",
                    "--tls-key", f"{TLS_DIR}/tls.key"]  # fmt: skip
        tls_mounts = [
            core.VolumeMountArgs(name="tls", mount_path=TLS_DIR, read_only=True),
            core.VolumeMountArgs(name="ca", mount_path=CA_DIR, read_only=True),
        ]
        tls_volumes = [_secret_volume(core, "tls", "osfleet-gateway-tls"), _secret_volume(core, "ca", "osfleet-ca")]
        token_volume = core.VolumeArgs(
            name="token", secret=core.SecretVolumeSourceArgs(secret_name="osfleet-agent-token")
        )
        token_mount = core.VolumeMountArgs(name="token", mount_path="/run/osfleet", read_only=True)
        return apps.Deployment(
            f"{name}-gateway",
            metadata=meta(name="osfleet-gateway", namespace=ns, labels=GATEWAY_LABELS),
            spec=apps.DeploymentSpecArgs(
                replicas=k.gateway_replicas,
                selector=kube.meta.v1.LabelSelectorArgs(match_labels=GATEWAY_LABELS),
                template=core.PodTemplateSpecArgs(
                    metadata=meta(labels=GATEWAY_LABELS),
                    spec=core.PodSpecArgs(
                        service_account_name=account,
                        automount_service_account_token=bool(account),
                        containers=[core.ContainerArgs(
                            name="gateway", image=k.container_image, image_pull_policy=k.pull_policy,
                            command=["osfleet", "fleet", "serve", "--bind", "0.0.0.0", "--port", str(GATEWAY_PORT),
                                     *hosts, "--hosts-token-file", "/run/osfleet/token", *tls_args],
                            env=[_secret_env(core, "osfleet-gateway-token")],
                            ports=[core.ContainerPortArgs(container_port=GATEWAY_PORT, name="api")],
                            volume_mounts=[token_mount, *tls_mounts],
                            **probes(core, GATEWAY_PORT),
                        )],
                        volumes=[token_volume, *tls_volumes],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=rbac_objects)),
        )  # fmt: skip

    def _gateway_service(self, address: str | None) -> None:
        """The gateway's Service, and ``fleetUrl``: the fleet's address and NodePort when clients come from outside
        the cluster, else the Service's name."""
        kube, k, ns = self._kube(), self.k, self.ns
        meta, core = kube.meta.v1.ObjectMetaArgs, kube.core.v1
        self.gateway_service = core.Service(
            f"{self.name}-gateway-svc",
            metadata=meta(name="osfleet-gateway", namespace=ns, labels=GATEWAY_LABELS),
            spec=core.ServiceSpecArgs(
                type=k.service_type, selector=GATEWAY_LABELS, ports=[core.ServicePortArgs(port=GATEWAY_PORT)]
            ),
            opts=self.child,
        )
        if address and k.service_type == "NodePort":
            node_port = self.gateway_service.spec.ports.apply(lambda ports: ports[0].node_port)
            self.fleet_url = pulumi.Output.concat("https://", address, ":", node_port.apply(str))
        else:
            self.fleet_url = pulumi.Output.concat("https://osfleet-gateway.", ns, f".svc:{GATEWAY_PORT}")

    def _gateway_account(self) -> tuple[str, list[Any]]:
        """The gateway's service account: it may list and watch the agent pods of its namespace and the nodes (a
        node cordoned or gone drains its host), nothing else."""
        kube, name, ns, child = self._kube(), self.name, self.ns, self.child
        meta, core, rbac = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.rbac.v1
        account = "osfleet-gateway"
        sa = core.ServiceAccount(f"{name}-gateway-sa", metadata=meta(name=account, namespace=ns), opts=child)
        watch = ["get", "list", "watch"]
        role = rbac.Role(
            f"{name}-gateway-pods", metadata=meta(name="osfleet-gateway-pods", namespace=ns),
            rules=[rbac.PolicyRuleArgs(api_groups=[""], resources=["pods"], verbs=watch)], opts=child,
        )  # fmt: skip
        subject = rbac.SubjectArgs(kind="ServiceAccount", name=account, namespace=ns)
        binding = rbac.RoleBinding(
            f"{name}-gateway-pods", metadata=meta(name="osfleet-gateway-pods", namespace=ns),
            role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name="osfleet-gateway-pods"),
            subjects=[subject], opts=child,
        )  # fmt: skip
        cluster_role = f"osfleet-gateway-nodes-{self.k.namespace}"
        cluster = rbac.ClusterRole(
            f"{name}-gateway-nodes", metadata=meta(name=cluster_role),
            rules=[rbac.PolicyRuleArgs(api_groups=[""], resources=["nodes"], verbs=watch)], opts=child,
        )  # fmt: skip
        cluster_binding = rbac.ClusterRoleBinding(
            f"{name}-gateway-nodes", metadata=meta(name=cluster_role),
            role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role),
            subjects=[subject], opts=child,
        )  # fmt: skip
        return account, [sa, role, binding, cluster, cluster_binding]

    def _locust(self, client_secret: str) -> None:
        kube, k, name, ns, child = self._kube(), self.k, self.name, self.ns, self.child
        meta, core = kube.meta.v1.ObjectMetaArgs, kube.core.v1
        cm = core.ConfigMap(
            f"{name}-locustfile", metadata=meta(name="osfleet-locustfile", namespace=ns),
            data={"trajectories.py": LOCUSTFILE.read_text()}, opts=child,
        )  # fmt: skip
        # Locust drives the gateway; without one (no kvmNodes) the agents' Service, which only holds for one KVM
        # node (a lease's calls must reach the agent that granted it).
        gw, agent = f"https://osfleet-gateway:{GATEWAY_PORT}", f"https://osfleet-agent:{self.agent_port}"
        target = gw if k.gateway else agent
        # The master starts a short load as soon as its workers are there (one user per warm replica, for
        # LOCUST_RUN_TIME) and keeps its web UI, whose /stats/requests are the results (docs: "Deploy on Kubernetes").
        users = str(max(1, self.common.warm))
        run = ["--autostart", "--users", users, "--spawn-rate", users, "--run-time", LOCUST_RUN_TIME,
               "--expect-workers", str(k.locust_workers)]  # fmt: skip
        master = self._locust_deployment("master", 1, ["--master", "--host", target, *run], client_secret, target)
        svc = core.Service(
            f"{name}-locust-master-svc",
            metadata=meta(name="osfleet-locust-master", namespace=ns),
            spec=core.ServiceSpecArgs(
                selector={"app.kubernetes.io/name": "osfleet-locust-master", "app.kubernetes.io/part-of": "osfleet"},
                ports=[core.ServicePortArgs(name="web", port=8089), core.ServicePortArgs(name="workers", port=5557)],
            ),
            opts=child,
        )
        workers = self._locust_deployment(
            "worker", k.locust_workers, ["--worker", "--master-host", "osfleet-locust-master"], client_secret
        )
        self.locust = [cm, master, svc, workers]

    def _locust_deployment(
        self, role: str, replicas: int, args: list[str], client_secret: str, wait_for: str | None = None
    ) -> pulumi.Resource:
        """A Locust master or workers, with the locustfile and the CA's certificate mounted; ``wait_for``: a URL
        the pod waits for before Locust starts."""
        kube, k, name, ns = self._kube(), self.k, self.name, self.ns
        meta, core, apps = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.apps.v1
        mount = [
            core.VolumeMountArgs(name="locustfile", mount_path="/locust"),
            core.VolumeMountArgs(name="ca", mount_path=CA_DIR, read_only=True),
        ]
        volume = [
            core.VolumeArgs(name="locustfile", config_map=core.ConfigMapVolumeSourceArgs(name="osfleet-locustfile")),
            _secret_volume(core, "ca", "osfleet-ca"),
        ]
        labels = {"app.kubernetes.io/name": f"osfleet-locust-{role}", "app.kubernetes.io/part-of": "osfleet"}
        return apps.Deployment(
            f"{name}-locust-{role}",
            metadata=meta(name=f"osfleet-locust-{role}", namespace=ns, labels=labels),
            spec=apps.DeploymentSpecArgs(
                replicas=replicas,
                selector=kube.meta.v1.LabelSelectorArgs(match_labels=labels),
                template=core.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=core.PodSpecArgs(
                        automount_service_account_token=False,
                        # the master's load starts by itself: not before its target answers
                        init_containers=[core.ContainerArgs(
                            name="wait-for-target", image=k.container_image, image_pull_policy=k.pull_policy,
                            command=["python3", "-c", WAIT_FOR_URL, f"{wait_for}/health", f"{CA_DIR}/ca.crt"],
                            volume_mounts=mount,
                        )] if wait_for else None,
                        containers=[core.ContainerArgs(
                            name="locust", image=k.container_image, image_pull_policy=k.pull_policy,
                            command=["locust", "-f", "/locust/trajectories.py", *args,
                                     "--ca-file", f"{CA_DIR}/ca.crt"],
                            env=[_secret_env(core, client_secret)], volume_mounts=mount,
                        )],
                        volumes=volume,
                    ),
                ),
            ),
            opts=self.child,
        )  # fmt: skip


def derived_token(agent_token: str) -> str:
    """The gateway's default token: one-way from the agents' (whoever holds the gateway's cannot compute theirs)."""
    return hmac.new(agent_token.encode(), b"osfleet fleet gateway", hashlib.sha256).hexdigest()


def deploy_k8s(cfg: pulumi.Config, common: Common) -> None:
    k = read_k8s(cfg)
    address = None
    if k.check_cluster:
        from osfleet_infra.k8s_cluster import read_cluster

        facts = read_cluster(k.node_label, k.container_image, k.pull_policy)
        address = facts.address
        pulumi.log.info(f"KVM nodes: {len(facts.kvm_nodes)}; the image is on {len(facts.image_nodes)} of them")
    fleet = K8sFleet("osfleet", k, common, gateway_token=cfg.get_secret("gatewayToken"), fleet_address=address)
    pulumi.export("namespace", fleet.namespace.metadata.name)
    pulumi.export("agentUrl", fleet.agent_url)
    pulumi.export("caCert", fleet.ca.cert_pem)
    pulumi.export("agentToken", common.token)
    if fleet.fleet_url is not None:
        pulumi.export("fleetUrl", fleet.fleet_url)
        pulumi.export("gatewayToken", fleet.gateway_token)
