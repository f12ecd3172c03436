"""``osfleet plan``: how many hosts of which priced types hold N replicas, and what a replica-day costs.

Density per host type comes from ``osfleet.measure.cost`` (the one cost model: usable CPU, RAM and disk divided by
the measured footprint per replica; the smallest quotient binds). The plan adds the fleet on top: the
cheapest mix of host types whose capacity covers N replicas (a small exact knapsack), each homogeneous
option beside it, and the cost per replica-day of the planned fleet (hosts' price x 24 / N, so unused
slots in the last host are paid for).

The footprint is, in this order: a run directory's measured figures (``--run``), figures given on the
command line, else the defaults below: RAM and disk measured on the machine this was written on, CPU from
the newest run directory under ``runs/`` with a load test, or the CPU default measured here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from osfleet.cli_support import friendly
from osfleet.errors import ConfigError, OsfleetError
from osfleet.measure.cost import PRICES, PRICES_NAME, Footprint, HostType, load_prices, replicas_per_host

# Measured on the development machine (2 cores, 24 GiB, QEMU TCG, one snapshot replica on template memory,
# 2026-11-30): its QEMU used 0.43 of a core while stepping (a click, typed text and a guest shell command,
# then a screenshot, about once a second; 0.007 idle), 188 MiB RSS / 153 MiB PSS after a minute, and its
# replica folder (this generation's overlay and the next one's) 1.1 MiB. RAM is planned at 300 MiB, the
# figure measured with several replicas under load (the agent's own estimate is 350 MiB), since a guest's
# memory grows with use.
DEFAULT_MEMORY_BYTES = 300 * 2**20
DEFAULT_CPU_CORES = 0.43
DEFAULT_DISK_BYTES = int(1.1 * 2**20)
DEFAULTS_SOURCE = "defaults measured on the development machine (osfleet/plan.py)"
MAX_REPLICAS = 10_000_000


@dataclass(frozen=True)
class Measured:
    footprint: Footprint
    source: str


@dataclass(frozen=True)
class Option:
    """One host type holding the whole fleet alone."""

    host: str
    replicas_per_host: int
    binding_resource: str
    hosts: int
    usd_per_hour: float  # the fleet's
    usd_per_replica_day: float  # the fleet's, over N replicas
    usd_per_replica_day_full_host: float  # a full host's (osfleet.measure.cost's figure)
    source: str


@dataclass(frozen=True)
class MixItem:
    host: str
    count: int
    replicas_per_host: int
    binding_resource: str
    usd_per_hour: float


@dataclass(frozen=True)
class Plan:
    replicas: int
    footprint: Footprint
    footprint_source: str
    prices: dict[str, Any]
    mix: list[MixItem]
    hosts: int
    capacity: int  # replicas the planned hosts hold
    usd_per_hour: float
    usd_per_replica_day: float
    options: list[Option]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["footprint"] = {**asdict(self.footprint), "source": self.footprint_source}
        del doc["footprint_source"]
        return doc


def newest_run(runs_dir: Path) -> Path | None:
    """The newest run directory under ``runs_dir`` whose measurements give a footprint, or None."""
    from osfleet.report.load import load

    if not runs_dir.is_dir():
        return None
    for run in sorted((p for p in runs_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            if load(run).cost is not None:
                return run
        except OsfleetError:
            continue
    return None


def measured_footprint(
    run: Path | None = None,
    runs_dir: Path = Path("runs"),
    cpu_cores: float | None = None,
    memory_bytes: float | None = None,
    disk_bytes: float | None = None,
) -> Measured:
    """The footprint per replica: ``run``'s measured figures, else the defaults (CPU from the newest run under
    ``runs_dir`` when one has a load test); each figure given explicitly overrides."""
    from osfleet.report.load import load

    if run is not None:
        cost = load(run).cost
        if cost is None:
            raise ConfigError(f"{run} has no measured footprint (it needs a load test and a reset bench)")
        fp, source = cost.footprint, f"measured in {run}"
    else:
        fp, source = Footprint(DEFAULT_CPU_CORES, DEFAULT_MEMORY_BYTES, DEFAULT_DISK_BYTES), DEFAULTS_SOURCE
        newest = newest_run(runs_dir)
        if newest is not None:
            cost = load(newest).cost
            assert cost is not None
            fp = Footprint(cost.footprint.cpu_cores, fp.memory_bytes, fp.disk_bytes)
            source += f"; CPU measured in {newest}"
    given = {"cpu_cores": cpu_cores, "memory_bytes": memory_bytes, "disk_bytes": disk_bytes}
    given = {k: v for k, v in given.items() if v is not None}
    if given:
        fp = Footprint(**{**asdict(fp), **given})
        source += "; given: " + ", ".join(given)
    return Measured(fp, source)


def plan(replicas: int, fp: Footprint, hosts: list[HostType], prices: dict[str, Any]) -> Plan:
    """The cheapest mix of ``hosts`` types holding ``replicas`` replicas of footprint ``fp`` (fewest hosts
    among equally cheap mixes), and each type on its own."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas must be between 1 and {MAX_REPLICAS}")
    if not hosts:
        raise ConfigError("the price table has no host types")
    density = {h.name: replicas_per_host(h, fp) for h in hosts}
    usable = [h for h in hosts if density[h.name][0] > 0]
    if not usable:
        raise OsfleetError("no priced host type holds even one replica of this footprint")
    options = []
    for h in usable:
        per, binding = density[h.name]
        n = math.ceil(replicas / per)
        options.append(
            Option(
                host=h.name,
                replicas_per_host=per,
                binding_resource=binding,
                hosts=n,
                usd_per_hour=n * h.usd_per_hour,
                usd_per_replica_day=n * h.usd_per_hour * 24 / replicas,
                usd_per_replica_day_full_host=h.usd_per_hour * 24 / per,
                source=h.source,
            )
        )
    counts = _cheapest_mix(replicas, [(density[h.name][0], h.usd_per_hour) for h in usable])
    mix = [
        MixItem(h.name, c, density[h.name][0], density[h.name][1], c * h.usd_per_hour)
        for h, c in zip(usable, counts, strict=True)
        if c
    ]
    usd_h = sum(m.usd_per_hour for m in mix)
    return Plan(
        replicas=replicas,
        footprint=fp,
        footprint_source="",
        prices={**prices, "file": PRICES_NAME},
        mix=mix,
        hosts=sum(m.count for m in mix),
        capacity=sum(m.count * m.replicas_per_host for m in mix),
        usd_per_hour=usd_h,
        usd_per_replica_day=usd_h * 24 / replicas,
        options=sorted(options, key=lambda o: (o.usd_per_hour, o.hosts)),
    )


