"""What replicas may reach, as the settings name it (``OSFLEET_REPLICA_NETWORK``, ``OSFLEET_REPLICA_SUBNET``):
parsed and checked here, without touching the host.

The policy is a value of the settings (``osfleet.config`` checks it when ``Settings`` is made) and the input of
the replica network (``osfleet.replicas.network``, which sets up the bridge and the firewall it describes); it
lives below both so that the settings need not import the code that runs nftables.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from osfleet.errors import ConfigError

Mode = Literal["off", "nat", "proxy"]
DEFAULT_SUBNET = "172.30.0.0/16"


@dataclass(frozen=True)
class NetworkPolicy:
    """What replicas may reach: nothing (``off``), the internet through NAT, or only ``proxy_url``."""

    mode: Mode = "off"
    proxy_url: str | None = None
    subnet: str = DEFAULT_SUBNET

    @classmethod
    def parse(cls, text: str | None, subnet: str | None = None) -> NetworkPolicy:
        """``off`` (or empty), ``nat`` or ``proxy=http://host:port``; a bad value is a ``ConfigError``."""
        value = (text or "off").strip()
        net = _subnet(subnet or DEFAULT_SUBNET)
        if value in ("off", "nat"):
            return cls(mode=value, subnet=net)  # type: ignore[arg-type]  # one of the two, checked above
        if value.startswith("proxy="):
            url = value.removeprefix("proxy=")
            _proxy_address(url)
            return cls(mode="proxy", proxy_url=url, subnet=net)
        raise ConfigError(f"replica network {value!r} must be off, nat or proxy=http://HOST:PORT")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def proxy(self) -> tuple[str, int] | None:
        return _proxy_address(self.proxy_url) if self.proxy_url else None

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))


def _subnet(text: str) -> str:
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ConfigError(f"replica subnet {text!r} is not an IPv4 network like {DEFAULT_SUBNET}: {exc}") from None
    if net.version != 4 or not 16 <= net.prefixlen <= 28:
        raise ConfigError(f"replica subnet {text!r} must be IPv4 with a prefix between /16 and /28")
    return str(net)


def _proxy_address(url: str | None) -> tuple[str, int]:
    parts = urlsplit(url or "")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"proxy {url!r} must look like http://HOST:PORT (an address and a port)")
    try:
        ip = ipaddress.ip_address(parts.hostname)
    except ValueError:
        raise ConfigError(f"proxy {url!r}: give the proxy's IPv4 address (the firewall allows only it)") from None
    if ip.version != 4 or ip.is_loopback:
        raise ConfigError(f"proxy {url!r}: a replica cannot reach a loopback or IPv6 proxy address")
    return str(ip), port
