"""The lab's one state file: what ``lab up`` made, so ``lab down`` removes exactly that."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from osfleet.errors import ConfigError

# Every kernel object the lab makes is named with this prefix, so ``lab down`` also finds what a crashed
# ``lab up`` made before it could write the state file. Interface names must fit in 15 characters.
NETNS_PREFIX = "osfl-lab"
STATE_NAME = "lab.json"


@dataclass(frozen=True)
class LabHost:
    """One lab host: a namespace reached from this machine over its own veth link."""

    name: str  # "lab1": the host's name in addresses, folders and replica names
    netns: str  # network namespace, "osfl-lab1"
    veth_host: str  # this machine's end of the link
    veth_ns: str  # the namespace's end
    host_addr: str  # this machine's address on the link
    addr: str  # the lab host's address (sshd listens here)
    prefix_len: int
    dir: str  # everything of this host: sshd config and keys, OSFLEET_HOME
    home: str  # the host's OSFLEET_HOME
    name_prefix: str  # the host's OSFLEET_NAME_PREFIX, "osfleet-lab1-"
    sshd_pid: int = 0

    @property
    def env(self) -> dict[str, str]:
        """Environment that makes osfleet act as this host (its files and its replicas only)."""
        return {"OSFLEET_HOME": self.home, "OSFLEET_NAME_PREFIX": self.name_prefix}


@dataclass
class LabState:
    """The whole lab: its subnet, its SSH key and its hosts."""

    root: str
    subnet: str  # "10.233.7.0/24"
    key: str  # private key path; the public key is key + ".pub"
    known_hosts: str
    hosts: list[LabHost] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "subnet": self.subnet,
            "key": self.key,
            "known_hosts": self.known_hosts,
            "hosts": [asdict(h) for h in self.hosts],
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LabState:
        hosts = data.get("hosts")
        if not isinstance(hosts, list):
            raise ConfigError("lab state file has no host list")
        return cls(
            root=str(data["root"]),
            subnet=str(data["subnet"]),
            key=str(data["key"]),
            known_hosts=str(data["known_hosts"]),
            hosts=[LabHost(**h) for h in hosts],
        )


def state_path(root: Path) -> Path:
    return root / STATE_NAME


def load(root: Path) -> LabState | None:
    """The lab's state, or None when no lab is up."""
    path = state_path(root)
    if not path.exists():
        return None
    try:
        return LabState.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"unreadable lab state file {path}: {exc}") from None


def save(state: LabState) -> None:
    """Write the state atomically (fsync + rename): a crash leaves the old or the new file, never half."""
    path = state_path(Path(state.root))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(state.to_json(), f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
