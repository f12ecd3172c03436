"""``osfleet bench throughput``'s arithmetic on hand-made episodes, and its CPU accounting by kind of process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from osfleet.bench.cpu_use import KINDS, CpuUse, kind_of
from osfleet.bench.throughput import summarise

T0 = 1_000_000.0


def episode(status: str, start: float, end: float, **extra: object) -> dict[str, object]:
    seconds = {"lease": 0.01, "reset": 1.0, "steps": 2.0, "evaluate": 0.5, "release": 0.2}
    return {"status": status, "t_start": T0 + start, "t_end": T0 + end, "task": "t", "steps": 2, "seconds": seconds,
            "server_seconds": {"step.capture": 0.1}, **extra}  # fmt: skip


@pytest.mark.unit
def test_only_episodes_scored_within_the_minutes_count_and_unscored_ones_are_aborts() -> None:
    episodes = [
        episode("scored", 0, 10, reward=1.0, success=True),
        episode("scored", 5, 20, reward=1.0, success=True),
        episode("scored", 30, 59, reward=0.5, success=False),
        episode("scored", 50, 61, reward=1.0, success=True),  # ended after the minute: cut at the end
        episode("aborted", 1, 2, abort_reason="503 infrastructure"),
        episode("error", 3, 4, abort_reason="409 lease"),
        episode("interrupted", 40, 60),
    ]
    cpu = {"qemu": 6.0, "host_agents": 3.0, "other": 1.0, "all": 12.0, "unaccounted": 2.0}
    r = summarise(episodes, T0, 1.0, cpu, 60.0)
    assert (r["trajectories_per_min"], r["scored"], r["successful"]) == (3.0, 3, 2)
    assert r["mean_reward"] == pytest.approx(2.5 / 3, abs=1e-3)
    assert (r["aborted"], r["aborted_by_kind"], r["cut_at_end"]) == (2, {"aborted": 1, "error": 1}, 2)
    assert r["stages"]["reset"] == {"p50": 1.0, "p95": 1.0, "share": pytest.approx(1.0 / 3.71, abs=1e-3)}
    assert r["stages"]["server.step.capture"]["mean"] == pytest.approx(0.1)
    assert r["cpu"]["per_trajectory_s"]["qemu"] == 2.0 and r["cpu"]["cores_busy"] == 0.2  # 12 core-s over 60 s
    assert r["goal_met"] is False


@pytest.mark.unit
def test_processes_are_told_apart_by_their_command_line() -> None:
    assert kind_of("/usr/bin/qemu-system-x86_64 -name guest=osfleet-ch1-r-1") == "qemu"
    assert kind_of("/work/.venv/bin/python -m osfleet host serve --port 1") == "host_agents"
    assert kind_of("/usr/bin/python3 -I -m osfleet.tasks.jail.zygote 5") == "evaluation_jail"  # not the host's
    assert kind_of("python -m osfleet fleet serve --port 2") == "gateway"
    assert kind_of("python -m locust -f trajectories.py") == "load_generator"
    assert kind_of("/usr/sbin/libvirtd --timeout 120") == "libvirt"
    assert kind_of("/usr/bin/mypy") == "other"


@pytest.mark.system  # starts a process
def test_the_cpu_of_a_process_that_came_and_went_in_the_window_is_counted_under_its_kind() -> None:
    marker = f"cpu-use-test-{os.getpid()}"  # its own kind: the machine's real guests are "qemu"
    burn = f"# {marker}\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass"
    with CpuUse(sample_seconds=0.1, kinds=(("burner", (marker,)), *KINDS)) as use:
        subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)
    seen = use.result()
    assert seen["burner"] == pytest.approx(0.8, abs=0.15)  # up to its last sample, a tenth of a second at most short
    assert seen["all"] >= seen["burner"]
