"""One ComponentResource per concept: a KVM host, a golden image on every host, the stack's certificate
authority, a host agent.

Each has a small Args class, a type token ``osfleet:infra:<Name>``, children created with ``parent=self``
and ``register_outputs`` at the end. The children are dynamic resources (``providers.py``) that act on the
hosts over SSH.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from osfleet_infra.providers import (
    AgentProvider,
    CaProvider,
    CertProvider,
    HostPrepProvider,
    ImageBuildProvider,
    ImagePublishProvider,
    TokenProvider,
)
from osfleet_infra.remote import conn_inputs

DEFAULT_PACKAGES = [
    "qemu-system-x86", "qemu-utils", "libvirt-daemon-system", "libvirt-clients", "openssh-server", "python3-venv",
]  # fmt: skip


def secret(value: pulumi.Input[str]) -> pulumi.Output[str]:
    """``pulumi.Output.secret`` for a string: the SDK types it ``Input[T] -> Output[T]``, from which mypy infers no
    ``T`` when given an ``Output[str]`` (it could be ``str`` or ``Output[str]``)."""
    untyped: Any = value
    return pulumi.Output.secret(untyped)


@dataclass(frozen=True)
class HostTarget:
    """How to reach one host and where osfleet lives on it."""

    name: str
    addr: pulumi.Input[str]  # an Output when the host is made by the same stack (EC2)
    user: str = "root"
    port: int = 22
    key_file: str = ""
    home: str = "/var/lib/osfleet"
    name_prefix: str = "osfleet-"
    osfleet_bin: str = "osfleet"
    osfleet_pip_spec: str = ""  # pip requirement installed into osfleet_bin's venv when the command is missing
    bind: str = ""  # address the agent listens on; default: addr (EC2: 0.0.0.0, its public address is NATed)

    def conn(self) -> dict[str, object]:
        return conn_inputs(self.addr, self.user, self.port, self.key_file)


class _HostPrep(Resource):
    vcpus: pulumi.Output[int]
    memory_gib: pulumi.Output[float]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        outs = {"made_home": None, "made_sysctl_file": None, "osfleet_version": None, "vcpus": None, "memory_gib": None}
        super().__init__(HostPrepProvider(), name, {**props, **outs}, opts)


class _ImageBuild(Resource):
    name: pulumi.Output[str]
    manifest: pulumi.Output[str]
    disk_sha256: pulumi.Output[str]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        super().__init__(
            ImageBuildProvider(), name, {**props, "name": None, "manifest": None, "disk_sha256": None}, opts
        )


class _ImagePublish(Resource):
    disk: pulumi.Output[str]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        super().__init__(ImagePublishProvider(), name, {**props, "disk": None}, opts)


class _Token(Resource):
    token: pulumi.Output[str]

    def __init__(self, name: str) -> None:
        opts = pulumi.ResourceOptions(additional_secret_outputs=["token"])
        super().__init__(TokenProvider(), name, {"token": None}, opts)


def generated_token(name: str) -> pulumi.Output[str]:
    """A bearer token the stack makes once and keeps secret in its state."""
    return secret(_Token(name).token)


class _Ca(Resource):
    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["key_pem"]))
        super().__init__(CaProvider(), name, {**props, "cert_pem": None, "key_pem": None}, opts)


class _Cert(Resource):
    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["key_pem"]))
        super().__init__(CertProvider(), name, {**props, "cert_pem": None, "key_pem": None}, opts)


class _Agent(Resource):
    url: pulumi.Output[str]

    def __init__(self, name: str, props: Mapping[str, object], opts: pulumi.ResourceOptions) -> None:
        super().__init__(AgentProvider(), name, {**props, "url": None}, opts)


@dataclass
class KvmHostArgs:
    target: HostTarget
    packages: list[str] = field(default_factory=lambda: list(DEFAULT_PACKAGES))
    tune_kernel: bool = True  # sysctls + KSM; off in the lab, whose hosts share this machine's kernel
    tenancy: str = "multi"  # KSM on only for "single" (osfleet.vm.host_tune's rule)


class KvmHost(pulumi.ComponentResource):
    """A host prepared for replicas over SSH: packages, libvirtd/virtlogd, /dev/kvm, kernel settings, image
    store, and a working ``osfleet`` command."""

    def __init__(self, name: str, args: KvmHostArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("osfleet:infra:KvmHost", name, None, opts)
        t = args.target
        self.target = t
        self.prep = _HostPrep(
            f"{name}-prep",
            {**t.conn(), "packages": args.packages, "home": t.home, "osfleet_bin": t.osfleet_bin,
             "osfleet_pip_spec": t.osfleet_pip_spec, "tune_kernel": args.tune_kernel, "tenancy": args.tenancy},
            pulumi.ResourceOptions(parent=self),
        )  # fmt: skip
        self.address = pulumi.Output.from_input(t.addr)
        self.image_store = self.prep.id.apply(lambda _: f"{t.home}/images")
        self.vcpus = self.prep.vcpus
        self.memory_gib = self.prep.memory_gib
        self.register_outputs(
            {
                "address": self.address,
                "image_store": self.image_store,
                "vcpus": self.vcpus,
                "memory_gib": self.memory_gib,
            }
        )


@dataclass
class GoldenImageArgs:
    recipe: str  # recipe file on this machine
    recipe_hash: str  # computed by the program at preview time: a new recipe replaces only the image
    hosts: list[KvmHost]
    build_dir: str = ""  # default: this machine's $OSFLEET_HOME/build


class GoldenImage(pulumi.ComponentResource):
    """The recipe's image built once on this machine (a cache hit by recipe hash) and published to every
    host's store, checksum-checked."""

    def __init__(self, name: str, args: GoldenImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("osfleet:infra:GoldenImage", name, None, opts)
        self.build = _ImageBuild(
            f"{name}-build",
            {"recipe": args.recipe, "recipe_hash": args.recipe_hash, "build_dir": args.build_dir},
            pulumi.ResourceOptions(parent=self),
        )
        self.published: dict[str, _ImagePublish] = {}
        for h in args.hosts:
            self.published[h.target.name] = _ImagePublish(
                f"{name}-{h.target.name}",
                {**h.target.conn(), "name": self.build.name, "manifest": self.build.manifest,
                 "disk_sha256": self.build.disk_sha256, "store": h.image_store},
                pulumi.ResourceOptions(parent=self, depends_on=[h.prep]),
            )  # fmt: skip
        self.image_name = self.build.name
        self.register_outputs({"image_name": self.image_name, "disk_sha256": self.build.disk_sha256})


class CertificateAuthority(pulumi.ComponentResource):
    """The stack's own CA: it signs a server certificate for each agent (``certificate``), and its certificate
    (``cert_pem``, public: the ``caCert`` output) is what the gateway and clients verify the agents against.
    Its key is a secret in the stack's state and nowhere else."""

    def __init__(
        self,
        name: str,
        common_name: str,
        dns_names: pulumi.Input[list[str]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``dns_names``: every DNS name its certificates will carry (``osfleet.tls.make_ca``'s constraint)."""
        super().__init__("osfleet:infra:CertificateAuthority", name, None, opts)
        props = {"common_name": common_name, "dns_names": dns_names}
        self.ca = _Ca(f"{name}-key", props, pulumi.ResourceOptions(parent=self))
        self.cert_pem: pulumi.Output[str] = self.ca.cert_pem
        self.register_outputs({"cert_pem": self.cert_pem})

    def certificate(self, name: str, names: pulumi.Input[list[str]], parent: pulumi.Resource) -> _Cert:
        """A server certificate for ``names`` (addresses or DNS names), a child of ``parent``."""
        return _Cert(
            name,
            {"names": names, "ca_cert_pem": self.ca.cert_pem, "ca_key_pem": secret(self.ca.key_pem)},
            pulumi.ResourceOptions(parent=parent),
        )


@dataclass
class HostAgentArgs:
    host: KvmHost
    image: GoldenImage
    token: pulumi.Input[str]  # from Pulumi secrets
    ca: CertificateAuthority  # signs the agent's certificate: the agent serves HTTPS only
    port: int = 8080
    warm: int = 1
    mode: str = "snapshot"
    tenancy: str = "multi"


class HostAgent(pulumi.ComponentResource):
    """``osfleet host serve`` on a host as a supervised service, over HTTPS with a certificate for the host's
    address signed by the stack's CA, healthy (and verified) before it counts as created."""

    def __init__(self, name: str, args: HostAgentArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("osfleet:infra:HostAgent", name, None, opts)
        t = args.host.target
        self.certificate = args.ca.certificate(f"{name}-tls", pulumi.Output.from_input(t.addr).apply(_names), self)
        self.agent = _Agent(
            f"{name}-agent",
            {**t.conn(), "home": t.home, "name_prefix": t.name_prefix, "osfleet_bin": t.osfleet_bin,
             "bind": t.bind or t.addr, "url_host": t.addr, "agent_port": args.port, "warm": args.warm,
             "mode": args.mode, "image": args.image.image_name, "token": secret(args.token),
             "tls_cert": self.certificate.cert_pem, "tls_key": secret(self.certificate.key_pem),
             "ca_cert": args.ca.cert_pem,
             "tenancy": args.tenancy},
            pulumi.ResourceOptions(parent=self, depends_on=[args.image.published[t.name]],
                                   additional_secret_outputs=["token", "tls_key"]),
        )  # fmt: skip
        self.url = self.agent.url
        self.register_outputs({"url": self.url})


def _names(addr: str) -> list[str]:
    """What an agent's certificate names: the address it is reached at (an IP or a DNS name)."""
    return [str(addr)]
