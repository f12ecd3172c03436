"""The ``aws`` and ``k8s`` stacks under ``pulumi.runtime.set_mocks``: their provider plugins cannot be
fetched here, so these check resource counts and the properties that matter (.metal only, no world-open
port, cloud-init = KvmHost's steps; privileged DaemonSet with /dev/kvm, probes, Secret, Locust)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "infra"))

from osfleet_infra.settings import ConfigError  # noqa: E402

# The generated AWS SDK warns about its own deprecated resources when its package is imported.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws.*")


class Mocks(pulumi.runtime.Mocks):
    """Records every resource; gives instances a public IP and the AMI lookup an id."""

    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ == "aws:ec2/instance:Instance":
            outs["publicIp"] = f"203.0.113.{len(self.of('aws:ec2/instance:Instance'))}"
        if args.typ == "aws:ec2/keyPair:KeyPair":
            outs["keyName"] = args.name
        if args.typ == "pulumi-python:dynamic:Resource" and "agent_port" in args.inputs:
            outs["url"] = f"http://{args.inputs['url_host']}:{int(args.inputs['agent_port'])}"
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0debian12", "architecture": "x86_64", "name": "debian-12-amd64-2026"}
        return {}

    def of(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]


@pytest.fixture
def ssh_key(tmp_path: Path) -> str:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return str(key)


@pytest.fixture
def mocks() -> Iterator[Mocks]:
    # Pulumi's mocks make futures on the main thread's current event loop. An earlier test's asyncio.run()
    # leaves the thread with none (and without making one on demand), so give it one, kept as current.
    policy = asyncio.get_event_loop_policy()
    try:
        policy.get_event_loop()
    except RuntimeError:
        policy.set_event_loop(policy.new_event_loop())
    yield Mocks()


def _stack(m: Mocks, stack: str, config: dict[str, str]) -> None:
    pulumi.runtime.set_mocks(m, project="osfleet", stack=stack, preview=False)
    pulumi.runtime.set_all_config(
        {"osfleet:agentToken": "s3cret-token", **{f"osfleet:{k}": v for k, v in config.items()}},
        secret_keys=["osfleet:agentToken"],
    )


def _aws_config(ssh_key: str, **over: str) -> dict[str, str]:
    return {
        "instanceType": "c5.metal",
        "count": "2",
        "allowedCidrs": '["198.51.100.0/24", "203.0.113.7/32"]',
        "sshKey": ssh_key,
        "osfleetPipSpec": "osfleet @ https://example.org/osfleet-0.1.0-py3-none-any.whl",
        **over,
    }


@pulumi.runtime.test
def _run_program() -> None:
    from osfleet_infra.program import run

    run()


def test_aws_stack_declares_metal_hosts_behind_a_closed_security_group(mocks: Mocks, ssh_key: str) -> None:
    _stack(mocks, "aws", _aws_config(ssh_key))
    _run_program()
    instances = mocks.of("aws:ec2/instance:Instance")
    assert len(instances) == 2
    assert len(mocks.of("aws:ec2/keyPair:KeyPair")) == 1
    (sg,) = mocks.of("aws:ec2/securityGroup:SecurityGroup")
    ingress = sg.inputs["ingress"]
    assert sorted((r["fromPort"], r["toPort"]) for r in ingress) == [(22, 22), (8080, 8080)]
    for rule in ingress:
        assert rule["cidrBlocks"] == ["198.51.100.0/24", "203.0.113.7/32"]
    for inst in instances:
        assert inst.inputs["instanceType"] == "c5.metal"
        assert inst.inputs["ami"] == "ami-0debian12"
        user_data = inst.inputs["userData"]
        assert user_data.startswith("#cloud-config\n")
        for step in ("libvirtd -d", "sysctl -q -p /etc/sysctl.d/90-osfleet.conf", "/dev/kvm", "pip install"):
            assert step in user_data
    # Then the same components as on bare metal, one of each per host and one image build.
    dynamic = mocks.of("pulumi-python:dynamic:Resource")
    names = sorted(r.name for r in dynamic)
    assert names == sorted(
        ["golden-build", "ec2-1-prep", "ec2-2-prep", "golden-ec2-1", "golden-ec2-2", "ec2-1-agent", "ec2-2-agent"]
    )
    agents = [r for r in dynamic if r.name.endswith("-agent")]
    assert sorted(a.inputs["url_host"] for a in agents) == ["203.0.113.1", "203.0.113.2"]
    assert all(a.inputs["bind"] == "0.0.0.0" for a in agents)


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"instanceType": "m5.large"}, "osfleet:instanceType: 'm5.large' is not a known .metal type"),
        ({"allowedCidrs": '["10.0.0.0/8", "0.0.0.0/0"]'}, "osfleet:allowedCidrs: 0.0.0.0/0 opens the agent"),
        ({"allowedCidrs": '["::/0"]'}, "osfleet:allowedCidrs: ::/0 opens the agent"),
        ({"allowedCidrs": "[]"}, "osfleet:allowedCidrs: no CIDRs"),
        ({"count": "0"}, "osfleet:count: 0 hosts"),
        ({"osfleetPipSpec": ""}, "osfleet:osfleetPipSpec: missing"),
    ],
)
def test_aws_bad_config_names_the_key(mocks: Mocks, ssh_key: str, over: dict[str, str], expected: str) -> None:
    from osfleet_infra.program import run

    _stack(mocks, "aws", _aws_config(ssh_key, **over))
    with pytest.raises(ConfigError) as err:
        run()
    assert str(err.value).startswith(expected)
    assert "\n" not in str(err.value)
    assert mocks.resources == []


def test_k8s_stack_runs_the_agent_as_a_privileged_daemonset_on_kvm_nodes(mocks: Mocks) -> None:
    _stack(mocks, "k8s", {"containerImage": "registry.example.org/osfleet:0.1.0", "warm": "4"})
    _run_program()
    (ns,) = mocks.of("kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == "osfleet"
    (secret,) = mocks.of("kubernetes:core/v1:Secret")
    # The token travels as a secret (Pulumi's secret envelope), never as plain state.
    assert secret.inputs["stringData"] == {
        "4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
        "value": {"token": "s3cret-token"},
    }
    (ds,) = mocks.of("kubernetes:apps/v1:DaemonSet")
    pod = ds.inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"osfleet.io/kvm": "true"}
    (c,) = pod["containers"]
    assert c["securityContext"] == {"privileged": True}
    assert c["command"][:3] == ["osfleet", "host", "serve"] and "--warm" in c["command"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health" == c["readinessProbe"]["httpGet"]["path"]
    assert c["resources"]["requests"] == {"memory": f"{512 + 4 * 350}Mi", "cpu": "1500m"}
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]} == {
        "kvm": "/dev/kvm", "store": "/var/lib/osfleet", "libvirt": "/var/run/libvirt",
    }  # fmt: skip
    token_env = next(e for e in c["env"] if e["name"] == "OSFLEET_API_TOKEN")
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": "osfleet-agent-token", "key": "token"}
    (cm,) = mocks.of("kubernetes:core/v1:ConfigMap")
    assert "osfleet.loadtest.trajectories" in cm.inputs["data"]["trajectories.py"]
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    assert deployments["osfleet-locust-master"].inputs["spec"]["replicas"] == 1
    assert deployments["osfleet-locust-worker"].inputs["spec"]["replicas"] == 2
    assert len(mocks.of("kubernetes:core/v1:Service")) == 2


def test_k8s_with_kvm_nodes_adds_the_fleet_gateway_in_front_of_the_agents(mocks: Mocks) -> None:
    _stack(
        mocks,
        "k8s",
        {"containerImage": "registry.example.org/osfleet:0.1.0", "kvmNodes": '["kvm-a=10.0.0.11", "kvm-b=10.0.0.12"]'},
    )
    _run_program()
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    gw = deployments["osfleet-gateway"].inputs["spec"]["template"]["spec"]
    (c,) = gw["containers"]
    assert c["command"] == [
        "osfleet", "fleet", "serve", "--bind", "0.0.0.0", "--port", "8090",
        "--host", "kvm-a=http://10.0.0.11:8080", "--host", "kvm-b=http://10.0.0.12:8080",
        "--hosts-token-file", "/run/osfleet/token",
    ]  # fmt: skip
    assert gw["volumes"] == [{"name": "token", "secret": {"secretName": "osfleet-agent-token"}}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8090}
    # The gateway's clients get the gateway's own token (a secret of its own, not the agents'): only the gateway
    # holds the agents' token, so a gateway client cannot call an agent as its operator.
    from osfleet_infra.k8s import derived_token

    made = mocks.of("kubernetes:core/v1:Secret")
    secrets = {x.inputs["metadata"]["name"]: x.inputs["stringData"]["value"] for x in made}
    assert secrets["osfleet-gateway-token"] == {"token": derived_token("s3cret-token")}
    assert secrets["osfleet-gateway-token"]["token"] != secrets["osfleet-agent-token"]["token"]
    gateway_env = next(e for e in c["env"] if e["name"] == "OSFLEET_API_TOKEN")
    assert gateway_env["valueFrom"]["secretKeyRef"] == {"name": "osfleet-gateway-token", "key": "token"}
    for role in ("master", "worker"):
        locust = deployments[f"osfleet-locust-{role}"].inputs["spec"]["template"]["spec"]
        (env,) = locust["containers"][0]["env"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == "osfleet-gateway-token"
        assert "volumes" not in locust or all(v.get("secret") is None for v in locust["volumes"])
    (ds,) = mocks.of("kubernetes:apps/v1:DaemonSet")
    assert ds.inputs["spec"]["template"]["spec"]["hostNetwork"] is True  # agents answer on the nodes' addresses
    services = {s.inputs["metadata"]["name"] for s in mocks.of("kubernetes:core/v1:Service")}
    assert services == {"osfleet-agent", "osfleet-gateway", "osfleet-locust-master"}
    master = deployments["osfleet-locust-master"].inputs["spec"]["template"]["spec"]["containers"][0]
    assert master["command"][-1] == "http://osfleet-gateway:8090"


def test_k8s_needs_a_container_image(mocks: Mocks) -> None:
    from osfleet_infra.program import run

    _stack(mocks, "k8s", {})
    with pytest.raises(ConfigError) as err:
        run()
    assert str(err.value) == "osfleet:containerImage: missing; the container image with osfleet installed"
