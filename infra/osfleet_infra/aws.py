"""The ``aws`` stack: EC2 ``.metal`` instances (KVM needs bare metal) prepared by cloud-init with the same
steps ``KvmHost`` runs over SSH, then the same KvmHost, GoldenImage and HostAgent components over SSH.

The agent port and SSH are opened only to ``osfleet:allowedCidrs``; a world-open CIDR fails the preview.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pulumi
import yaml

from osfleet_infra.bare_metal import deploy_bare_metal
from osfleet_infra.components import DEFAULT_PACKAGES, HostTarget
from osfleet_infra.providers import prep_steps
from osfleet_infra.settings import Common, ConfigError, list_value

# .metal types with enough memory for a fleet; KVM replicas do not run on virtualised EC2 types.
METAL_TYPES = (
    "c5.metal", "c5n.metal", "c5d.metal", "c6i.metal", "c7i.metal-24xl", "c7i.metal-48xl", "m5.metal",
    "m5d.metal", "m5zn.metal", "m6i.metal", "m7i.metal-24xl", "m7i.metal-48xl", "r5.metal", "r6i.metal",
    "r7i.metal-24xl", "z1d.metal", "i3.metal", "i4i.metal",
)  # fmt: skip
DEFAULT_INSTANCE_TYPE = "c5.metal"
DEFAULT_COUNT = 1
DEFAULT_AMI_OWNER = "136693071363"  # Debian's AWS account
DEFAULT_AMI_NAME = "debian-12-amd64-*"
DEFAULT_DISK_GIB = 200
DEFAULT_OSFLEET_BIN = "/opt/osfleet/bin/osfleet"
HOME = "/var/lib/osfleet"


@dataclass(frozen=True)
class AwsConfig:
    instance_type: str
    count: int
    ami_owner: str
    ami_name: str
    ssh_key: str
    public_key: str
    allowed_cidrs: list[str]
    osfleet_pip_spec: str
    disk_gib: int


def read_aws(cfg: pulumi.Config) -> AwsConfig:
    itype = cfg.get("instanceType") or DEFAULT_INSTANCE_TYPE
    if itype not in METAL_TYPES:
        raise ConfigError("instanceType", f"{itype!r} is not a known .metal type (KVM needs bare metal)")
    count = cfg.get_int("count")
    count = DEFAULT_COUNT if count is None else count
    if count < 1:
        raise ConfigError("count", f"{count} hosts: a stack needs at least one")
    cidrs = list_value(cfg, "allowedCidrs")
    if not cidrs:
        raise ConfigError("allowedCidrs", "no CIDRs; list the networks allowed to reach the agent and SSH")
    for c in cidrs:
        try:
            net = ipaddress.ip_network(str(c), strict=False)
        except ValueError:
            raise ConfigError("allowedCidrs", f"{c!r} is not a CIDR") from None
        if net.prefixlen == 0:
            raise ConfigError("allowedCidrs", f"{c} opens the agent to the whole internet; list your own networks")
    key = os.path.expanduser(cfg.get("sshKey") or "~/.ssh/id_ed25519")
    if not Path(key).is_file() or not Path(key + ".pub").is_file():
        raise ConfigError("sshKey", f"need the private key {key} and its public key {key}.pub")
    spec = cfg.get("osfleetPipSpec")
    if not spec:
        raise ConfigError("osfleetPipSpec", "missing; a pip requirement for osfleet (a wheel URL or git URL)")
    disk = cfg.get_int("diskGiB") or DEFAULT_DISK_GIB
    return AwsConfig(
        instance_type=itype, count=count, ami_owner=cfg.get("amiOwner") or DEFAULT_AMI_OWNER,
        ami_name=cfg.get("amiName") or DEFAULT_AMI_NAME, ssh_key=key, public_key=Path(key + ".pub").read_text().strip(),
        allowed_cidrs=[str(c) for c in cidrs], osfleet_pip_spec=spec, disk_gib=disk,
    )  # fmt: skip


def cloud_init(spec: str, tenancy: str = "multi") -> str:
    """cloud-config running KvmHost's preparation steps (KSM as ``tenancy`` allows), then osfleet into
    /opt/osfleet."""
    steps = [["sh", "-c", f"( {cmd} )"] for _, cmd in prep_steps(list(DEFAULT_PACKAGES), True, HOME, tenancy)]
    steps.append(["sh", "-c", f"python3 -m venv /opt/osfleet && /opt/osfleet/bin/pip install -q {shlex.quote(spec)}"])
    # Root by key (the key pair's): KvmHost, GoldenImage and HostAgent then reach it as on any other host.
    return "#cloud-config\n" + yaml.safe_dump({"disable_root": False, "runcmd": steps}, sort_keys=False)


class Ec2KvmHosts(pulumi.ComponentResource):
    """``count`` EC2 .metal instances behind one security group, with a key pair and cloud-init."""

    def __init__(
        self, name: str, a: AwsConfig, agent_port: int, tenancy: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        import pulumi_aws as aws

        super().__init__("osfleet:infra:Ec2KvmHosts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ami = aws.ec2.get_ami(
            most_recent=True,
            owners=[a.ami_owner],
            filters=[
                aws.ec2.GetAmiFilterArgs(name="name", values=[a.ami_name]),
                aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
            ],
        )
        self.key_pair = aws.ec2.KeyPair(f"{name}-key", public_key=a.public_key, opts=child)
        tcp = [
            aws.ec2.SecurityGroupIngressArgs(protocol="tcp", from_port=p, to_port=p, cidr_blocks=a.allowed_cidrs)
            for p in (22, agent_port)
        ]
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            description="osfleet host agents: SSH and the agent port from the allowed CIDRs only",
            ingress=tcp,
            egress=[aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"])],
            opts=child,
        )
        self.instances = [
            aws.ec2.Instance(
                f"{name}-{i}",
                instance_type=a.instance_type,
                ami=ami.id,
                key_name=self.key_pair.key_name,
                vpc_security_group_ids=[self.security_group.id],
                user_data=cloud_init(a.osfleet_pip_spec, tenancy),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(volume_size=a.disk_gib, volume_type="gp3"),
                tags={"Name": f"osfleet-{name}-{i}", "osfleet": "kvm-host"},
                opts=child,
            )
            for i in range(1, a.count + 1)
        ]
        self.public_ips = [inst.public_ip for inst in self.instances]
        self.register_outputs({"public_ips": self.public_ips})


def deploy_aws(cfg: pulumi.Config, common: Common) -> None:
    a = read_aws(cfg)
    hosts = Ec2KvmHosts("ec2", a, common.agent_port, common.tenancy)
    targets = [
        HostTarget(name=f"ec2-{i}", addr=ip, user="root", key_file=a.ssh_key, home=HOME,
                   osfleet_bin=DEFAULT_OSFLEET_BIN, bind="0.0.0.0")
        for i, ip in enumerate(hosts.public_ips, 1)
    ]  # fmt: skip
    deploy_bare_metal(targets, common, tune_kernel=False)  # cloud-init already tuned the kernel
    pulumi.export("instanceType", a.instance_type)
