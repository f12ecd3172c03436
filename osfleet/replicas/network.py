"""Opt-in outbound network for replicas: NAT, or only an HTTP(S) proxy the operator names; never each other,
never the host.

By default a replica has no network device at all (``ReplicaShape.network`` off: the domain XML has no
``<interface>``). ``host serve --replica-network nat|proxy=URL`` (``OSFLEET_REPLICA_NETWORK``) turns it on:

- **One bridge per host prefix** (``osfbr-<tag>``, no other ports), its address the replicas' gateway. Each
  replica's tap joins it with libvirt's ``<port isolated='yes'/>``: the bridge forwards no frame between two
  isolated ports, so replicas cannot reach each other at layer 2 (and the forward chain below drops anything
  routed from the bridge back into it).
- **One nftables table per bridge** (``inet osfleet_<tag>``), written whole and replaced atomically by
  ``nft -f``:
  - *input*: nothing from the bridge reaches the host itself (the host agent's port, libvirtd, sshd, the
    gateway address, any local service), except answers to connections the host opened;
  - *forward*: replica to replica dropped; IPv6 dropped; in ``nat`` mode everything else leaves except
    addresses that are not the internet: loopback, link-local (cloud metadata at 169.254.169.254), private
    and shared ranges (the operator's own network, other hosts' agents), multicast; in ``proxy`` mode only TCP to
    the proxy's address and port leaves;
  - *postrouting*: the replicas' subnet is masqueraded behind the host's address.
- **Anti-spoofing**, one ``bridge`` family table per bridge (same name): every frame a replica's port sends must
  carry that replica's own MAC and IPv4 source (ARP: sender MAC and address too), else it is dropped before the
  bridge sees it; anything but IPv4 and ARP is dropped. Ports are named by osfleet (``port_name``: libvirt's
  ``<target dev>``), so the rules cover every port of the bridge by its name pattern, bound or not: a port whose
  replica has no address yet sends nothing. The set of (port, MAC, address) is rewritten whole whenever a replica
  gets its address (``AddressBook.bind`` then ``apply_bindings``), so a guest that changes its IP or MAC can
  neither send as another replica nor take its answers (the host's neighbour table learns only true pairs).
- **Addresses**: each replica gets one address in the subnet (allocated under a lock in
  ``$OSFLEET_HOME/network/addresses.json``) and a MAC derived from it; the guest is told both (and the proxy,
  in ``proxy`` mode) by ``guest_config_command``, run as root through the guest agent. Replicas restored
  from one saved state share the guest's view of its NIC, so the address is set per replica after restore.

Everything here needs root (bridges, nftables, forwarding); the table and bridge are removed by
``teardown``. Forwarding (``net.ipv4.ip_forward``) is a host-wide switch: turning the network on sets it.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from osfleet.errors import OsfleetError

# The policy's parsing sits below the settings (osfleet.network_policy); re-exported where it always was.
from osfleet.network_policy import DEFAULT_SUBNET as DEFAULT_SUBNET
from osfleet.network_policy import Mode as Mode
from osfleet.network_policy import NetworkPolicy as NetworkPolicy

# Destinations a replica never reaches through NAT: not the internet (RFC 6890 special-purpose ranges).
BLOCKED_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
)
GUEST_NIC = "eth0"
COMMAND_TIMEOUT_SECONDS = 20.0


class NetworkError(OsfleetError):
    """The replica network could not be set up (no nft, no root, a bad setting)."""


def bridge_name(name_prefix: str) -> str:
    """The bridge of this host prefix (interface names have at most 15 characters)."""
    return f"osfbr-{_tag(name_prefix)}"


def table_name(name_prefix: str) -> str:
    return f"osfleet_{_tag(name_prefix)}"


def _tag(name_prefix: str) -> str:
    return hashlib.sha256(name_prefix.encode()).hexdigest()[:8]


def port_name(bridge: str, domain: str) -> str:
    """The name of ``domain``'s port (tap) on ``bridge``: ``port_pattern(bridge)`` and a hash of the domain's name
    (15 characters, an interface name's limit)."""
    return port_pattern(bridge).rstrip("*") + hashlib.sha256(domain.encode()).hexdigest()[:6]


def port_pattern(bridge: str) -> str:
    """The name pattern of every port osfleet puts on ``bridge`` (nft's wildcard)."""
    return f"osfp{bridge[-5:]}*"


def port_ruleset(bridge: str, table: str) -> str:
    """The ``bridge`` family table: frames from the bridge's ports must carry their replica's MAC and address."""
    q = json.dumps
    lines = [
        f"table bridge {table} {{",
        "  set bound {",
        "    type ifname . ether_addr . ipv4_addr;",
        "  }",
        "  chain prerouting {",
        "    type filter hook prerouting priority filter; policy accept;",
        f"    iifname != {q(port_pattern(bridge))} accept",
        "    ether type arp iifname . ether saddr . arp saddr ip != @bound drop",
        "    ether type arp iifname . arp saddr ether . arp saddr ip @bound accept",
        "    ether type ip iifname . ether saddr . ip saddr @bound accept",
        "    drop",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def apply_bindings(name_prefix: str, bindings: list[tuple[str, str, str]]) -> None:
    """Replace the set of (port, MAC, address) the bridge lets send, in one transaction."""
    table = table_name(name_prefix)
    script = f"flush set bridge {table} bound\n"
    if bindings:
        elements = ", ".join(f"{json.dumps(port)} . {mac} . {ip}" for port, mac, ip in bindings)
        script += f"add element bridge {table} bound {{ {elements} }}\n"
    _run(["nft", "-f", "-"], stdin=script)


def ruleset(policy: NetworkPolicy, bridge: str, table: str) -> str:
    """The nftables table for ``policy`` (a whole table: ``nft -f`` replaces it atomically)."""
    blocked = ", ".join(BLOCKED_V4)
    q = json.dumps  # nft string literals are double-quoted like JSON strings of plain names
    if policy.mode == "nat":
        leave = [f"iifname {q(bridge)} ip daddr @not_internet drop", f"iifname {q(bridge)} accept"]
    else:
        assert policy.proxy is not None
        host, port = policy.proxy
        leave = [f"iifname {q(bridge)} ip daddr {host} tcp dport {port} accept", f"iifname {q(bridge)} drop"]
    proxy_in = []
    if policy.mode == "proxy" and policy.proxy is not None:  # a proxy on one of the host's own addresses
        host, port = policy.proxy
        proxy_in = [f"iifname {q(bridge)} ip daddr {host} tcp dport {port} fib daddr type local accept"]
    lines = [
        f"table inet {table} {{",
        "  set not_internet {",
        "    type ipv4_addr; flags interval;",
        f"    elements = {{ {blocked} }}",
        "  }",
        "  chain input {",
        "    type filter hook input priority filter - 10; policy accept;",
        f"    iifname {q(bridge)} ct state established,related accept",
        *[f"    {r}" for r in proxy_in],
        f"    iifname {q(bridge)} drop",
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter - 10; policy accept;",
        f"    iifname {q(bridge)} oifname {q(bridge)} drop",
        f"    oifname {q(bridge)} ct state established,related accept",
        f"    oifname {q(bridge)} drop",
        f"    iifname {q(bridge)} meta nfproto ipv6 drop",
        *[f"    {r}" for r in leave],
        "  }",
        "  chain postrouting {",
        "    type nat hook postrouting priority srcnat; policy accept;",
        f"    ip saddr {policy.subnet} oifname != {q(bridge)} masquerade",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _run(argv: list[str], stdin: str | None = None) -> str:
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    except FileNotFoundError:
        raise NetworkError(f"{argv[0]} is not installed (apt-get install nftables iproute2)") from None
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(argv)} did not finish within {COMMAND_TIMEOUT_SECONDS:.0f} s") from None
    if p.returncode != 0:
        detail = (p.stderr or p.stdout).strip().splitlines()
        raise NetworkError(f"{' '.join(argv[:3])} failed: {detail[-1] if detail else 'exit ' + str(p.returncode)}")
    return p.stdout


def setup(policy: NetworkPolicy, name_prefix: str) -> str:
    """Make (or update) the bridge and its table for ``policy``; returns the bridge's name. Idempotent."""
    if not policy.enabled:
        raise NetworkError("the replica network is off: nothing to set up")
    bridge, table = bridge_name(name_prefix), table_name(name_prefix)
    prefix_len = ipaddress.ip_network(policy.subnet).prefixlen
    if not Path(f"/sys/class/net/{bridge}").exists():
        _run(["ip", "link", "add", bridge, "type", "bridge"])
    _run(["ip", "addr", "replace", f"{policy.gateway}/{prefix_len}", "dev", bridge])
    _run(["ip", "link", "set", bridge, "up"])
    # Apply the whole table in one transaction: delete the old one (if any) and add the new.
    script = ""
    for family, rules in (("inet", ruleset(policy, bridge, table)), ("bridge", port_ruleset(bridge, table))):
        if subprocess.run(["nft", "list", "table", family, table], capture_output=True).returncode == 0:
            script += f"delete table {family} {table}\n"
        script += rules
    _run(["nft", "-f", "-"], stdin=script)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    return bridge


def teardown(name_prefix: str) -> None:
    """Remove this prefix's table and bridge (what ``setup`` made; nothing else)."""
    table, bridge = table_name(name_prefix), bridge_name(name_prefix)
    for family in ("inet", "bridge"):
        if subprocess.run(["nft", "list", "table", family, table], capture_output=True).returncode == 0:
            _run(["nft", "delete", "table", family, table])
    if Path(f"/sys/class/net/{bridge}").exists():
        _run(["ip", "link", "del", bridge])


@dataclass(frozen=True)
class Address:
    ip: str
    prefix_len: int
    gateway: str

    @property
    def mac(self) -> str:
        """A locally administered MAC made from the address (unique on the bridge as the address is)."""
        b = ipaddress.ip_address(self.ip).packed
        return "52:54:00:" + ":".join(f"{x:02x}" for x in b[1:4])


class AddressBook:
    """Replica -> address, kept in one JSON file under an exclusive lock (processes of one host share it)."""

    def __init__(self, directory: Path, policy: NetworkPolicy) -> None:
        self.path = directory / "addresses.json"
        self.ports_path = directory / "ports.json"  # replica -> the port (tap) its current domain sends from
        self.policy = policy

    def _locked(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _read(self, path: Path | None = None) -> dict[str, str]:
        try:
            data = json.loads((path or self.path).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _write(self, data: dict[str, str], path: Path | None = None) -> None:
        path = path or self.path
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def assign(self, replica: str) -> Address:
        """The replica's address (the same one on every call until ``release``)."""
        net = ipaddress.ip_network(self.policy.subnet)
        fd = self._locked()
        try:
            data = self._read()
            if replica not in data:
                used = set(data.values()) | {self.policy.gateway}
                free = next((str(h) for h in net.hosts() if str(h) not in used), None)
                if free is None:
                    raise NetworkError(f"no free address left in {net} for replica {replica}")
                data[replica] = free
                self._write(data)
            return Address(data[replica], net.prefixlen, self.policy.gateway)
        finally:
            os.close(fd)

    def release(self, replica: str) -> list[tuple[str, str, str]]:
        """Forget the replica's address and port; returns the bindings left (for ``apply_bindings``)."""
        fd = self._locked()
        try:
            data, ports = self._read(), self._read(self.ports_path)
            if data.pop(replica, None) is not None:
                self._write(data)
            if ports.pop(replica, None) is not None:
                self._write(ports, self.ports_path)
            return self._bindings(data, ports)
        finally:
            os.close(fd)

    def bind(self, replica: str, port: str) -> list[tuple[str, str, str]]:
        """Record the port the replica sends from now (its domain's); returns every (port, MAC, address) binding
        of the bridge, for ``apply_bindings``. A port another replica held before is taken from it."""
        fd = self._locked()
        try:
            data, ports = self._read(), self._read(self.ports_path)
            if replica not in data:
                raise NetworkError(f"replica {replica} has no address to bind to port {port}")
            ports = {r: p for r, p in ports.items() if p != port and r in data}
            ports[replica] = port
            self._write(ports, self.ports_path)
            return self._bindings(data, ports)
        finally:
            os.close(fd)

    def bindings(self) -> list[tuple[str, str, str]]:
        """Every (port, MAC, address) recorded: what a restarted host agent puts back for the replicas it adopts."""
        fd = self._locked()
        try:
            return self._bindings(self._read(), self._read(self.ports_path))
        finally:
            os.close(fd)

    def _bindings(self, data: dict[str, str], ports: dict[str, str]) -> list[tuple[str, str, str]]:
        prefix_len = ipaddress.ip_network(self.policy.subnet).prefixlen
        out = []
        for replica, port in sorted(ports.items()):
            if replica in data:
                address = Address(data[replica], prefix_len, self.policy.gateway)
                out.append((port, address.mac, address.ip))
        return out


def guest_config_command(address: Address, policy: NetworkPolicy, nameservers: list[str]) -> str:
    """Shell (as root in the guest) that gives its NIC this replica's MAC and address, the default route, DNS,
    and, in proxy mode, the proxy for programs started afterwards (``/etc/osfleet/proxy.env``)."""
    nic = GUEST_NIC
    lines = [
        f"ip link set {nic} down",
        f"ip link set {nic} address {address.mac}",
        f"ip addr flush dev {nic}",
        f"ip addr add {address.ip}/{address.prefix_len} dev {nic}",
        f"ip link set {nic} up",
        f"ip route replace default via {address.gateway} dev {nic}",
    ]
    if nameservers:
        lines.append(
            "printf %s " + shlex.quote("".join(f"nameserver {n}\n" for n in nameservers)) + " > /etc/resolv.conf"
        )
    if policy.mode == "proxy" and policy.proxy_url:
        url = policy.proxy_url
        env = "".join(f"{k}={url}\n" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"))
        lines.append("mkdir -p /etc/osfleet && printf %s " + shlex.quote(env) + " > /etc/osfleet/proxy.env")
    return " && ".join(lines)


def host_nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's resolvers a replica can use (not loopback ones, which a replica cannot reach)."""
    found = []
    try:
        text = resolv_conf.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                ip = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if ip.version == 4 and not ip.is_loopback:
                found.append(str(ip))
    return found
