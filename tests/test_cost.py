"""The cost model against hand-computed expectations, and the shipped price table's provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

import osfleet
from osfleet.errors import OsfleetError
from osfleet.measure.cost import PRICES, Footprint, HostType, cost_table, load_prices, replicas_per_host

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
