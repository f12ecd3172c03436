"""The capacity plan against hand-computed expectations; density itself is osfleet.measure.cost's
(tests/test_cost.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from osfleet.errors import OsfleetError
from osfleet.measure.cost import Footprint, HostType
from osfleet.plan import (
    DEFAULT_CPU_CORES,
    DEFAULT_DISK_BYTES,
    DEFAULT_MEMORY_BYTES,
    measured_footprint,
    plan,
)
from tests.conftest import VENV_BIN

SMALL = HostType(name="small", vcpus=16, memory_gib=64, usd_per_hour=1.0, source="test")
BIG = HostType(name="big", vcpus=96, memory_gib=192, usd_per_hour=4.0, source="test")
FP = Footprint(cpu_cores=0.5, memory_bytes=2**30, disk_bytes=0)
META = {"version": 1, "read_on": "2026-11-29"}


@pytest.mark.unit
def test_the_cheapest_mix_combines_host_types() -> None:
    # small: CPU (16 - 1) / 0.5 = 30, RAM (64 - 4) / 1 = 60 -> 30, CPU-bound
    # big:   CPU (96 - 1) / 0.5 = 190, RAM (192 - 4) / 1 = 188 -> 188, RAM-bound
    # 200 replicas: 7 small = $7/h, 2 big = $8/h, 1 big + 1 small (218) = $5/h
    p = plan(200, FP, [SMALL, BIG], META)
    assert [(m.host, m.count, m.replicas_per_host, m.binding_resource) for m in p.mix] == [
        ("small", 1, 30, "CPU"),
        ("big", 1, 188, "RAM"),
    ]
    assert (p.hosts, p.capacity, p.usd_per_hour) == (2, 218, 5.0)
    assert p.usd_per_replica_day == pytest.approx(5.0 * 24 / 200)  # 0.60
    by_host = {o.host: o for o in p.options}
    assert (by_host["small"].hosts, by_host["small"].usd_per_hour) == (7, 7.0)
    assert (by_host["big"].hosts, by_host["big"].usd_per_hour) == (2, 8.0)
    assert by_host["big"].usd_per_replica_day_full_host == pytest.approx(4.0 * 24 / 188)
    assert [o.host for o in p.options] == ["small", "big"]  # cheapest first


@pytest.mark.unit
def test_small_fleets_fit_one_small_host() -> None:
    p = plan(30, FP, [SMALL, BIG], META)
    assert [(m.host, m.count) for m in p.mix] == [("small", 1)] and p.usd_per_replica_day == pytest.approx(0.8)
    # one more replica: 2 small ($2/h) beats 1 big ($4/h)
    assert [(m.host, m.count) for m in plan(31, FP, [SMALL, BIG], META).mix] == [("small", 2)]


@pytest.mark.unit
def test_equal_prices_take_the_fewest_hosts() -> None:
    # 400 replicas: 2 x 200-replica hosts or 4 x 100-replica hosts cost the same $4/h
    half = HostType(name="half", vcpus=51, memory_gib=104, usd_per_hour=1.0, source="t")  # CPU 100, RAM 100
    double = HostType(name="double", vcpus=101, memory_gib=204, usd_per_hour=2.0, source="t")  # 200, 200
    p = plan(400, FP, [half, double], META)
    assert [(m.host, m.count) for m in p.mix] == [("double", 2)] and p.usd_per_hour == 4.0


@pytest.mark.unit
def test_a_host_type_that_holds_nothing_is_left_out() -> None:
    tiny = HostType(name="tiny", vcpus=1, memory_gib=4, usd_per_hour=0.01, source="t")  # nothing after reserves
    p = plan(10, FP, [tiny, SMALL], META)
    assert [o.host for o in p.options] == ["small"] and [m.host for m in p.mix] == ["small"]
    with pytest.raises(OsfleetError, match="holds even one replica"):
        plan(10, FP, [tiny], META)


@pytest.mark.unit
def test_replicas_out_of_range_is_refused() -> None:
    with pytest.raises(OsfleetError, match="--replicas must be between 1"):
        plan(0, FP, [SMALL], META)


@pytest.mark.unit
def test_footprint_defaults_overrides_and_a_run_without_measurements(tmp_path: Path) -> None:
    m = measured_footprint(runs_dir=tmp_path / "none")
    assert m.footprint == Footprint(DEFAULT_CPU_CORES, DEFAULT_MEMORY_BYTES, DEFAULT_DISK_BYTES)
    given = measured_footprint(runs_dir=tmp_path / "none", cpu_cores=1.5)
    assert given.footprint.cpu_cores == 1.5 and given.source.endswith("given: cpu_cores")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "reset.json").write_text("{}")
    with pytest.raises(OsfleetError, match="has no measured footprint"):
        measured_footprint(tmp_path / "run")


def write_run(run: Path) -> None:
    """A run directory with a reset bench (RAM) and host samples under load (CPU, disk), as bench all writes."""
    run.mkdir(parents=True)
    (run / "reset.json").write_text(json.dumps({"snapshot": {"rss_bytes_per_replica": 400 * 2**20}}))
    samples = [
        {"cpu_busy_share": 0.5, "cpus": 2, "replicas": {"ready": 1, "leased": 1},
         "disk_allocated_bytes": {"overlays": 100 * 2**20}},
        {"cpu_busy_share": 1.0, "cpus": 2, "replicas": {"ready": 0, "leased": 2},
         "disk_allocated_bytes": {"overlays": 300 * 2**20}},
    ]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    # CPU: (0.5 * 2 + 1.0 * 2) / (2 + 2) = 0.75 cores; disk: 400 MiB / 4 = 100 MiB; RAM 400 MiB


@pytest.mark.unit
def test_footprint_from_a_run_and_cpu_from_the_newest_run(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "2026-01-01")
    m = measured_footprint(tmp_path / "runs" / "2026-01-01")
    assert m.footprint == Footprint(0.75, 400 * 2**20, 100 * 2**20)
    newest = measured_footprint(runs_dir=tmp_path / "runs")
    assert newest.footprint == Footprint(0.75, DEFAULT_MEMORY_BYTES, DEFAULT_DISK_BYTES)
    assert newest.source.endswith(f"CPU measured in {tmp_path / 'runs' / '2026-01-01'}")


@pytest.mark.system
def test_plan_command_json(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "version: 7\nread_on: '2026-11-29'\nhosts:\n"
        "  - {name: small, vcpus: 16, memory_gib: 64, usd_per_hour: 1.0, source: https://example.org/a}\n"
        "  - {name: big, vcpus: 96, memory_gib: 192, usd_per_hour: 4.0, source: https://example.org/b}\n"
    )
    cmd = [str(VENV_BIN / "osfleet"), "plan", "--replicas", "200", "--prices", str(prices), "--json"]
    cmd += ["--cpu-cores", "0.5", "--memory-mib", "1024", "--disk-mib", "0", "--runs-dir", str(tmp_path / "none")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(m["host"], m["count"]) for m in doc["mix"]] == [("small", 1), ("big", 1)]
    assert doc["usd_per_replica_day"] == pytest.approx(0.6) and doc["prices"]["version"] == 7
    assert doc["footprint"]["cpu_cores"] == 0.5 and doc["prices"]["file"] == str(prices)
    bad = subprocess.run([*cmd, "--host-type", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("osfleet: error: no host type nope in")
    assert bad.stderr.count("\n") == 1
