"""What a fleet costs, from measured footprints and a versioned price table: USD per active replica-day, per
parked replica-day and per 1,000 steps on each priced host type.

Replicas per host = the smallest of (usable CPU / CPU per replica, usable memory / memory per replica,
usable disk / disk per replica); the resource that gives the smallest is the binding one, as in OSGym's
hardware-aware orchestration. Reserves keep room for the host itself. An active replica is one in use (its CPU
measured under load); a parked one waits paused for a lease (its memory measured by ``osfleet bench density``,
its CPU idle). A step costs the CPU the whole stack spent per step (guest, host agent, evaluation, gateway: resets
and evaluations spread over the steps of the episodes measured), priced at the host's usable core-seconds, so
``usd_per_1000_steps = usd_per_hour / 3600 / usable cores x CPU seconds per step x 1000``.

A measured core is one CPU of the machine measured (a vCPU here) and a priced one a vCPU of the host type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from osfleet.errors import OsfleetError

# The versioned price table ships with the package (osfleet/data/prices.yaml), so an installed osfleet has it.
PRICES = Path(str(resources.files("osfleet") / "data" / "prices.yaml"))
PRICES_NAME = "osfleet/data/prices.yaml"
CPU_RESERVE_CORES = 1.0
MEMORY_RESERVE_GIB = 4.0


@dataclass(frozen=True)
class HostType:
    name: str
    vcpus: int
    memory_gib: float
    usd_per_hour: float
    source: str
    disk_gib: float | None = None
    description: str = ""
    source_note: str = ""


@dataclass(frozen=True)
class Footprint:
    """What one replica costs the host, as measured in a run."""

    cpu_cores: float
    memory_bytes: float
    disk_bytes: float


def footprint_from_density(
    density: dict[str, Any], cpu_cores: float | None = None, disk_bytes: float = 0.0
) -> Footprint:
    """A replica's footprint from ``osfleet bench density``: host memory per held replica (template memory
    as measured, where it was on) and idle CPU unless a CPU figure under load is given."""
    mib = density.get("mib_per_replica")
    if not mib:
        raise OsfleetError("the density result has no memory per replica")
    cpu = cpu_cores if cpu_cores is not None else float(density.get("cpu_per_idle_replica") or 0.0)
    return Footprint(cpu_cores=cpu, memory_bytes=float(mib) * 2**20, disk_bytes=disk_bytes)


def load_prices(path: Path = PRICES) -> tuple[dict[str, Any], list[HostType]]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise OsfleetError(f"cannot read price table {path}: {exc}") from None
    fields = set(HostType.__dataclass_fields__)
    hosts = []
    for h in doc.get("hosts", []):
        if not h.get("source"):
            raise OsfleetError(f"price table {path}: host {h.get('name')} has no source")
        hosts.append(HostType(**{k: v for k, v in h.items() if k in fields}))
    return {k: v for k, v in doc.items() if k != "hosts"}, hosts


def replicas_per_host(host: HostType, fp: Footprint) -> tuple[int, str]:
    limits = {
        "CPU": (host.vcpus - CPU_RESERVE_CORES) / fp.cpu_cores if fp.cpu_cores > 0 else math.inf,
        "RAM": (host.memory_gib - MEMORY_RESERVE_GIB) * 2**30 / fp.memory_bytes if fp.memory_bytes > 0 else math.inf,
        "disk": host.disk_gib * 2**30 / fp.disk_bytes if host.disk_gib and fp.disk_bytes > 0 else math.inf,
    }
    binding = min(limits, key=lambda k: limits[k])
    if math.isinf(limits[binding]):
        raise OsfleetError("the footprint limits no resource: nothing to compute a density from")
    return max(0, math.floor(limits[binding])), binding


def usd_per_1000_steps(host: HostType, cpu_seconds_per_step: float) -> float:
    """1,000 steps' share of the host's price: their CPU seconds at the price of a usable core-second."""
    usable = host.vcpus - CPU_RESERVE_CORES
    if usable <= 0 or cpu_seconds_per_step <= 0:
        raise OsfleetError(f"host {host.name}: no usable core, or a step that costs no CPU: no price per step")
    return host.usd_per_hour / 3600 / usable * cpu_seconds_per_step * 1000


def cost_table(
    hosts: list[HostType],
    fp: Footprint,
    parked: Footprint | None = None,
    cpu_seconds_per_step: float | None = None,
) -> list[dict[str, Any]]:
    """One row per host type: active replicas (footprint ``fp``) per host and their USD per replica-day; with
    ``parked``, the same for parked replicas; with ``cpu_seconds_per_step``, USD per 1,000 steps."""
    rows = []
    for h in hosts:
        n, binding = replicas_per_host(h, fp)
        row: dict[str, Any] = {
            "host": h.name,
            "replicas_per_host": n,
            "binding_resource": binding,
            "usd_per_hour": h.usd_per_hour,
            "usd_per_replica_day": h.usd_per_hour * 24 / n if n else None,
            "source": h.source,
        }
        if parked is not None:
            p, parked_binding = replicas_per_host(h, parked)
            row["parked_replicas_per_host"] = p
            row["parked_binding_resource"] = parked_binding
            row["usd_per_parked_replica_day"] = h.usd_per_hour * 24 / p if p else None
        if cpu_seconds_per_step is not None:
            row["usd_per_1000_steps"] = usd_per_1000_steps(h, cpu_seconds_per_step)
        rows.append(row)
    return rows
