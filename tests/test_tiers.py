"""The test tiers' rules (tests/conftest.py): a ``unit`` test that opens libvirt fails, even from a thread that
swallows the error; a ``unit`` or ``integration`` test (the default run) that starts a process fails the same way,
a fixture's process included; markers that contradict each other fail before any fixture runs; a test in no tier
(``slow`` alone is none) fails before its fixtures run; the default run is ``unit`` and ``integration`` alone, on
xdist's workers; every ``vm`` test is in one xdist group. Each case is a pytest run of its own on
a sample file, as a developer would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.system  # each case is a pytest run in a subprocess

SAMPLE = """
import os
import subprocess
import threading

import libvirt
import pytest

@pytest.mark.unit
def test_opens_qemu() -> None:
    libvirt.open("qemu:///system")


@pytest.mark.unit
def test_swallows_it_in_a_thread() -> None:
    def start() -> None:
        try:
            libvirt.open("qemu:///system")
        except RuntimeError:
            pass

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()


@pytest.mark.unit
def test_uses_the_test_driver() -> None:
    libvirt.open("test:///default").close()


@pytest.mark.unit
@pytest.mark.integration
def test_says_two_tiers() -> None:
    pass


@pytest.mark.unit
def test_asks_for_a_vm_fixture(golden) -> None:
    pass


@pytest.mark.perf
def test_times_something() -> None:
    pass


@pytest.mark.integration
def test_plain() -> None:
    print("xdist workers:", os.environ.get("PYTEST_XDIST_WORKER_COUNT"))


@pytest.mark.integration
def test_starts_a_process() -> None:
    subprocess.run(["true"], check=True)


@pytest.mark.integration
def test_starts_one_in_a_thread_that_swallows_the_error() -> None:
    def start() -> None:
        try:
            subprocess.run(["true"], check=True)
        except RuntimeError:
            pass

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()


@pytest.fixture
def server() -> None:
    subprocess.Popen(["sleep", "0"]).wait()


@pytest.mark.integration
def test_whose_fixture_starts_a_process(server) -> None:
    pass


@pytest.mark.system
def test_system_starts_a_process() -> None:
    subprocess.run(["true"], check=True)


@pytest.mark.vm
def test_boots_a_replica(request) -> None:
    assert [m.args for m in request.node.iter_markers("xdist_group")] == [("vm",)]


@pytest.mark.integration
@pytest.mark.slow
def test_slow_in_the_default_run() -> None:
    pass


@pytest.mark.integration
@pytest.mark.heavy
def test_heavy_in_the_default_run() -> None:
    pass
"""

NO_TIER = """
import pytest


@pytest.fixture
def started() -> None:
    print("the fixture ran")


def test_in_no_tier(started) -> None:
    pass


@pytest.mark.slow
def test_only_slow(started) -> None:
    pass


@pytest.mark.slow
@pytest.mark.system
def test_slow_and_system() -> None:
    pass
"""


def run_pytest(tmp_path: Path, *args: str, sample: str = SAMPLE) -> str:
    (tmp_path / "test_sample.py").write_text(sample)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-rA", "-q", *args, str(tmp_path / "test_sample.py")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.stdout


def outcome(out: str, name: str) -> str:
    """The test's outcome from ``-rA``'s summary: FAILED, ERROR (set-up or teardown), PASSED or NOT RUN."""
    words = {line.split()[0] for line in out.splitlines() if line.endswith(f"::{name}") or f"::{name} - " in line}
    return next((w for w in ("FAILED", "ERROR", "PASSED") if w in words), "NOT RUN")


def test_unit_tests_cannot_reach_a_hypervisor(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-n", "0", "-m", "unit")
    assert outcome(out, "test_opens_qemu") == "FAILED", out
    assert "a unit test opened libvirt at 'qemu:///system'" in out
    assert outcome(out, "test_swallows_it_in_a_thread") == "ERROR", out  # failed at teardown
    assert outcome(out, "test_uses_the_test_driver") == "PASSED", out


def test_the_default_run_starts_no_process(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-n", "0")
    assert outcome(out, "test_plain") == "PASSED", out
    assert outcome(out, "test_starts_a_process") == "FAILED", out
    assert "test_starts_a_process is marked integration but started a process (true): " in out
    assert outcome(out, "test_starts_one_in_a_thread_that_swallows_the_error") == "ERROR", out  # at teardown
    assert outcome(out, "test_whose_fixture_starts_a_process") == "ERROR", out
    assert "test_whose_fixture_starts_a_process is marked integration but started a process (sleep)" in out
    system = run_pytest(tmp_path, "-n", "0", "-m", "system")
    assert outcome(system, "test_system_starts_a_process") == "PASSED", system
    assert outcome(system, "test_plain") == "NOT RUN", system


def test_contradicting_markers_fail_before_fixtures_run(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-n", "0", "-m", "unit or integration")
    assert outcome(out, "test_says_two_tiers") == "ERROR", out
    assert "marked unit but it is also integration" in out
    assert outcome(out, "test_asks_for_a_vm_fixture") == "ERROR", out
    assert "marked unit but it is also golden" in out
    assert "sshd" not in out  # the golden fixture (an sshd, then an image build) never started
    assert outcome(out, "test_slow_in_the_default_run") == "ERROR", out
    assert "marked integration but it is also slow" in out
    assert outcome(out, "test_heavy_in_the_default_run") == "ERROR", out
    assert "marked heavy but it is integration" in out


def test_a_test_in_no_tier_fails_before_its_fixtures_run(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-n", "0", "-m", "", sample=NO_TIER)
    assert outcome(out, "test_in_no_tier") == "ERROR", out
    assert "test_in_no_tier is in no tier: mark it unit, integration, system, vm or perf" in out
    assert outcome(out, "test_only_slow") == "ERROR", out
    assert "test_only_slow is in no tier: mark it unit, integration, system, vm or perf (slow is not a tier" in out
    assert outcome(out, "test_slow_and_system") == "PASSED", out
    assert "the fixture ran" not in out


def test_the_default_run_is_unit_and_integration_on_every_core(tmp_path: Path) -> None:
    """README's command with nothing added: the two in-process tiers, on xdist's workers; ``vm`` and ``perf`` are
    left to their own runs, and the ``vm`` tests keep to one worker."""
    out = run_pytest(tmp_path)
    assert "xdist workers: None" not in out and "xdist workers: " in out, out
    assert outcome(out, "test_plain") == "PASSED", out
    for name in ("test_times_something", "test_system_starts_a_process", "test_boots_a_replica"):
        assert outcome(out, name) == "NOT RUN", out
    assert outcome(run_pytest(tmp_path, "-m", "perf"), "test_times_something") == "PASSED"
    assert outcome(run_pytest(tmp_path, "-m", "vm"), "test_boots_a_replica") == "PASSED"
