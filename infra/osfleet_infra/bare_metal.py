"""The stacks whose hosts osfleet prepares itself over SSH (``lab``, ``onprem``, and ``aws`` once its EC2
instances are up): a KVM host, a golden image and a host agent per target, one CA for them, and the outputs.

Apart from ``program.py`` (which picks a stack) because the ``aws`` stack ends here too: the program imports
the stacks, and a stack must not import the program back.
"""

from __future__ import annotations

from typing import Any

import pulumi

from osfleet.tls import dns_names_of
from osfleet_infra.components import (
    CertificateAuthority,
    GoldenImage,
    GoldenImageArgs,
    HostAgent,
    HostAgentArgs,
    HostTarget,
    KvmHost,
    KvmHostArgs,
)
from osfleet_infra.settings import Common


def deploy_bare_metal(targets: list[HostTarget], common: Common, tune_kernel: bool) -> None:
    hosts = [KvmHost(t.name, KvmHostArgs(target=t, tune_kernel=tune_kernel, tenancy=common.tenancy)) for t in targets]
    addresses = pulumi.Output.all(*[t.addr for t in targets]).apply(lambda a: dns_names_of([str(x) for x in a]))
    ca = CertificateAuthority("tls", f"osfleet {pulumi.get_project()}/{pulumi.get_stack()} CA", addresses)
    image = GoldenImage(
        "golden", GoldenImageArgs(recipe=str(common.recipe), recipe_hash=common.recipe_hash, hosts=hosts)
    )
    agents = [
        HostAgent(
            h.target.name,
            HostAgentArgs(
                host=h,
                image=image,
                token=common.token,
                ca=ca,
                port=common.agent_port,
                warm=common.warm,
                mode=common.mode,
                tenancy=common.tenancy,
            ),
        )
        for h in hosts
    ]
    pulumi.export("hosts", {h.target.name: h.address for h in hosts})
    # agentUrls: the agents' URLs in host order (what a script iterates); agents: the same by host name.
    pulumi.export("agentUrls", [a.url for a in agents])
    pulumi.export("agents", {a_h.target.name: a.url for a, a_h in zip(agents, hosts, strict=True)})
    pulumi.export("caCert", ca.cert_pem)  # what clients verify the agents' certificates against
    pulumi.export("goldenImage", image.image_name)
    pulumi.export("agentToken", common.token)
    pulumi.export("tenancy", common.tenancy)
    if common.footprint is not None:
        capacity = {h.target.name: _capacity(h, common) for h in hosts}
        pulumi.export("replicaCapacity", {n: c.apply(lambda x: x[0]) for n, c in capacity.items()})
        pulumi.export("bindingResource", {n: c.apply(lambda x: x[1]) for n, c in capacity.items()})
        if common.usd_per_host_hour is not None:
            price = common.usd_per_host_hour
            pulumi.export(
                "usdPerReplicaDay",
                {n: c.apply(lambda x: round(price * 24 / x[0], 4) if x[0] else None) for n, c in capacity.items()},
            )
    else:
        pulumi.log.info("no osfleet:footprintRun: replica capacity and cost outputs need a measured footprint")


def _capacity(h: KvmHost, common: Common) -> pulumi.Output[tuple[int, str]]:
    """Replicas the host holds by the measured footprint, and the resource that binds first (osfleet.measure.cost)."""
    from osfleet.measure.cost import HostType, replicas_per_host

    def compute(v: list[Any]) -> tuple[int, str]:
        host = HostType(
            h.target.name, int(v[0]), float(v[1]), common.usd_per_host_hour or 0.0, "osfleet:usdPerHostHour"
        )
        return replicas_per_host(host, common.footprint)

    return pulumi.Output.all(h.vcpus, h.memory_gib).apply(compute)
