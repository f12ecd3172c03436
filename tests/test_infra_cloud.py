"""The ``aws`` and ``k8s`` stacks under ``pulumi.runtime.set_mocks``: their provider plugins cannot be
fetched here, so these check resource counts and the properties that matter (.metal only, no world-open
port, cloud-init = KvmHost's steps, KSM only as tenancy allows; privileged DaemonSet with /dev/kvm, probes,
Secret, Locust; TLS everywhere with the stack's own CA). The mocks make the CA and certificates with the
stack's real dynamic providers (``CaProvider``, ``CertProvider``), so the certificates checked here are real."""

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

from osfleet_infra.providers import CaProvider, CertProvider, TokenProvider, prep_steps  # noqa: E402
from osfleet_infra.settings import ConfigError  # noqa: E402

# The generated AWS SDK warns about its own deprecated resources when its package is imported.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws.*")]


class Mocks(pulumi.runtime.Mocks):
    """Records every resource; gives instances a public IP and the AMI lookup an id."""

    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.outputs: dict[str, dict[str, Any]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ == "aws:ec2/instance:Instance":
            outs["publicIp"] = f"203.0.113.{len(self.of('aws:ec2/instance:Instance'))}"
        if args.typ == "aws:ec2/keyPair:KeyPair":
            outs["keyName"] = args.name
        if args.typ == "pulumi-python:dynamic:Resource" and "agent_port" in args.inputs:
            scheme = "https" if args.inputs.get("tls_cert") else "http"
            outs["url"] = f"{scheme}://{args.inputs['url_host']}:{int(args.inputs['agent_port'])}"
        if args.typ == "pulumi-python:dynamic:Resource" and "common_name" in args.inputs:
            outs = CaProvider().create(_unwrapped(args.inputs)).outs  # the stack's CA, as the provider makes it
        if args.typ == "pulumi-python:dynamic:Resource" and args.name == "agent-token":
            outs = TokenProvider().create(_unwrapped(args.inputs)).outs  # a new token, as the provider makes it
        if args.typ == "pulumi-python:dynamic:Resource" and "ca_key_pem" in args.inputs:
            outs = CertProvider().create(_unwrapped(args.inputs)).outs
        self.outputs[args.name] = outs
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0debian12", "architecture": "x86_64", "name": "debian-12-amd64-2026"}
        return {}

    def of(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]


def _unwrapped(inputs: dict[str, Any]) -> dict[str, Any]:
    """Inputs as a dynamic provider receives them: secrets unwrapped."""
    return {k: v["value"] if isinstance(v, dict) and SECRET_SIG in v else v for k, v in inputs.items()}


@pytest.fixture
def ssh_key(tmp_path: Path) -> str:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return str(key)


@pytest.fixture
def mocks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Mocks]:
    # The CA provider runs for real and records each CA it makes in $OSFLEET_HOME/pulumi/stack-cas, the bundle a
    # shell with `osfleet infra env` trusts; a mocked stack is never destroyed, so keep that out of this machine's.
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
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


@pytest.mark.system
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
        assert "echo 2 > /sys/kernel/mm/ksm/run" in user_data and "pages_to_scan" not in user_data  # multi-tenant
    # Then the same components as on bare metal, one of each per host, one image build, one CA.
    dynamic = mocks.of("pulumi-python:dynamic:Resource")
    names = sorted(r.name for r in dynamic)
    assert names == sorted(
        ["golden-build", "ec2-1-prep", "ec2-2-prep", "golden-ec2-1", "golden-ec2-2", "ec2-1-agent", "ec2-2-agent",
         "tls-key", "ec2-1-tls", "ec2-2-tls"]
    )  # fmt: skip
    agents = [r for r in dynamic if r.name.endswith("-agent")]
    assert sorted(a.inputs["url_host"] for a in agents) == ["203.0.113.1", "203.0.113.2"]
    assert all(a.inputs["bind"] == "0.0.0.0" for a in agents)
    (ca,) = [r for r in dynamic if r.name == "tls-key"]
    for a in agents:
        assert a.inputs["tenancy"] == "multi"
        assert a.inputs["ca_cert"] == ca_pem(mocks)
        assert_serves(a.inputs["tls_cert"], ca_pem(mocks), a.inputs["url_host"])
        assert is_secret(a.inputs["tls_key"]) and is_secret(a.inputs["token"])
    for cert in (r for r in dynamic if r.name.endswith("-tls")):
        assert is_secret(cert.inputs["ca_key_pem"])  # the CA's key travels only as a secret


