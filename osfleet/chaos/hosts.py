"""The hosts faults are injected into: this machine's osfleet, or a lab host (its namespace, link and home)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from osfleet.config import DEFAULT_LIBVIRT_URI, Settings
from osfleet.errors import ConfigError

LOCAL = "local"


@dataclass(frozen=True)
class ChaosHost:
    """Where a host keeps its replicas' records and images, and (for a lab host) its network namespace."""

    name: str  # "lab1", or "local" for this machine's own OSFLEET_HOME
    home: Path  # the host's OSFLEET_HOME
    libvirt_uri: str = DEFAULT_LIBVIRT_URI
    netns: str | None = None  # a lab host's network namespace, "osfl-lab1"
    link: str | None = None  # the namespace's end of the host's veth link, "osfl-lab1-n"

    @property
    def replicas_dir(self) -> Path:
        return Settings(home=self.home).replicas_dir

    @property
    def image_store(self) -> Path:
        return Settings(home=self.home).image_store


def local_host(settings: Settings | None = None, name: str = LOCAL) -> ChaosHost:
    """This machine's osfleet (``$OSFLEET_HOME``), or another home given by ``settings``; it has no link."""
    s = settings or Settings.from_env()
    return ChaosHost(name=name, home=s.home, libvirt_uri=s.libvirt_uri)


def lab_hosts(settings: Settings | None = None) -> list[ChaosHost]:
    """The hosts of the lab that is up (``osfleet lab up``), from its state file; empty when none is."""
    from osfleet.lab.lab import lab_root
    from osfleet.lab.state import load

    s = settings or Settings.from_env()
    state = load(lab_root(s))
    if state is None:
        return []
    return [
        ChaosHost(name=h.name, home=Path(h.home), libvirt_uri=s.libvirt_uri, netns=h.netns, link=h.veth_ns)
        for h in state.hosts
    ]


def resolve(name: str | None, settings: Settings | None = None) -> ChaosHost:
    """A host by name: ``local`` (or none) is this machine, anything else a lab host."""
    if name in (None, "", LOCAL):
        return local_host(settings)
    hosts = lab_hosts(settings)
    for h in hosts:
        if h.name == name:
            return h
    known = ", ".join([LOCAL, *(h.name for h in hosts)])
    raise ConfigError(f"no host {name!r} (known: {known}; lab hosts come from 'osfleet lab up')")
