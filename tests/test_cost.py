"""The cost model against hand-computed expectations, and the shipped price table's provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

import osfleet
from osfleet.errors import OsfleetError
from osfleet.measure.cost import (
    PRICES,
    Footprint,
    HostType,
    cost_table,
    load_prices,
    replicas_per_host,
    usd_per_1000_steps,
)

pytestmark = pytest.mark.unit

HOST = HostType(name="h", vcpus=96, memory_gib=192, usd_per_hour=4.08, source="test")


def test_memory_binds_when_replicas_are_light_on_cpu() -> None:
    # CPU: (96 - 1) / 0.5 = 190; RAM: (192 - 4) GiB / 1 GiB = 188  -> 188, RAM-bound
    n, binding = replicas_per_host(HOST, Footprint(cpu_cores=0.5, memory_bytes=2**30, disk_bytes=2**20))
    assert (n, binding) == (188, "RAM")
    (row,) = cost_table([HOST], Footprint(cpu_cores=0.5, memory_bytes=2**30, disk_bytes=2**20))
    assert row["usd_per_replica_day"] == pytest.approx(4.08 * 24 / 188)  # 0.5209


def test_cpu_binds_for_busy_replicas_and_disk_when_it_is_small() -> None:
    # CPU: 95 / 1.25 = 76; RAM: 188 GiB / 0.5 GiB = 376 -> 76, CPU-bound
    assert replicas_per_host(HOST, Footprint(1.25, 2**29, 0)) == (76, "CPU")
    small_disk = HostType(name="d", vcpus=96, memory_gib=192, usd_per_hour=1, source="t", disk_gib=10)
    # disk: 10 GiB / 1 GiB = 10 -> disk-bound
    assert replicas_per_host(small_disk, Footprint(0.1, 2**29, 2**30)) == (10, "disk")


def test_a_footprint_of_nothing_is_refused() -> None:
    with pytest.raises(OsfleetError, match="limits no resource"):
        replicas_per_host(HOST, Footprint(0, 0, 0))


def test_every_shipped_price_has_a_source_and_a_date() -> None:
    meta, hosts = load_prices()
    assert meta["version"] >= 1 and meta["read_on"]
    assert hosts and all(h.source.startswith("https://") and h.usd_per_hour > 0 for h in hosts)


def test_the_price_table_ships_inside_the_package() -> None:
    assert PRICES.is_file() and PRICES.is_relative_to(Path(osfleet.__file__).parent)


def test_a_price_without_source_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("version: 1\nhosts:\n  - {name: x, vcpus: 1, memory_gib: 1, usd_per_hour: 1}\n")
    with pytest.raises(OsfleetError, match="has no source"):
        load_prices(bad)


def test_a_step_costs_its_cpu_seconds_at_the_price_of_a_usable_core_second() -> None:
    # 4.08 USD/h over 95 usable cores (96 - 1 reserved): 4.08 / 3600 / 95 = 1.19298e-5 USD per core-second;
    # 0.5 core-s a step -> 1,000 steps = 500 core-s = 0.0059649 USD
    assert usd_per_1000_steps(HOST, 0.5) == pytest.approx(0.0059649, rel=1e-4)
    (row,) = cost_table([HOST], Footprint(1.25, 2**29, 0), cpu_seconds_per_step=0.5)
    assert row["usd_per_1000_steps"] == pytest.approx(0.0059649, rel=1e-4)
    with pytest.raises(OsfleetError, match="no price per step"):
        usd_per_1000_steps(HOST, 0.0)


def test_parked_replicas_are_priced_by_their_own_footprint() -> None:
    # parked: 48 MiB, 0.002 cores -> RAM: 188 GiB / 48 MiB = 4010.67 -> 4010 (CPU would allow 95 / 0.002 = 47500)
    # active: 1.25 cores, 512 MiB -> CPU: 95 / 1.25 = 76
    (row,) = cost_table([HOST], Footprint(1.25, 2**29, 0), parked=Footprint(0.002, 48 * 2**20, 0))
    assert (row["replicas_per_host"], row["binding_resource"]) == (76, "CPU")
    assert (row["parked_replicas_per_host"], row["parked_binding_resource"]) == (4010, "RAM")
    assert row["usd_per_parked_replica_day"] == pytest.approx(4.08 * 24 / 4010)  # 0.024419
    assert row["usd_per_replica_day"] == pytest.approx(4.08 * 24 / 76)  # 1.2884
    assert "usd_per_1000_steps" not in row  # no step cost measured, none made up


def test_the_shipped_prices_are_of_bare_metal_hosts_that_run_kvm_guests() -> None:
    _, hosts = load_prices()
    assert hosts and all(".metal" in h.name for h in hosts)
    assert any(h.name == "aws-c5.metal-on-demand" for h in hosts)  # the aws stack's default instance type