def ca_pem(m: Mocks) -> str:
    """The certificate the mocked stack's CA resource made."""
    (ca,) = [r for r in m.of("pulumi-python:dynamic:Resource") if "common_name" in r.inputs]
    return str(m.outputs[ca.name]["cert_pem"])


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE


def assert_serves(cert_pem: str, ca_cert_pem: str, name: str) -> None:
    """``cert_pem`` is signed by ``ca_cert_pem`` and names ``name`` (an IP or DNS name): a TLS client that
    trusts the CA alone accepts it for ``name``."""
    import ipaddress

    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_cert_pem.encode()))
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    try:
        assert ipaddress.ip_address(name) in alt.get_values_for_type(x509.IPAddress)
    except ValueError:
        assert name in alt.get_values_for_type(x509.DNSName)


SECRET_SIG, SECRET_VALUE = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


@pytest.mark.system
def test_single_tenant_aws_hosts_get_ksm_and_bad_tenancy_names_the_key(mocks: Mocks, ssh_key: str) -> None:
    _stack(mocks, "aws", _aws_config(ssh_key, tenancy="single"))
    _run_program()
    for inst in mocks.of("aws:ec2/instance:Instance"):
        user_data = inst.inputs["userData"]
        assert "echo 1000 > /sys/kernel/mm/ksm/pages_to_scan" in user_data
        assert "echo 1 > /sys/kernel/mm/ksm/run" in user_data
    from osfleet_infra.program import run

    _stack(Mocks(), "aws", _aws_config(ssh_key, tenancy="shared"))
    with pytest.raises(ConfigError) as err:
        run()
    assert str(err.value) == "osfleet:tenancy: 'shared' is not one of single, multi"


@pytest.mark.unit
def test_host_preparation_sets_ksm_by_the_host_tune_rule() -> None:
    def ksm(tenancy: str) -> str:
        steps = dict(prep_steps(["qemu-utils"], True, "/var/lib/osfleet", tenancy))
        (what,) = [w for w in steps if "KSM" in w]
        return what + " | " + steps[what].split("; ", 1)[1]

    multi, single = ksm("multi"), ksm("single")
    assert multi.startswith("applying the fleet sysctls; KSM off and unmerged |")
    assert "echo 2 > /sys/kernel/mm/ksm/run" in multi and "echo 1 >" not in multi and "pages_to_scan" not in multi
    assert single.startswith("applying the fleet sysctls; KSM on, 1000 pages every 20 ms |")
    rates, on = single.index("pages_to_scan"), single.index("echo 1 > /sys/kernel/mm/ksm/run")
    assert rates < on  # the scan rate is set before KSM starts
    assert not any("KSM" in w for w, _ in prep_steps(["qemu-utils"], False, "/var/lib/osfleet", "single"))


@pytest.mark.unit
def test_certificates_are_renewed_by_an_up_near_their_end_and_not_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))  # the CA it makes is recorded there, not in this machine's
    from osfleet.tls import issue, make_ca

    ca = CaProvider().create({"common_name": "t", "dns_names": []}).outs
    made = CertProvider().create({"names": ["10.0.0.5"], "ca_cert_pem": ca["cert_pem"], "ca_key_pem": ca["key_pem"]})
    news = {"names": ["10.0.0.5"], "ca_cert_pem": ca["cert_pem"], "ca_key_pem": ca["key_pem"]}
    assert "ca_key_pem" not in made.outs  # the CA's key is not copied into each certificate's state
    assert CertProvider().diff("id", made.outs, news).changes is False  # a second up changes nothing
    assert CaProvider().diff("id", ca, {"common_name": "t", "dns_names": []}).changes is False
    assert CertProvider().diff("id", made.outs, {**news, "names": ["10.0.0.6"]}).changes is True
    pair = make_ca("t2")
    short = issue(pair, ["10.0.0.5"], days=10)  # inside the renewal window
    assert CertProvider().diff("id", {**made.outs, "cert_pem": short.cert_pem}, news).changes is True
    renewed = CertProvider().update("id", made.outs, news).outs
    assert renewed["cert_pem"] != made.outs["cert_pem"]
    assert_serves(renewed["cert_pem"], ca["cert_pem"], "10.0.0.5")


