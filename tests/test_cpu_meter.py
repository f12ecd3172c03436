"""CPU time per process to the nanosecond (``osfleet.measure.cpu``), and how ``bench step`` turns it into a
figure per step."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from osfleet.bench import step as bench_step
from osfleet.measure.cpu import process_cpu_ns, processes_cpu_ns

pytestmark = pytest.mark.unit


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_process_time_counts_every_thread_finer_than_a_clock_tick() -> None:
    before = process_cpu_ns(os.getpid())
    worker = threading.Thread(target=_spin, args=(0.003,))  # less than one 10 ms tick of /proc/<pid>/stat
    worker.start()
    _spin(0.002)
    used = process_cpu_ns(os.getpid())
    worker.join()
    assert before is not None and used is not None
    assert used - before >= 2_000_000  # at least this thread's 2 ms (the worker's 3 ms once it was seen)


def test_a_process_that_is_gone_has_no_time_and_counts_zero_in_a_sum() -> None:
    gone = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it: never a process
    assert process_cpu_ns(gone) is None
    mine = process_cpu_ns(os.getpid())
    assert mine is not None and processes_cpu_ns([gone, os.getpid()]) >= mine


def test_summarize_gives_each_process_its_cpu_per_step() -> None:
    rounds = [
        {"seconds": 0.05, "bytes": 1, "stages": {}, "cpu_ms": {"agent": 2.0, "qemu": 20.0}},
        {"seconds": 0.05, "bytes": 1, "stages": {}, "cpu_ms": {"agent": 4.0, "qemu": 10.0, "libvirtd": 1.0}},
        {"seconds": 0.05, "bytes": 1, "stages": {}, "cpu_ms": {"agent": 3.0, "qemu": 30.0}},
    ]
    s = bench_step.summarize(rounds)
    assert s["agent_cpu_ms_per_step_p50"] == 3.0 and s["agent_cpu_ms_per_step_mean"] == pytest.approx(3.0)
    assert s["qemu_cpu_ms_per_step_p50"] == 20.0 and s["libvirtd_cpu_ms_per_step_p50"] == 1.0
    assert "agent_cpu_ms_per_step_p50" not in bench_step.summarize([{"seconds": 0.1, "bytes": 1, "stages": {}}])