def _cheapest_mix(replicas: int, types: list[tuple[int, float]]) -> list[int]:
    """Host counts per type covering ``replicas`` at the least price per hour (then the fewest hosts):
    best[n] = cheapest way to hold at least n replicas = min over types of price + best[n - capacity]."""
    best: list[tuple[float, int]] = [(0.0, 0)] * (replicas + 1)
    choice = [-1] * (replicas + 1)
    for n in range(1, replicas + 1):
        cand = None
        for i, (cap, price) in enumerate(types):
            prev = best[max(0, n - cap)]
            c = (round(prev[0] + price, 9), prev[1] + 1)
            if cand is None or c < cand:
                cand, choice[n] = c, i
        assert cand is not None
        best[n] = cand
    counts = [0] * len(types)
    n = replicas
    while n > 0:
        i = choice[n]
        counts[i] += 1
        n = max(0, n - types[i][0])
    return counts


# --- command -----------------------------------------------------------------------------------------------
def render(p: Plan) -> str:
    fp = p.footprint
    lines = [
        f"Capacity plan for {p.replicas} replicas",
        f"footprint per replica: {fp.cpu_cores:.2f} CPU cores, {fp.memory_bytes / 2**20:.0f} MiB RAM, "
        f"{fp.disk_bytes / 2**20:.1f} MiB disk ({p.footprint_source})",
        f"prices: {p.prices['file']} version {p.prices.get('version')}, read on {p.prices.get('read_on')}",
        "",
        f"plan: {p.hosts} host(s), capacity {p.capacity}, ${p.usd_per_hour:.3f}/h, "
        f"${p.usd_per_replica_day:.4f} per replica-day",
    ]
    for m in p.mix:
        lines.append(
            f"  {m.count} x {m.host}: {m.replicas_per_host} replicas each ({m.binding_resource}-bound), "
            f"${m.usd_per_hour:.2f}/h"
        )
    lines += ["", f"{'host type':<34} {'per host':>8} {'binds':>5} {'hosts':>6} {'$/h':>9} {'$/replica-day':>13}"]
    for o in p.options:
        lines.append(
            f"{o.host:<34} {o.replicas_per_host:>8} {o.binding_resource:>5} {o.hosts:>6} "
            f"{o.usd_per_hour:>9.2f} {o.usd_per_replica_day:>13.4f}"
        )
    return "\n".join(lines)


@click.command("plan")
@click.option("--replicas", type=int, required=True, help="replicas the fleet must hold at once")
@click.option("--run", "run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="take the footprint measured in this run directory (osfleet bench all)")  # fmt: skip
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
              help="without --run: the CPU share comes from the newest run here that has a load test")  # fmt: skip
@click.option("--cpu-cores", type=float, default=None, help="override: CPU cores per replica")
@click.option("--memory-mib", type=float, default=None, help="override: MiB of RAM per replica")
@click.option("--disk-mib", type=float, default=None, help="override: MiB of disk per replica")
@click.option("--prices", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=PRICES,
              help="price table (default: the one shipped with osfleet)")  # fmt: skip
@click.option("--host-type", "host_types", multiple=True, help="only these host types (repeatable)")
@click.option("--json", "as_json", is_flag=True)
@friendly
def plan_cmd(
    replicas: int,
    run_dir: Path | None,
    runs_dir: Path,
    cpu_cores: float | None,
    memory_mib: float | None,
    disk_mib: float | None,
    prices: Path,
    host_types: tuple[str, ...],
    as_json: bool,
) -> None:
    """A capacity plan for N replicas: host mix, replicas per host, binding resource, cost per replica-day."""
    m = measured_footprint(
        run_dir,
        runs_dir,
        cpu_cores=cpu_cores,
        memory_bytes=memory_mib * 2**20 if memory_mib is not None else None,
        disk_bytes=disk_mib * 2**20 if disk_mib is not None else None,
    )
    meta, hosts = load_prices(prices)
    if host_types:
        unknown = sorted(set(host_types) - {h.name for h in hosts})
        if unknown:
            have = ", ".join(h.name for h in hosts)
            raise ConfigError(f"no host type {', '.join(unknown)} in {prices} (have {have})")
        hosts = [h for h in hosts if h.name in host_types]
    p = plan(replicas, m.footprint, hosts, meta)
    file = PRICES_NAME if prices == PRICES else str(prices)
    p = Plan(**{**p.__dict__, "footprint_source": m.source, "prices": {**meta, "file": file}})
    click.echo(json.dumps(p.to_json(), indent=2) if as_json else render(p))