@pytest.mark.system
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


@pytest.mark.unit
def test_k8s_stack_runs_the_agent_as_a_privileged_daemonset_on_kvm_nodes(mocks: Mocks) -> None:
    config = {"containerImage": "registry.example.org/osfleet:0.1.0", "warm": "4", "checkCluster": "false"}
    _stack(mocks, "k8s", {**config, "gatewayDiscovery": "false"})  # the agents alone (the gateway: tests below)
    _run_program()
    (ns,) = mocks.of("kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == "osfleet"
    secrets = {x.inputs["metadata"]["name"]: x for x in mocks.of("kubernetes:core/v1:Secret")}
    assert set(secrets) == {"osfleet-agent-token", "osfleet-agent-tls", "osfleet-ca"}
    secret = secrets["osfleet-agent-token"]
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
    assert c["command"][-4:] == ["--tls-cert", "/run/osfleet-tls/tls.crt", "--tls-key", "/run/osfleet-tls/tls.key"]
    # Restarted only when its process stops answering; out of service while it cannot serve (osfleet.api.probes).
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 8080, "scheme": "HTTPS"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080, "scheme": "HTTPS"}
    assert c["startupProbe"]["httpGet"]["path"] == "/livez" and c["startupProbe"]["failureThreshold"] == 120
    # TLS: the agents' certificate, signed by the stack's CA, for the Service's names; its key only as a secret.
    tls = secrets["osfleet-agent-tls"].inputs
    assert tls["type"] == "kubernetes.io/tls" and is_secret(tls["stringData"])
    assert secrets["osfleet-ca"].inputs["stringData"]["value"] == {"ca.crt": ca_pem(mocks)}  # its certificate alone
    for name in ("osfleet-agent", "osfleet-agent.osfleet.svc", "osfleet-agent.osfleet.svc.cluster.local"):
        assert_serves(tls["stringData"]["value"]["tls.crt"], ca_pem(mocks), name)
    assert {"name": "OSFLEET_TENANCY", "value": "multi"} in c["env"]
    assert c["resources"]["requests"] == {"memory": f"{512 + 4 * 350}Mi", "cpu": "1500m"}
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "kvm": "/dev/kvm", "store": "/var/lib/osfleet", "libvirt": "/var/run/libvirt",
        "channels": "/var/lib/libvirt/qemu/channel/target",  # the guests' control sockets libvirtd makes
    }  # fmt: skip
    assert {"name": "tls", "secret": {"secretName": "osfleet-agent-tls"}} in pod["volumes"]
    token_env = next(e for e in c["env"] if e["name"] == "OSFLEET_API_TOKEN")
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": "osfleet-agent-token", "key": "token"}
    (cm,) = mocks.of("kubernetes:core/v1:ConfigMap")
    assert "osfleet.loadtest.trajectories" in cm.inputs["data"]["trajectories.py"]
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    assert deployments["osfleet-locust-master"].inputs["spec"]["replicas"] == 1
    assert deployments["osfleet-locust-worker"].inputs["spec"]["replicas"] == 2
    assert len(mocks.of("kubernetes:core/v1:Service")) == 2


