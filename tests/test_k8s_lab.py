"""The k8s lab's files and bookkeeping (``osfleet.lab.kube``): addresses, certificates with the identities
Kubernetes' RBAC expects, the components' configuration, and a ``down`` that finds nothing to remove when nothing
is up. The cluster itself is built from the Go module proxy (``scripts/build-k8s``, 30-60 minutes the first time on
two cores) and is run by ``osfleet bench k8s-scale`` and the project's Kubernetes acceptance check, not by CI's test
runs, whose time budget a first build alone would use up."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from osfleet.lab.kube import configs
from osfleet.lab.kube.cluster import down, leftovers, running, up
from osfleet.lab.kube.state import Addresses, KubeLabState, load, save


def lab(tmp_path: Path) -> KubeLabState:
    return KubeLabState(root=str(tmp_path / "lab"), subnet="10.233.9.0/24", tools=str(tmp_path / "tools" / "bin"))


@pytest.mark.unit
def test_addresses_split_one_24_into_link_pods_and_services() -> None:
    a = Addresses("10.233.9.0/24")
    assert (a.host, a.node, a.pods, a.services, a.kubernetes_service) == (
        "10.233.9.1", "10.233.9.2", "10.233.9.64/26", "10.233.9.128/25", "10.233.9.129",
    )  # fmt: skip
    nets = [ipaddress.ip_network(n) for n in ("10.233.9.0/30", a.pods, a.services)]
    assert not any(x.overlaps(y) for i, x in enumerate(nets) for y in nets[i + 1 :])


@pytest.mark.unit
def test_state_survives_a_save_and_load(tmp_path: Path) -> None:
    s = lab(tmp_path)
    s.pids = {"etcd": 12}
    save(s)
    assert load(s.dir) == s


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.mark.unit
def test_each_component_gets_the_identity_kubernetes_authorises(tmp_path: Path) -> None:
    s = lab(tmp_path)
    configs.write_pki(s)
    pki = s.dir / "pki"
    ca = cert(pki / "ca.crt")

    def subject(stem: str) -> tuple[str, list[str]]:
        c = cert(pki / f"{stem}.crt")
        c.verify_directly_issued_by(ca)
        cn = c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        return str(cn), [str(o.value) for o in c.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]

    assert subject("kubelet") == ("system:node:osfleet-node", ["system:nodes"])
    assert subject("admin") == ("osfleet-admin", ["system:masters"])
    assert subject("controller-manager") == ("system:kube-controller-manager", [])
    assert subject("kube-proxy") == ("system:kube-proxy", [])
    usage = cert(pki / "kubelet.crt").extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    api = cert(pki / "apiserver.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(i) for i in api.get_values_for_type(x509.IPAddress)} >= {"10.233.9.2", "10.233.9.129"}
    assert "kubernetes.default.svc.cluster.local" in api.get_values_for_type(x509.DNSName)
    assert (pki / "service-account.key").stat().st_mode & 0o777 == 0o600
    configs.write_kubeconfigs(s)
    kc = yaml.safe_load((s.dir / "admin.kubeconfig").read_text())
    assert kc["clusters"][0]["cluster"]["server"] == "https://10.233.9.2:6443"
    assert kc["users"][0]["user"]["client-key-data"]  # one self-contained file


@pytest.mark.unit
def test_the_components_are_configured_for_this_machine(tmp_path: Path) -> None:
    s = lab(tmp_path)
    kubelet = yaml.safe_load(configs.kubelet_config(s))
    assert kubelet["failCgroupV1"] is False and kubelet["cgroupDriver"] == "cgroupfs"  # cgroup v1, no systemd
    assert kubelet["cgroupRoot"] == "/osfleet-k8s"  # everything it makes under one cgroup folder
    assert kubelet["clusterDNS"] == ["10.233.9.2"] and kubelet["authorization"]["mode"] == "Webhook"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    proxy = yaml.safe_load(configs.kube_proxy_config(s))
    assert proxy["conntrack"]["maxPerCore"] == 0  # machine-wide nf_conntrack_max left alone
    assert proxy["nodePortAddresses"] == ["primary"]
    toml = tomllib.loads(configs.containerd_config(s, "localhost/pause:x"))
    assert toml["grpc"]["address"] == str(s.containerd_socket) and toml["root"].startswith(s.root)
    runtime = toml["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["netns_mounts_under_state_dir"] is True  # pods' namespaces under the lab's folder
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == str(Path(s.tools) / "runc")
    cni = json.loads(configs.cni_config(s))
    bridge = cni["plugins"][0]
    assert bridge["ipMasq"] is False and bridge["ipam"]["ranges"] == [[{"subnet": "10.233.9.64/26"}]]
    corefile = configs.corefile(s)
    assert "forward" not in corefile and "ready 10.233.9.2:8181" in corefile  # nothing outside the cluster resolves


@pytest.mark.unit
def test_simulated_nodes_are_tainted_loopback_nodes_labelled_for_kvm_only_when_asked() -> None:
    plain, kvm = configs.kwok_node("kwok-node-1", 1, False), configs.kwok_node("kwok-node-2", 300, True)
    assert plain["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"  # type: ignore[index]
    assert "osfleet.io/kvm" not in plain["metadata"]["labels"]  # type: ignore[index]
    assert kvm["metadata"]["labels"]["osfleet.io/kvm"] == "true"  # type: ignore[index]
    assert plain["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]  # type: ignore[index]
    for n in (plain, kvm):
        (addr,) = n["status"]["addresses"]  # type: ignore[index]
        assert ipaddress.ip_address(addr["address"]).is_loopback


@pytest.mark.system
def test_down_with_nothing_up_removes_nothing(tmp_path: Path) -> None:
    from osfleet.lab.kube.cluster import _namespaces
    from osfleet.lab.kube.state import NETNS

    if NETNS in _namespaces():  # down() also removes a lab's namespace by name: it would take a real lab down
        pytest.skip(f"a k8s lab is up on this machine (namespace {NETNS}): 'osfleet lab k8s down' first")
    said: list[str] = []
    root = tmp_path / "k8s-lab"
    removed = down(root, said.append, libvirt_uri="test:///default")
    assert removed["namespaces"] == removed["folders"] == removed["processes"] == 0
    assert leftovers(root) == {"processes": 0, "namespaces": 0, "links": 0, "mounts": 0, "cgroups": 0, "files": 0}


THIS_BIN = str(Path(os.path.realpath(sys.executable)).parent)  # this interpreter stands for a lab binary


@pytest.mark.system
def test_a_lab_runs_while_one_of_its_own_processes_does(tmp_path: Path) -> None:
    state = lab(tmp_path)
    state.tools = THIS_BIN
    state.pids = {"etcd": os.getpid()}
    assert running(state)
    state.tools = "/nonexistent/bin"  # the pid was reused by a process that is not the lab's
    assert not running(state)
    state.pids = {"etcd": 0, "kube-apiserver": _dead_pid()}
    assert not running(state)


@pytest.mark.system
def test_up_refuses_a_running_lab_and_clears_a_dead_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from osfleet.errors import ConfigError
    from osfleet.lab.kube.cluster import _namespaces
    from osfleet.lab.kube.state import NETNS

    if NETNS in _namespaces():  # clearing removes a lab's namespace by name: it would take a real lab down
        pytest.skip(f"a k8s lab is up on this machine (namespace {NETNS}): 'osfleet lab k8s down' first")
    monkeypatch.setenv("OSFLEET_LIBVIRT_URI", "test:///default")
    root, tools = tmp_path / "k8s-lab", tmp_path / "tools"
    tools.mkdir()
    live = KubeLabState(root=str(root), subnet="10.233.9.0/24", tools=THIS_BIN)
    live.pids = {"etcd": os.getpid()}
    root.mkdir()
    save(live)
    with pytest.raises(ConfigError, match="already up"):
        up(1, False, root, tools, lambda m: None)
    assert load(root) == live
    live.pids = {"etcd": _dead_pid()}
    save(live)
    said: list[str] = []
    with pytest.raises(ConfigError, match="no cluster binaries"):  # got past the dead lab, which is gone
        up(1, False, root, tools, said.append)
    assert any("clearing it" in m for m in said)
    assert load(root) is None


def _dead_pid() -> int:
    """A pid that ran and has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
