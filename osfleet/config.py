"""The one configuration model of osfleet: where things live on a host and how to reach libvirt.

Defaults are named constants; every value can be overridden by an ``OSFLEET_*`` environment variable
so the same code serves a developer machine, CI and a bare-metal host.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from osfleet.errors import ConfigError
from osfleet.network_policy import NetworkPolicy
from osfleet.protocol.models import Mode

DEFAULT_HOME = Path("/var/lib/osfleet")
DEFAULT_LIBVIRT_URI = "qemu:///system"
# Template RAM files (osfleet.replicas.template_memory): a tmpfs every libvirt QEMU can see.
DEFAULT_MEMORY_DIR = Path("/dev/shm/osfleet")
NAME_PREFIX = "osfleet-"
GOLDEN_PREFIX = "golden-"
_PREFIX_PATTERN = re.compile(r"^osfleet-([a-z0-9]+-)?$")

Tenancy = Literal["single", "multi"]
"""Whether this host's replicas all serve one user (``single``) or different users (``multi``): with
``multi``, host settings that share pages between replicas' private memory (KSM) stay off."""
TENANCIES: tuple[Tenancy, ...] = get_args(Tenancy)

# How a replica is brought up and reset (a cold boot, or a restore of the image's saved running state): part of
# the contract (a client may ask for one when scaling up).


@dataclass(frozen=True)
class ReplicaShape:
    """The virtual hardware of a replica. A saved running state only restores into the same shape."""

    memory_mib: int = 512
    vcpus: int = 1
    tb_cache_mib: int = 64
    # The bridge of the opt-in replica network (``osfleet.replicas.network``); None: no network device at all.
    network_bridge: str | None = None
    # Appended to the image's kernel command line (a saved state is booted with them, so they are part of
    # its shape). An emulated guest's timers cost host CPU: ``tsc=reliable`` drops the clocksource
    # watchdog (a timer every 0.5 s), ``nowatchdog`` the lockup detectors (measured in README, "Density").
    kernel_args: str = "tsc=reliable nowatchdog"


@dataclass(frozen=True)
class RecordingConfig:
    """How a host agent records episodes (osfleet.recording): images re-encoded as ``image_format`` at
    ``quality``; the store under ``$OSFLEET_HOME/trajectories`` kept under ``max_bytes`` and ``max_episodes``
    (oldest removed first)."""

    image_format: Literal["jpeg", "webp"] = "jpeg"
    quality: int = 75
    max_bytes: int | None = 2 * 2**30
    max_episodes: int | None = None


# Request bodies are refused above this size before they are read or authenticated (413). A step of 100
# shell commands at their 100 000-character limit is ~10 MB; client metadata above 256 KiB is not kept anyway.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# The most of each host-wide budget one client may hold (``host serve --client-share``; osfleet.api.admission).
DEFAULT_CLIENT_SHARE = 0.5


@dataclass(frozen=True)
class ClientToken:
    """One tenant of a server (a line of ``--clients-file``): its name, and its token's SHA-256 (only the digest
    is kept in memory, so a clients file may hold digests instead of tokens)."""

    name: str
    sha256: bytes


@dataclass(frozen=True)
class AgentConfig:
    """How one host agent (or the gateway: the auth and limit fields) serves its replicas."""

    token: str  # the operator's: may do everything
    image: str | None = None  # golden image name or hash prefix; None: the newest
    mode: Mode = "snapshot"
    warm: int = 1
    lease_seconds: float = 900.0
    osgym_allowed_ips: tuple[str, ...] = ()  # OSGym clients send no token; they may be allowed by address
    recording: RecordingConfig | None = None  # None: episodes are not recorded (osfleet.recording)
    clients: tuple[ClientToken, ...] = ()  # tenants: each sees and touches only its own replicas and episodes
    allow_agent_root: bool = False  # whether clients' shell actions may run as root in the guest
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Whether the operator's token may name the client it acts for (X-Osfleet-Client): true on a host agent
    # (its gateway does so); false on the gateway, which is the edge and sets that header itself.
    on_behalf_of: bool = True
    # A token that reads /metrics and nothing else (a Prometheus server's), besides the operator's; None: none.
    metrics_token: str | None = None
    # The most of each host-wide budget one client may hold: evaluation slots, saved forks and checkpoints,
    # recordings (osfleet.api.admission; a share under 1 leaves room for others whatever one client does).
    client_share: float = DEFAULT_CLIENT_SHARE