@pytest.mark.unit
def test_k8s_with_kvm_nodes_adds_the_fleet_gateway_in_front_of_the_agents(mocks: Mocks) -> None:
    _stack(
        mocks,
        "k8s",
        {
            "containerImage": "registry.example.org/osfleet:0.1.0",
            "kvmNodes": '["kvm-a=10.0.0.11", "kvm-b=10.0.0.12"]',
            "checkCluster": "false",
        },
    )
    _run_program()
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    gw = deployments["osfleet-gateway"].inputs["spec"]["template"]["spec"]
    (c,) = gw["containers"]
    assert c["command"] == [
        "osfleet", "fleet", "serve", "--bind", "0.0.0.0", "--port", "8090",
        "--host", "kvm-a=https://10.0.0.11:8080", "--host", "kvm-b=https://10.0.0.12:8080",
        "--hosts-token-file", "/run/osfleet/token",
        "--hosts-ca-file", "/run/osfleet-ca/ca.crt",
        "--tls-cert", "/run/osfleet-tls/tls.crt", "--tls-key", "/run/osfleet-tls/tls.key",
    ]  # fmt: skip
    assert gw["volumes"] == [
        {"name": "token", "secret": {"secretName": "osfleet-agent-token"}},
        {"name": "tls", "secret": {"secretName": "osfleet-gateway-tls"}},
        {"name": "ca", "secret": {"secretName": "osfleet-ca"}},  # the CA's certificate, never the agents' key
    ]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8090, "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 8090, "scheme": "HTTPS"}
    # The agents' certificate names the KVM nodes' addresses the gateway calls them at; the gateway's its Service.
    secrets = {x.inputs["metadata"]["name"]: x.inputs["stringData"] for x in mocks.of("kubernetes:core/v1:Secret")}
    for addr in ("10.0.0.11", "10.0.0.12"):
        assert_serves(secrets["osfleet-agent-tls"]["value"]["tls.crt"], ca_pem(mocks), addr)
    assert_serves(secrets["osfleet-gateway-tls"]["value"]["tls.crt"], ca_pem(mocks), "osfleet-gateway.osfleet.svc")
    # The gateway's clients get the gateway's own token (a secret of its own, not the agents'): only the gateway
    # holds the agents' token, so a gateway client cannot call an agent as its operator.
    from osfleet_infra.k8s import derived_token

    assert secrets["osfleet-gateway-token"]["value"] == {"token": derived_token("s3cret-token")}
    assert secrets["osfleet-gateway-token"]["value"]["token"] != secrets["osfleet-agent-token"]["value"]["token"]
    gateway_env = next(e for e in c["env"] if e["name"] == "OSFLEET_API_TOKEN")
    assert gateway_env["valueFrom"]["secretKeyRef"] == {"name": "osfleet-gateway-token", "key": "token"}
    for role in ("master", "worker"):
        locust = deployments[f"osfleet-locust-{role}"].inputs["spec"]["template"]["spec"]
        (env,) = locust["containers"][0]["env"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == "osfleet-gateway-token"
        assert all(v.get("secret", {}).get("secretName") != "osfleet-agent-token" for v in locust.get("volumes", []))
    (ds,) = mocks.of("kubernetes:apps/v1:DaemonSet")
    assert ds.inputs["spec"]["template"]["spec"]["hostNetwork"] is True  # agents answer on the nodes' addresses
    services = {s.inputs["metadata"]["name"] for s in mocks.of("kubernetes:core/v1:Service")}
    assert services == {"osfleet-agent", "osfleet-gateway", "osfleet-locust-master"}
    master = deployments["osfleet-locust-master"].inputs["spec"]["template"]["spec"]["containers"][0]
    cmd = master["command"]
    assert cmd[cmd.index("--host") + 1] == "https://osfleet-gateway:8090"
    assert cmd[-2:] == ["--ca-file", "/run/osfleet-ca/ca.crt"]
    # a short load of its own once its workers joined, its results kept in the web UI
    assert "--autostart" in cmd and cmd[cmd.index("--run-time") + 1] == "60s"
    assert cmd[cmd.index("--expect-workers") + 1] == "2"
    (wait,) = deployments["osfleet-locust-master"].inputs["spec"]["template"]["spec"]["initContainers"]
    assert wait["command"][-2:] == ["https://osfleet-gateway:8090/health", "/run/osfleet-ca/ca.crt"]


@pytest.mark.unit
def test_k8s_makes_the_agents_token_when_none_is_set(mocks: Mocks) -> None:
    """What a user types first (and what the k8s-real check does): no 'osfleet infra token' before 'pulumi up'."""
    pulumi.runtime.set_mocks(mocks, project="osfleet", stack="k8s", preview=False)
    pulumi.runtime.set_all_config({"osfleet:containerImage": "localhost/osfleet:1", "osfleet:checkCluster": "false"})
    _run_program()
    (made,) = [r for r in mocks.of("pulumi-python:dynamic:Resource") if r.name == "agent-token"]
    token = mocks.outputs["agent-token"]["token"]
    assert len(token) >= 32
    secrets = {x.inputs["metadata"]["name"]: x for x in mocks.of("kubernetes:core/v1:Secret")}
    assert secrets["osfleet-agent-token"].inputs["stringData"] == {SECRET_SIG: SECRET_VALUE, "value": {"token": token}}
    assert made.name == "agent-token"


@pytest.mark.unit
def test_k8s_needs_a_container_image(mocks: Mocks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from osfleet_infra.program import run

    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))  # no image built on this "machine"
    _stack(mocks, "k8s", {})
    with pytest.raises(ConfigError) as err:
        run()
    assert str(err.value) == (
        "osfleet:containerImage: missing; run 'osfleet image container', or set it to your registry's osfleet image"
    )


