"""The opt-in replica network: off by default (no NIC in the domain XML), and when on, the host's bridge and
nftables table let a replica reach "the internet" (NAT) or only the named proxy, never another replica and
never the host's own services.

The isolation is checked for real without VMs: network namespaces stand for replicas (a veth pair whose host
end joins the bridge as an isolated port, as libvirt's ``<port isolated='yes'/>`` tap does) and for the
internet (a namespace behind the host with a web server on 198.51.100.1, a documentation address that exists
only inside this test). A web server on the host itself stands for the host agent. Needs root, ip and nft.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import ConfigError
from osfleet.replicas import network
from osfleet.replicas.network import AddressBook, NetworkPolicy
from osfleet.vm.domain_xml import DiskSpec, DomainSpec, NicSpec
from osfleet.vm.images import GoldenImage

pytestmark = pytest.mark.xdist_group(
    "replica-network"
)  # one xdist worker: its namespaces, addresses and ip_forward are the machine's

INTERNET = "198.51.100.1"
UPLINK_HOST = "198.51.100.2"
WEB_PORT = 8000


def _spec(nic: NicSpec | None = None) -> DomainSpec:
    return DomainSpec(
        name="osfleet-r-x-g0",
        kernel=Path("/k"),
        initrd=Path("/i"),
        cmdline="quiet",
        disks=(DiskSpec(Path("/d.qcow2")),),
        nic=nic,
    )


@pytest.mark.unit
def test_by_default_a_replica_has_no_network_device() -> None:
    dom = ET.fromstring(_spec().to_xml())
    assert dom.find("devices/interface") is None
    assert ReplicaShape().network_bridge is None and Settings().replica_network == "off"


@pytest.mark.unit
def test_with_the_network_on_the_nic_sits_on_an_isolated_bridge_port() -> None:
    iface = ET.fromstring(_spec(NicSpec("osfbr-1234abcd")).to_xml()).find("devices/interface")
    assert iface is not None and iface.get("type") == "bridge"
    assert iface.find("source").get("bridge") == "osfbr-1234abcd"  # type: ignore[union-attr]
    assert iface.find("port").get("isolated") == "yes"  # type: ignore[union-attr]
    assert iface.find("model").get("type") == "virtio"  # type: ignore[union-attr]


@pytest.mark.unit
def test_the_setting_is_parsed_with_one_line_errors() -> None:
    assert NetworkPolicy.parse(None).mode == "off" and not NetworkPolicy.parse("off").enabled
    assert NetworkPolicy.parse("nat").gateway == "172.30.0.1"
    p = NetworkPolicy.parse("proxy=http://192.0.2.10:3128")
    assert p.mode == "proxy" and p.proxy == ("192.0.2.10", 3128)
    for bad, why in (
        ("open", "must be off, nat or proxy"),
        ("proxy=ftp://192.0.2.10:21", "http://HOST:PORT"),
        ("proxy=http://192.0.2.10", "http://HOST:PORT"),
        ("proxy=http://proxy.example:3128", "IPv4 address"),
        ("proxy=http://127.0.0.1:3128", "loopback"),
    ):
        with pytest.raises(ConfigError, match=why):
            NetworkPolicy.parse(bad)
    with pytest.raises(ConfigError, match="between /16 and /28"):
        NetworkPolicy.parse("nat", "10.0.0.0/8")
    with pytest.raises(ConfigError, match="OSFLEET|must be off"):
        Settings(replica_network="everything")


@pytest.mark.unit
def test_the_rules_leave_no_path_to_the_host_or_other_replicas() -> None:
    nat = network.ruleset(NetworkPolicy.parse("nat"), "osfbr-t", "osfleet_t")
    assert 'iifname "osfbr-t" drop' in nat  # input: nothing reaches the host
    assert 'iifname "osfbr-t" oifname "osfbr-t" drop' in nat
    assert "169.254.0.0/16" in nat and "10.0.0.0/8" in nat and "masquerade" in nat
    proxy = network.ruleset(NetworkPolicy.parse("proxy=http://192.0.2.10:3128"), "osfbr-t", "osfleet_t")
    assert 'iifname "osfbr-t" ip daddr 192.0.2.10 tcp dport 3128 accept' in proxy
    assert "@not_internet" not in proxy.split("chain forward")[1]


@pytest.mark.unit
def test_addresses_are_unique_stable_and_released(tmp_path: Path) -> None:
    book = AddressBook(tmp_path, NetworkPolicy.parse("nat", "10.9.0.0/28"))
    a, b = book.assign("r1"), book.assign("r2")
    assert a.ip != b.ip and a.gateway == "10.9.0.1" and a.ip != a.gateway
    assert book.assign("r1") == a and a.mac.startswith("52:54:00:") and a.mac != b.mac
    book.release("r1")
    assert book.assign("r3").ip == a.ip
    cmd = network.guest_config_command(a, NetworkPolicy.parse("proxy=http://192.0.2.10:3128"), ["192.0.2.53"])
    assert f"ip addr add {a.ip}/28 dev eth0" in cmd and "https_proxy=http://192.0.2.10:3128" in cmd


# --- the real thing: namespaces, a bridge and nftables ------------------------------------------------------


def _root_with_tools() -> bool:
    return shutil.which("nft") is not None and shutil.which("ip") is not None and Path("/proc/self").exists()


needs_net_admin = pytest.mark.skipif(not _root_with_tools(), reason="needs root with ip and nft (scripts/setup)")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def fetch(ns: str, url: str) -> str:
    """GET ``url`` from inside namespace ``ns``: the body, or 'unreachable'."""
    code = (
        "import sys, urllib.request\n"
        "try:\n print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())\n"
        "except Exception as e:\n print('unreachable', type(e).__name__, e)\n"
    )
    return sh("ip", "netns", "exec", ns, sys.executable, "-c", code, url).stdout.strip()


def until_up(ns: str, url: str) -> str:
    """``fetch`` until the server answers, at most 10 s: a web server just started, or a replica's first
    connection on a busy CI machine (what must be reachable is retried; what must not be is fetched once)."""
    for _ in range(20):
        page = fetch(ns, url)
        if not page.startswith("unreachable"):
            return page
        time.sleep(0.5)
    return page


def why_unreachable(ns: str) -> str:
    """What a failed positive fetch needs to be told apart: forwarding, routes, neighbours and the tables."""
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    parts = [f"ip_forward={forward}"]
    for argv in (("ip", "-n", ns, "route"), ("ip", "-n", ns, "neigh"), ("ip", "route", "get", INTERNET),
                 ("ip", "neigh"), ("nft", "list", "tables")):  # fmt: skip
        p = sh(*argv, check=False)
        parts.append(f"$ {' '.join(argv)}\n{(p.stdout + p.stderr).strip()}")
    return "\n".join(parts)


@dataclass
class Lab:
    prefix: str
    policy: NetworkPolicy
    replicas: dict[str, str]  # namespace -> address
    internet: str
    agent_port: int


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """Two replica namespaces on the bridge, an internet namespace with a web server, a host web server."""
    tag = uuid.uuid4().hex[:6]
    prefix = f"osfleet-nt{tag}-"
    policy = NetworkPolicy.parse(request.param, "172.31.77.0/24")
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    namespaces, links, servers = [], [], []
    try:
        bridge = network.setup(policy, prefix)
        internet = f"osfnt{tag}-net"
        sh("ip", "netns", "add", internet)
        namespaces.append(internet)
        sh("ip", "link", "add", f"osfnt{tag}u", "type", "veth", "peer", "name", "uplink", "netns", internet)
        links.append(f"osfnt{tag}u")
        sh("ip", "addr", "add", f"{UPLINK_HOST}/24", "dev", f"osfnt{tag}u")
        sh("ip", "link", "set", f"osfnt{tag}u", "up")
        for args in (("addr", "add", f"{INTERNET}/24", "dev", "uplink"), ("link", "set", "uplink", "up")):
            sh("ip", "-n", internet, *args)
        sh("ip", "-n", internet, "link", "set", "lo", "up")
        web = ["ip", "netns", "exec", internet, sys.executable, "-m", "http.server", str(WEB_PORT), "-b", INTERNET]
        servers.append(subprocess.Popen(web, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # The host agent stands in as a web server on every host address (the gateway included).
        agent_port = 18000 + int(tag[:3], 16) % 1000
        agent = [sys.executable, "-m", "http.server", str(agent_port), "-b", "0.0.0.0"]
        servers.append(subprocess.Popen(agent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        replicas = {}
        book = AddressBook(Path(f"/tmp/{prefix}book"), policy)
        for i in (1, 2):
            ns = f"osfnt{tag}-r{i}"
            host_end = network.port_name(bridge, ns)  # named as libvirt names a replica's tap (<target dev>)
            sh("ip", "netns", "add", ns)
            namespaces.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            links.append(host_end)
            sh("ip", "link", "set", host_end, "master", bridge, "up")
            sh("bridge", "link", "set", "dev", host_end, "isolated", "on")
            address = book.assign(ns)
            network.apply_bindings(prefix, book.bind(ns, host_end))
            sh("ip", "netns", "exec", ns, "sh", "-c", network.guest_config_command(address, policy, []))
            replicas[ns] = address.ip
        until_up(internet, f"http://{INTERNET}:{WEB_PORT}/")
        yield Lab(prefix, policy, replicas, internet, agent_port)
    finally:
        for p in servers:
            p.terminate()
            p.wait(timeout=10)
        for link in links:
            sh("ip", "link", "del", link, check=False)
        for ns in namespaces:
            sh("ip", "netns", "del", ns, check=False)
        network.teardown(prefix)
        shutil.rmtree(f"/tmp/{prefix}book", ignore_errors=True)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forward_before)


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.machine_lab  # ip_forward, bridges and nftables are the machine's: CI runs it alone
@needs_net_admin
@pytest.mark.parametrize("lab", ["nat"], indirect=True)
def test_nat_reaches_the_internet_but_not_the_host_or_another_replica(lab: Lab) -> None:
    (r1, ip1), (r2, ip2) = lab.replicas.items()
    page = until_up(r1, f"http://{INTERNET}:{WEB_PORT}/")
    assert "Directory listing" in page, f"{page}\n{why_unreachable(r1)}"
    gateway = lab.policy.gateway
    assert fetch(r1, f"http://{gateway}:{lab.agent_port}/").startswith("unreachable")  # the host's services
    assert fetch(r1, f"http://{UPLINK_HOST}:{lab.agent_port}/").startswith("unreachable")  # by any host address
    web_r2 = subprocess.Popen(
        ["ip", "netns", "exec", r2, sys.executable, "-m", "http.server", "8100", "-b", ip2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert "Directory listing" in until_up(r2, f"http://{ip2}:8100/")  # the server is up...
        assert fetch(r1, f"http://{ip2}:8100/").startswith("unreachable")  # ...but not for the other replica
    finally:
        web_r2.terminate()
        web_r2.wait(timeout=10)
    # The host still reaches the internet side itself: only replicas' traffic is filtered.
    assert "Directory listing" in fetch(lab.internet, f"http://{INTERNET}:{WEB_PORT}/")


def claim(ns: str, ip: str, mac: str | None = None) -> None:
    """What a hostile guest does as root: take another address (and MAC) on its NIC."""
    steps = ["ip link set eth0 down"] + ([f"ip link set eth0 address {mac}"] if mac else [])
    steps += ["ip addr flush dev eth0", f"ip addr add {ip}/24 dev eth0", "ip link set eth0 up",
              "ip route replace default via 172.31.77.1 dev eth0"]  # fmt: skip
    sh("ip", "netns", "exec", ns, "sh", "-c", " && ".join(steps))


def mac_of(ns: str) -> str:
    return sh("ip", "-n", ns, "-br", "link", "show", "eth0").stdout.split()[2]


@pytest.mark.system
@pytest.mark.machine_lab  # ip_forward, bridges and nftables are the machine's: CI runs it alone
@needs_net_admin
@pytest.mark.parametrize("lab", ["nat"], indirect=True)
def test_a_replica_that_takes_another_ones_address_or_mac_sends_nothing(lab: Lab) -> None:
    (r1, ip1), (r2, ip2) = lab.replicas.items()
    site = f"http://{INTERNET}:{WEB_PORT}/"
    assert "Directory listing" in until_up(r1, site) and "Directory listing" in until_up(r2, site)
    claim(r1, ip2)  # r2's address on r1's own MAC
    assert fetch(r1, site).startswith("unreachable")
    claim(r1, ip2, mac_of(r2))  # r2's address and MAC: still r1's port
    assert fetch(r1, site).startswith("unreachable")
    claim(r1, "172.31.77.200")  # an address nobody has
    assert fetch(r1, site).startswith("unreachable")
    assert "Directory listing" in fetch(r2, site)  # r2 is untouched
    neighbours = sh("ip", "neigh", "show", ip2).stdout
    assert mac_of(r2) in neighbours or not neighbours.strip(), neighbours  # the host never learnt r1's claim
    claim(r1, ip1, network.Address(ip1, 24, lab.policy.gateway).mac)  # back to its own: it works again
    assert "Directory listing" in until_up(r1, site)


@pytest.mark.system
@pytest.mark.machine_lab  # ip_forward, bridges and nftables are the machine's: CI runs it alone
@needs_net_admin
@pytest.mark.parametrize("lab", [f"proxy=http://{INTERNET}:{WEB_PORT}"], indirect=True)
def test_proxy_mode_reaches_only_the_proxy(lab: Lab) -> None:
    (r1, _), _ = lab.replicas.items()
    page = until_up(r1, f"http://{INTERNET}:{WEB_PORT}/")  # the proxy's address and port
    assert "Directory listing" in page, f"{page}\n{why_unreachable(r1)}"
    other = subprocess.Popen(
        ["ip", "netns", "exec", lab.internet, sys.executable, "-m", "http.server", "8200", "-b", INTERNET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert "Directory listing" in until_up(lab.internet, f"http://{INTERNET}:8200/")
        assert fetch(r1, f"http://{INTERNET}:8200/").startswith("unreachable")  # any other port: no
    finally:
        other.terminate()
        other.wait(timeout=10)
    assert fetch(r1, f"http://{lab.policy.gateway}:{lab.agent_port}/").startswith("unreachable")


@pytest.fixture
def internet() -> Iterator[str]:
    """A namespace behind the host with a web server on INTERNET (stands for the internet)."""
    tag = uuid.uuid4().hex[:6]
    ns, link = f"osfnt{tag}-net", f"osfnt{tag}u"
    server = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "uplink", "netns", ns)
        sh("ip", "addr", "add", f"{UPLINK_HOST}/24", "dev", link)
        sh("ip", "link", "set", link, "up")
        for args in (("addr", "add", f"{INTERNET}/24", "dev", "uplink"), ("link", "set", "uplink", "up")):
            sh("ip", "-n", ns, *args)
        web = ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(WEB_PORT), "-b", INTERNET]
        server = subprocess.Popen(web, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        until_up(ns, f"http://{INTERNET}:{WEB_PORT}/")
        yield ns
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        sh("ip", "link", "del", link, check=False)
        sh("ip", "netns", "del", ns, check=False)


@pytest.mark.vm
@pytest.mark.slow
@pytest.mark.machine_lab  # ip_forward, bridges and nftables are the machine's: CI runs it alone
@needs_net_admin
def test_a_replica_on_the_office_image_reaches_the_internet_and_not_the_host(
    internet: str, office_image: GoldenImage
) -> None:
    """A real replica with the network on: its guest fetches from "the internet", not from the host."""
    from osfleet.replicas.manager import ReplicaHost

    base = Settings.from_env()
    settings = dataclasses.replace(base, replica_network="nat", replica_subnet="172.31.78.0/24")
    image = office_image
    agent = subprocess.Popen(
        [sys.executable, "-m", "http.server", "18999", "-b", "0.0.0.0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    try:
        with ReplicaHost(image, settings, mode="snapshot", auto_recover=False, spares=False) as h:
            rid = h.create().replica
            try:
                h.lease("test")  # gives the guest its address
                get = "curl -s -m 5 -o /dev/null -w %{http_code} "
                out = h.shell(rid, get + f"http://{INTERNET}:{WEB_PORT}/", 30)
                assert out["stdout"].strip() == "200", out
                gateway = NetworkPolicy.parse("nat", "172.31.78.0/24").gateway
                out = h.shell(rid, get + f"http://{gateway}:18999/", 30)
                assert out["stdout"].strip() == "000", out  # no answer: the host's services stay out of reach
            finally:
                h.down([rid])
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        network.teardown(settings.name_prefix)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forward_before)
