"""Network namespaces and veth links of the lab, on a private /24 that collides with nothing here.

Each host gets a /30 of the lab's /24: this machine's end of the link is .1, the namespace's end .2, so
the lab holds up to 63 hosts and its traffic stays between the namespaces and this machine (no
forwarding, no NAT).
"""

from __future__ import annotations

import ipaddress
import json

from osfleet.errors import ConfigError
from osfleet.lab.proc import run
from osfleet.lab.state import NETNS_PREFIX

# 10.233.0.0/16 is rarely used by anything (Docker, libvirt, Kubernetes and VPN defaults avoid it).
LAB_SUPERNET = ipaddress.IPv4Network("10.233.0.0/16")
MAX_HOSTS = 63


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address or a route in."""
    nets: list[ipaddress.IPv4Network] = []
    for entry in json.loads(run(["ip", "-j", "-4", "addr", "show"], "listing addresses") or "[]"):
        for a in entry.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for r in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"], "listing routes") or "[]"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                continue
    return nets


def pick_subnet() -> ipaddress.IPv4Network:
    """The first /24 of the lab range that overlaps no address or route of this machine."""
    used = used_networks()
    for net in LAB_SUPERNET.subnets(new_prefix=24):
        if not any(net.overlaps(u) for u in used):
            return net
    raise ConfigError(f"no free /24 left in {LAB_SUPERNET} for the lab")


def link_addresses(subnet: ipaddress.IPv4Network, index: int) -> tuple[str, str, int]:
    """(this machine's address, the host's address, prefix length) of lab host ``index`` (1-based)."""
    if not 1 <= index <= MAX_HOSTS:
        raise ConfigError(f"--hosts must be between 1 and {MAX_HOSTS}")
    block = subnet.network_address + 4 * (index - 1)
    return str(block + 1), str(block + 2), 30


def create_host_link(netns: str, veth_host: str, veth_ns: str, host_addr: str, addr: str, plen: int) -> None:
    """Make the namespace and its veth pair, address both ends and bring them (and its loopback) up."""
    run(["ip", "netns", "add", netns], f"creating network namespace {netns}")
    run(["ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_ns], f"creating link {veth_host}")
    run(["ip", "link", "set", veth_ns, "netns", netns], f"moving {veth_ns} into {netns}")
    run(["ip", "addr", "add", f"{host_addr}/{plen}", "dev", veth_host], f"addressing {veth_host}")
    run(["ip", "link", "set", veth_host, "up"], f"bringing up {veth_host}")
    ns = ["ip", "netns", "exec", netns]
    run([*ns, "ip", "addr", "add", f"{addr}/{plen}", "dev", veth_ns], f"addressing {veth_ns}")
    run([*ns, "ip", "link", "set", veth_ns, "up"], f"bringing up {veth_ns}")
    run([*ns, "ip", "link", "set", "lo", "up"], f"bringing up loopback in {netns}")


def lab_namespaces() -> list[str]:
    """Network namespaces the lab made (by name prefix)."""
    out = run(["ip", "-j", "netns", "list"], "listing network namespaces").strip()
    return sorted(n["name"] for n in json.loads(out or "[]") if n["name"].startswith(NETNS_PREFIX))


def lab_links() -> list[str]:
    """Links of this machine the lab made (by name prefix)."""
    out = run(["ip", "-j", "link", "show"], "listing links").strip()
    return sorted(li["ifname"] for li in json.loads(out or "[]") if li["ifname"].startswith(NETNS_PREFIX))


def namespace_pids(netns: str) -> list[int]:
    """Processes running inside ``netns`` (its sshd, sessions, host agents)."""
    return [int(p) for p in run(["ip", "netns", "pids", netns], f"listing processes of {netns}").split()]


def delete_namespace(netns: str) -> None:
    run(["ip", "netns", "delete", netns], f"deleting network namespace {netns}")


def delete_link(name: str) -> None:
    run(["ip", "link", "delete", name], f"deleting link {name}")