@pytest.mark.unit
def test_k8s_deploys_the_newest_image_built_here_by_default(
    mocks: Mocks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from osfleet.config import Settings
    from osfleet.imaging.container import images_dir

    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    store = images_dir(Settings.from_env())
    store.mkdir(parents=True)
    for age, tag in ((200, "0.1.0-aaaaaaaaaaaa"), (100, "0.1.0-bbbbbbbbbbbb")):
        archive = store / f"osfleet-{tag}.oci.tar"
        archive.write_bytes(b"")
        os.utime(archive, (archive.stat().st_mtime - age,) * 2)
    _stack(mocks, "k8s", {"checkCluster": "false"})
    _run_program()
    (agents,) = mocks.of("kubernetes:apps/v1:DaemonSet")
    (container,) = agents.inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/osfleet:0.1.0-bbbbbbbbbbbb"


@pytest.mark.unit
def test_k8s_puts_a_discovering_gateway_in_front_by_default(mocks: Mocks) -> None:
    _stack(mocks, "k8s", {"containerImage": "localhost/osfleet:0.1.0-abc", "checkCluster": "false"})
    _run_program()
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    (c,) = deployments["osfleet-gateway"].inputs["spec"]["template"]["spec"]["containers"]
    assert "--host" not in c["command"] and deployments["osfleet-gateway"].inputs["spec"]["replicas"] == 2


@pytest.mark.unit
def test_k8s_with_discovery_runs_two_gateways_that_find_the_agents_with_a_read_only_account(mocks: Mocks) -> None:
    _stack(
        mocks,
        "k8s",
        {"containerImage": "localhost/osfleet:0.1.0-abc", "gatewayDiscovery": "true", "fleetAddress": "10.9.8.7",
         "namePrefix": "osfleet-k8s-", "memoryDir": "/dev/shm/osfleet-k8s", "checkCluster": "false"},
    )  # fmt: skip
    _run_program()
    deployments = {d.inputs["metadata"]["name"]: d for d in mocks.of("kubernetes:apps/v1:Deployment")}
    gw = deployments["osfleet-gateway"].inputs["spec"]
    assert gw["replicas"] == 2
    pod = gw["template"]["spec"]
    assert pod["serviceAccountName"] == "osfleet-gateway" and pod["automountServiceAccountToken"] is True
    (c,) = pod["containers"]
    cmd = c["command"]
    assert "--host" not in cmd
    assert (
        cmd[cmd.index("--discover-pods") + 1]
        == "app.kubernetes.io/name=osfleet-agent,app.kubernetes.io/part-of=osfleet"
    )
    assert cmd[cmd.index("--hosts-tls-name") + 1] == "osfleet-agent.osfleet.svc"
    assert c["imagePullPolicy"] == "IfNotPresent"
    # Least privilege: read the agent pods of its namespace and the nodes; nothing else, no write.
    roles = {r.inputs["metadata"]["name"]: r for r in mocks.of("kubernetes:rbac.authorization.k8s.io/v1:Role")}
    assert roles["osfleet-gateway-pods"].inputs["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    (cluster_role,) = mocks.of("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert cluster_role.inputs["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    subjects = {
        b.inputs["metadata"]["name"]: b.inputs["subjects"]
        for b in mocks.of("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
        + mocks.of("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    }
    gateway = [{"kind": "ServiceAccount", "name": "osfleet-gateway", "namespace": "osfleet"}]
    assert subjects == {
        "osfleet-gateway-pods": gateway,
        "osfleet-gateway-nodes-osfleet": gateway,
        "osfleet-agent": [{"kind": "ServiceAccount", "name": "osfleet-agent", "namespace": "osfleet"}],
    }
    # The agent may read its own DaemonSet alone: at shutdown, there or not tells a restart from an uninstall.
    assert roles["osfleet-agent"].inputs["rules"] == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["osfleet-agent"], "verbs": ["get"]}
    ]
    services = {s.inputs["metadata"]["name"]: s.inputs["spec"] for s in mocks.of("kubernetes:core/v1:Service")}
    assert services["osfleet-gateway"]["type"] == "NodePort"
    # The agents answer on their pods' addresses (not the nodes'), on every KVM-labelled node whatever its taints,
    # with the node's replica prefix and RAM-file folder at the node's own path.
    (ds,) = mocks.of("kubernetes:apps/v1:DaemonSet")
    agent = ds.inputs["spec"]["template"]["spec"]
    assert "hostNetwork" not in agent
    assert agent["serviceAccountName"] == "osfleet-agent" and agent["automountServiceAccountToken"] is True
    assert agent["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e.get("value") for e in agent["containers"][0]["env"]}
    assert env["OSFLEET_NAME_PREFIX"] == "osfleet-k8s-" and env["OSFLEET_MEMORY_DIR"] == "/dev/shm/osfleet-k8s"
    assert env["OSFLEET_K8S_DAEMONSET"] == "osfleet-agent" == ds.inputs["metadata"]["name"]
    assert {v["name"]: v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}[
        "memory"
    ] == "/dev/shm/osfleet-k8s"
    secrets = {x.inputs["metadata"]["name"]: x.inputs["stringData"] for x in mocks.of("kubernetes:core/v1:Secret")}
    assert_serves(secrets["osfleet-gateway-tls"]["value"]["tls.crt"], ca_pem(mocks), "10.9.8.7")  # the fleetUrl's
    assert_serves(secrets["osfleet-agent-tls"]["value"]["tls.crt"], ca_pem(mocks), "osfleet-agent.osfleet.svc")
    for role_name in ("master", "worker"):
        locust = deployments[f"osfleet-locust-{role_name}"].inputs["spec"]["template"]["spec"]
        assert locust["automountServiceAccountToken"] is False
        assert locust["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "osfleet-gateway-token"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"gatewayDiscovery": "true", "kvmNodes": '["a=10.0.0.1"]'}, "osfleet:gatewayDiscovery: true and a kvmNodes"),
        ({"gatewayServiceType": "ExternalName"}, "osfleet:gatewayServiceType: 'ExternalName' is not one of"),
        ({"gatewayReplicas": "0"}, "osfleet:gatewayReplicas: 0 is out of range 1..20"),
        ({"imagePullPolicy": "Sometimes"}, "osfleet:imagePullPolicy: 'Sometimes' is not one of"),
        ({"namePrefix": "lab-"}, "osfleet:namePrefix: 'lab-' must look like"),
    ],
)
def test_k8s_bad_config_names_the_key(mocks: Mocks, over: dict[str, str], expected: str) -> None:
    from osfleet_infra.program import run

    _stack(mocks, "k8s", {"containerImage": "localhost/osfleet:1", "checkCluster": "false", **over})
    with pytest.raises(ConfigError) as err:
        run()
    assert str(err.value).startswith(expected)
    assert mocks.resources == []


@pytest.mark.unit
def test_k8s_pods_wait_for_the_rbac_objects_of_their_accounts(mocks: Mocks) -> None:
    """``up`` starts no pod whose account cannot act yet; ``destroy`` deletes the pods before their account's RBAC
    (an agent reads its own DaemonSet as it shuts down, to tell an uninstall from a restart)."""
    _stack(mocks, "k8s", {"containerImage": "localhost/osfleet:0.1.0-abc", "checkCluster": "false"})
    depends: dict[str, set[str]] = {}

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        depends[args.name] = {d._name for d in args.opts.depends_on or []}  # type: ignore[union-attr,misc]
        return None

    pulumi.runtime.register_stack_transformation(record)
    _run_program()
    assert depends["osfleet-gateway"] == {"osfleet-gateway-sa", "osfleet-gateway-pods", "osfleet-gateway-nodes"}
    assert depends["osfleet-agent"] == {"osfleet-agent-sa", "osfleet-agent-owner"}