@dataclass(frozen=True)
class Settings:
    """Paths and endpoints of one host; ``home`` holds every file osfleet creates there."""

    home: Path = DEFAULT_HOME
    libvirt_uri: str = DEFAULT_LIBVIRT_URI
    # Every domain this host makes starts with it. Hosts sharing one libvirtd (a lab) each get their own,
    # so one host's clean-up never touches another's replicas.
    name_prefix: str = NAME_PREFIX
    # Where saved states keep their RAM for clones to map (tmpfs); None: template memory off (full-stream
    # restores). OSFLEET_MEMORY_DIR, empty for off.
    memory_dir: Path | None = DEFAULT_MEMORY_DIR
    # OSFLEET_TENANCY: single (default) or multi (replicas belong to different users; KSM stays off).
    tenancy: Tenancy = "single"
    # OSFLEET_REPLICA_NETWORK: off (default: replicas have no network device), nat, or proxy=http://IP:PORT;
    # OSFLEET_REPLICA_SUBNET: the replicas' addresses (see osfleet.replicas.network).
    replica_network: str = "off"
    replica_subnet: str = "172.30.0.0/16"
    # Forks (``osfleet.replicas.forks``): at most this many forks in one chain (a child of a child of ...),
    # OSFLEET_FORK_MAX_DEPTH; at most this many bytes of saved forks (RAM files, streams, disk layers),
    # OSFLEET_FORK_MAX_BYTES; this many children's domains started ahead of the next fork, OSFLEET_FORK_READY.
    fork_max_depth: int = 4
    fork_max_bytes: int = 8 * 2**30
    fork_ready: int = 0
    # Checkpoints (``osfleet.replicas.checkpoints``): what one client may keep on this host, in number
    # (OSFLEET_CHECKPOINT_MAX_COUNT) and bytes of disk layers and memory (OSFLEET_CHECKPOINT_MAX_BYTES).
    checkpoint_max_count: int = 32
    checkpoint_max_bytes: int = 32 * 2**30

    def __post_init__(self) -> None:
        if not _PREFIX_PATTERN.match(self.name_prefix):
            raise ConfigError(
                f"OSFLEET_NAME_PREFIX {self.name_prefix!r} must look like 'osfleet-' or 'osfleet-<letters/digits>-'"
            )
        if self.tenancy not in TENANCIES:
            raise ConfigError(f"OSFLEET_TENANCY {self.tenancy!r} must be one of {', '.join(TENANCIES)}")
        NetworkPolicy.parse(self.replica_network, self.replica_subnet)  # checks the values; raises ConfigError
        if self.fork_max_depth < 1 or self.fork_max_bytes < 2**20 or not 0 <= self.fork_ready <= 64:
            raise ConfigError(
                "OSFLEET_FORK_MAX_DEPTH must be at least 1, OSFLEET_FORK_MAX_BYTES at least 1 MiB and "
                "OSFLEET_FORK_READY 0..64"
            )
        if self.checkpoint_max_count < 0 or self.checkpoint_max_bytes < 0:
            raise ConfigError("OSFLEET_CHECKPOINT_MAX_COUNT and OSFLEET_CHECKPOINT_MAX_BYTES cannot be negative")

    @property
    def replica_prefix(self) -> str:
        """Prefix of this host's replica domains (``<prefix>r-<id>-g<generation>``)."""
        return f"{self.name_prefix}r-"

    @property
    def template_prefix(self) -> str:
        """Prefix of this host's template domains, booted once to save a running state."""
        return f"{self.name_prefix}template-"

    @property
    def build_dir(self) -> Path:
        """Golden images as built, before publishing (the build cache)."""
        return self.home / "build"

    @property
    def image_store(self) -> Path:
        """Published, read-only golden images that replicas are backed by."""
        return self.home / "images"

    @property
    def replicas_dir(self) -> Path:
        return self.home / "replicas"

    @property
    def scratch_dir(self) -> Path:
        """Short-lived work: benchmark disks, throwaway verify replicas."""
        return self.home / "scratch"

    @property
    def states_dir(self) -> Path:
        """Saved running states (memory + frozen disk layer) that replicas are restored from."""
        return self.home / "states"

    @property
    def forks_dir(self) -> Path:
        """Running replicas saved mid-episode (``osfleet.replicas.forks``); each lives while a child uses it."""
        return self.home / "forks"

    @property
    def checkpoints_dir(self) -> Path:
        """Named checkpoints' records, one folder per client (their forks stay in ``forks_dir``)."""
        return self.home / "checkpoints"

    @property
    def network_dir(self) -> Path:
        """The opt-in replica network's address book."""
        return self.home / "network"

    @property
    def token_file(self) -> Path:
        """The host agent's bearer token when none is given (made once, readable by root only)."""
        return self.home / "api-token"

    @property
    def accel_cache(self) -> Path:
        return self.home / "accel.json"

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            home=Path(os.environ.get("OSFLEET_HOME", str(DEFAULT_HOME))),
            libvirt_uri=os.environ.get("OSFLEET_LIBVIRT_URI", DEFAULT_LIBVIRT_URI),
            name_prefix=os.environ.get("OSFLEET_NAME_PREFIX", NAME_PREFIX),
            memory_dir=Path(md) if (md := os.environ.get("OSFLEET_MEMORY_DIR", str(DEFAULT_MEMORY_DIR))) else None,
            tenancy=os.environ.get("OSFLEET_TENANCY", "single"),  # type: ignore[arg-type]  # checked above
            replica_network=os.environ.get("OSFLEET_REPLICA_NETWORK", "off") or "off",
            replica_subnet=os.environ.get("OSFLEET_REPLICA_SUBNET", "172.30.0.0/16") or "172.30.0.0/16",
            fork_max_depth=_int_env("OSFLEET_FORK_MAX_DEPTH", 4),
            fork_max_bytes=_int_env("OSFLEET_FORK_MAX_BYTES", 8 * 2**30),
            checkpoint_max_count=_int_env("OSFLEET_CHECKPOINT_MAX_COUNT", 32),
            checkpoint_max_bytes=_int_env("OSFLEET_CHECKPOINT_MAX_BYTES", 32 * 2**30),
            fork_ready=_int_env("OSFLEET_FORK_READY", 0),
        )


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
