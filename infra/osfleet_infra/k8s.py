"""The ``k8s`` stack: the host agent as a privileged DaemonSet on KVM-labelled nodes, its token in a Secret,
and Locust master + workers with the locustfile in a ConfigMap.

With ``kvmNodes``, a fleet gateway in front of the agents. The gateway has a token of its own (config
``gatewayToken``, secret; by default derived one-way from the agents' token) that its clients — Locust
included — use; only the gateway holds the agents' token (a mounted file), so a gateway client cannot call an
agent as its operator.

Every listener speaks HTTPS with certificates the stack makes (``CertificateAuthority``, as on bare metal): the
agents' for their Service names and the KVM nodes' addresses (Secret ``osfleet-agent-tls``), the gateway's for its
Service names (``osfleet-gateway-tls``); the CA's certificate alone (``osfleet-ca``) is what the gateway and
Locust mount to verify them. Probes use HTTPS (the kubelet does not verify probe certificates).

Nodes are expected to run libvirtd themselves (prepared like any KvmHost); the agent reaches it through the
node's libvirt socket and keeps images and records in a hostPath store. The agent's requests reserve what
its warm replicas use on the node (the QEMU processes run under the node's libvirtd, outside the pod).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import pulumi

from osfleet_infra.components import CertificateAuthority
from osfleet_infra.settings import REPO, Common, ConfigError, list_value

DEFAULT_NAMESPACE = "osfleet"
DEFAULT_NODE_LABEL = "osfleet.io/kvm=true"
DEFAULT_STORE = "/var/lib/osfleet"
DEFAULT_LOCUST_WORKERS = 2
# Per-replica footprint; set them from a run's measured figures (osfleet report prints them).
DEFAULT_REPLICA_MEMORY_MIB = 350
DEFAULT_REPLICA_CPU = 0.25
AGENT_MEMORY_MIB = 512
AGENT_CPU = 0.5
LOCUSTFILE = REPO / "loadtest" / "trajectories.py"


GATEWAY_PORT = 8090
TLS_DIR = "/run/osfleet-tls"  # a pod's own certificate and key (tls.crt, tls.key)
CA_DIR = "/run/osfleet-ca"  # the stack CA's certificate (ca.crt), to verify others


def service_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by inside the cluster (what its pods' certificate must name)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True)
class K8sConfig:
    kvm_nodes: tuple[tuple[str, str], ...]  # (name, address) of each KVM node: the gateway's host list
    namespace: str
    container_image: str
    node_label: tuple[str, str]
    store: str
    locust_workers: int
    replica_memory_mib: int
    replica_cpu: float


def read_k8s(cfg: pulumi.Config) -> K8sConfig:
    image = cfg.get("containerImage")
    if not image:
        raise ConfigError("containerImage", "missing; the container image with osfleet installed")
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
    mem = cfg.get_int("replicaMemoryMiB") or DEFAULT_REPLICA_MEMORY_MIB
    cpu = cfg.get_float("replicaCpu") or DEFAULT_REPLICA_CPU
    return K8sConfig(
        kvm_nodes=tuple(nodes),
        namespace=cfg.get("namespace") or DEFAULT_NAMESPACE, container_image=image, node_label=(key, value),
        store=cfg.get("imageStorePath") or DEFAULT_STORE, locust_workers=workers, replica_memory_mib=mem,
        replica_cpu=cpu,
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


class K8sFleet(pulumi.ComponentResource):
    """Namespace, token Secret, host-agent DaemonSet + Service, Locust ConfigMap, master and workers."""

    def __init__(
        self,
        name: str,
        k: K8sConfig,
        common: Common,
        opts: pulumi.ResourceOptions | None = None,
        gateway_token: pulumi.Output[str] | None = None,
    ) -> None:
        """``gateway_token``: the gateway's own (default: derived from the agents' token, see ``derived_token``)."""
        import pulumi_kubernetes as kube

        super().__init__("osfleet:infra:K8sFleet", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        meta = kube.meta.v1.ObjectMetaArgs
        core, apps = kube.core.v1, kube.apps.v1
        port = self.agent_port = common.agent_port
        self.namespace = core.Namespace(name, metadata=meta(name=k.namespace), opts=child)
        ns = self.namespace.metadata.name
        self.ca = CertificateAuthority(f"{name}-tls", f"osfleet {pulumi.get_stack()} k8s CA", opts=child)
        agent_names = service_names("osfleet-agent", k.namespace) + [addr for _, addr in k.kvm_nodes]
        self.agent_cert = self.ca.certificate(f"{name}-agent-tls", agent_names, self)
        self.tls_secret = core.Secret(
            f"{name}-agent-tls", metadata=meta(name="osfleet-agent-tls", namespace=ns), type="kubernetes.io/tls",
            string_data={"tls.crt": self.agent_cert.cert_pem, "tls.key": pulumi.Output.secret(self.agent_cert.key_pem)},
            opts=child,
        )  # fmt: skip
        self.ca_secret = core.Secret(
            f"{name}-ca", metadata=meta(name="osfleet-ca", namespace=ns),
            string_data={"ca.crt": self.ca.cert_pem}, opts=child,
        )  # fmt: skip
        self.secret = core.Secret(
            f"{name}-token", metadata=meta(name="osfleet-agent-token", namespace=ns),
            string_data={"token": common.token}, opts=child,
        )  # fmt: skip
        token_env = core.EnvVarArgs(
            name="OSFLEET_API_TOKEN",
            value_from=core.EnvVarSourceArgs(
                secret_key_ref=core.SecretKeySelectorArgs(name="osfleet-agent-token", key="token")
            ),
        )
        agent_labels = {"app.kubernetes.io/name": "osfleet-agent"}
        probe = core.ProbeArgs(
            http_get=core.HTTPGetActionArgs(path="/health", port=port, scheme="HTTPS"), period_seconds=10
        )
        self.daemonset = apps.DaemonSet(
            f"{name}-agent",
            metadata=meta(name="osfleet-agent", namespace=ns),
            spec=apps.DaemonSetSpecArgs(
                selector=kube.meta.v1.LabelSelectorArgs(match_labels=agent_labels),
                template=core.PodTemplateSpecArgs(
                    metadata=meta(labels=agent_labels),
                    spec=core.PodSpecArgs(
                        node_selector={k.node_label[0]: k.node_label[1]},
                        # With a gateway, each agent answers on its node's address (the gateway's host list).
                        host_network=bool(k.kvm_nodes) or None,
                        dns_policy="ClusterFirstWithHostNet" if k.kvm_nodes else None,
                        containers=[
                            core.ContainerArgs(
                                name="agent",
                                image=k.container_image,
                                command=["osfleet", "host", "serve", "--bind", "0.0.0.0", "--port", str(port),
                                         "--warm", str(common.warm), "--mode", common.mode,
                                         "--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"],
                                env=[token_env, core.EnvVarArgs(name="OSFLEET_HOME", value=k.store),
                                     core.EnvVarArgs(name="OSFLEET_TENANCY", value=common.tenancy)],
                                ports=[core.ContainerPortArgs(container_port=port, name="api")],
                                security_context=core.SecurityContextArgs(privileged=True),
                                volume_mounts=[
                                    core.VolumeMountArgs(name="kvm", mount_path="/dev/kvm"),
                                    core.VolumeMountArgs(name="store", mount_path=k.store),
                                    core.VolumeMountArgs(name="libvirt", mount_path="/var/run/libvirt"),
                                    core.VolumeMountArgs(name="tls", mount_path=TLS_DIR, read_only=True),
                                ],
                                liveness_probe=probe,
                                readiness_probe=probe,
                                resources=core.ResourceRequirementsArgs(
                                    requests=agent_resources(common.warm, k)["requests"],
                                    limits=agent_resources(common.warm, k)["limits"],
                                ),
                            )
                        ],
                        volumes=[
                            _host_path(core, "kvm", "/dev/kvm", "CharDevice"),
                            _host_path(core, "store", k.store, "DirectoryOrCreate"),
                            _host_path(core, "libvirt", "/var/run/libvirt", "Directory"),
                            _secret_volume(core, "tls", "osfleet-agent-tls"),
                        ],
                    ),
                ),
            ),
            opts=child,
        )  # fmt: skip
        self.agent_service = core.Service(
            f"{name}-agent-svc",
            metadata=meta(name="osfleet-agent", namespace=ns),
            spec=core.ServiceSpecArgs(selector=agent_labels, ports=[core.ServicePortArgs(port=port, target_port=port)]),
            opts=child,
        )
        self.agent_url = pulumi.Output.concat("https://osfleet-agent.", ns, f".svc:{port}")
        self.fleet_url: pulumi.Output[str] | None = None
        self.gateway_token: pulumi.Output[str] | None = None
        client_env = token_env  # what Locust calls with: the agents' token without a gateway, else the gateway's
        if k.kvm_nodes:
            self.gateway_token = gateway_token or pulumi.Output.secret(common.token.apply(derived_token))
            self.gateway_secret = core.Secret(
                f"{name}-gateway-token", metadata=meta(name="osfleet-gateway-token", namespace=ns),
                string_data={"token": self.gateway_token}, opts=child,
            )  # fmt: skip
            client_env = core.EnvVarArgs(
                name="OSFLEET_API_TOKEN",
                value_from=core.EnvVarSourceArgs(
                    secret_key_ref=core.SecretKeySelectorArgs(name="osfleet-gateway-token", key="token")
                ),
            )
            self._gateway(name, k, ns, client_env, child)
        self.locust: list[pulumi.Resource] = []
        if k.locust_workers:
            self._locust(name, k, ns, client_env, child)
        self.register_outputs({"agent_url": self.agent_url, "fleet_url": self.fleet_url})

    def _gateway(
        self, name: str, k: K8sConfig, ns: pulumi.Output[str], token_env: Any, child: pulumi.ResourceOptions
    ) -> None:
        """``osfleet fleet serve`` over the KVM nodes' agents, as a Deployment behind a Service: its clients' token
        (``token_env``) is its own; the agents' token is a file only it mounts."""
        import pulumi_kubernetes as kube

        meta, core, apps = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.apps.v1
        labels = {"app.kubernetes.io/name": "osfleet-gateway"}
        hosts = [a for node, addr in k.kvm_nodes for a in ("--host", f"{node}=https://{addr}:{self.agent_port}")]
        probe = core.ProbeArgs(
            http_get=core.HTTPGetActionArgs(path="/health", port=GATEWAY_PORT, scheme="HTTPS"), period_seconds=10
        )
        gateway_cert = self.ca.certificate(f"{name}-gateway-tls", service_names("osfleet-gateway", k.namespace), self)
        core.Secret(
            f"{name}-gateway-tls", metadata=meta(name="osfleet-gateway-tls", namespace=ns), type="kubernetes.io/tls",
            string_data={"tls.crt": gateway_cert.cert_pem, "tls.key": pulumi.Output.secret(gateway_cert.key_pem)},
            opts=child,
        )  # fmt: skip
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
        self.gateway = apps.Deployment(
            f"{name}-gateway",
            metadata=meta(name="osfleet-gateway", namespace=ns),
            spec=apps.DeploymentSpecArgs(
                replicas=1,
                selector=kube.meta.v1.LabelSelectorArgs(match_labels=labels),
                template=core.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=core.PodSpecArgs(
                        containers=[core.ContainerArgs(
                            name="gateway", image=k.container_image,
                            command=["osfleet", "fleet", "serve", "--bind", "0.0.0.0", "--port", str(GATEWAY_PORT),
                                     *hosts, "--hosts-token-file", "/run/osfleet/token", *tls_args],
                            env=[token_env],
                            ports=[core.ContainerPortArgs(container_port=GATEWAY_PORT, name="api")],
                            volume_mounts=[token_mount, *tls_mounts],
                            liveness_probe=probe, readiness_probe=probe,
                        )],
                        volumes=[token_volume, *tls_volumes],
                    ),
                ),
            ),
            opts=child,
        )  # fmt: skip
        self.gateway_service = core.Service(
            f"{name}-gateway-svc",
            metadata=meta(name="osfleet-gateway", namespace=ns),
            spec=core.ServiceSpecArgs(selector=labels, ports=[core.ServicePortArgs(port=GATEWAY_PORT)]),
            opts=child,
        )
        self.fleet_url = pulumi.Output.concat("https://osfleet-gateway.", ns, f".svc:{GATEWAY_PORT}")

    def _locust(
        self, name: str, k: K8sConfig, ns: pulumi.Output[str], token_env: Any, child: pulumi.ResourceOptions
    ) -> None:
        import pulumi_kubernetes as kube

        meta, core, apps = kube.meta.v1.ObjectMetaArgs, kube.core.v1, kube.apps.v1
        cm = core.ConfigMap(
            f"{name}-locustfile", metadata=meta(name="osfleet-locustfile", namespace=ns),
            data={"trajectories.py": LOCUSTFILE.read_text()}, opts=child,
        )  # fmt: skip
        mount = [
            core.VolumeMountArgs(name="locustfile", mount_path="/locust"),
            core.VolumeMountArgs(name="ca", mount_path=CA_DIR, read_only=True),
        ]
        volume = [
            core.VolumeArgs(name="locustfile", config_map=core.ConfigMapVolumeSourceArgs(name="osfleet-locustfile")),
            _secret_volume(core, "ca", "osfleet-ca"),
        ]

        def deployment(role: str, replicas: int, args: list[str]) -> object:
            labels = {"app.kubernetes.io/name": f"osfleet-locust-{role}"}
            return apps.Deployment(
                f"{name}-locust-{role}",
                metadata=meta(name=f"osfleet-locust-{role}", namespace=ns),
                spec=apps.DeploymentSpecArgs(
                    replicas=replicas,
                    selector=kube.meta.v1.LabelSelectorArgs(match_labels=labels),
                    template=core.PodTemplateSpecArgs(
                        metadata=meta(labels=labels),
                        spec=core.PodSpecArgs(
                            containers=[core.ContainerArgs(
                                name="locust", image=k.container_image,
                                command=["locust", "-f", "/locust/trajectories.py", *args,
                                         "--ca-file", f"{CA_DIR}/ca.crt"],
                                env=[token_env], volume_mounts=mount,
                            )],
                            volumes=volume,
                        ),
                    ),
                ),
                opts=child,
            )  # fmt: skip

        # Locust drives the gateway; without one (no kvmNodes) the agents' Service, which only holds for one KVM
        # node (a lease's calls must reach the agent that granted it).
        gw, agent = f"https://osfleet-gateway:{GATEWAY_PORT}", f"https://osfleet-agent:{self.agent_port}"
        target = gw if k.kvm_nodes else agent
        master = deployment("master", 1, ["--master", "--host", target])
        svc = core.Service(
            f"{name}-locust-master-svc",
            metadata=meta(name="osfleet-locust-master", namespace=ns),
            spec=core.ServiceSpecArgs(
                selector={"app.kubernetes.io/name": "osfleet-locust-master"},
                ports=[core.ServicePortArgs(name="web", port=8089), core.ServicePortArgs(name="workers", port=5557)],
            ),
            opts=child,
        )
        workers = deployment("worker", k.locust_workers, ["--worker", "--master-host", "osfleet-locust-master"])
        self.locust = [cm, master, svc, workers]  # type: ignore[list-item]


def derived_token(agent_token: str) -> str:
    """The gateway's default token: one-way from the agents' (whoever holds the gateway's cannot compute theirs)."""
    return hmac.new(agent_token.encode(), b"osfleet fleet gateway", hashlib.sha256).hexdigest()


def deploy_k8s(cfg: pulumi.Config, common: Common) -> None:
    k = read_k8s(cfg)
    fleet = K8sFleet("osfleet", k, common, gateway_token=cfg.get_secret("gatewayToken"))
    pulumi.export("namespace", fleet.namespace.metadata.name)
    pulumi.export("agentUrl", fleet.agent_url)
    pulumi.export("caCert", fleet.ca.cert_pem)
    pulumi.export("agentToken", common.token)
    if fleet.fleet_url is not None:
        pulumi.export("fleetUrl", fleet.fleet_url)
        pulumi.export("gatewayToken", fleet.gateway_token)
