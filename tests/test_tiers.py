"""The test tiers' rules (tests/conftest.py): a ``unit`` test that opens libvirt fails, even from a thread that
swallows the error; markers that contradict ``unit`` fail before any fixture runs; a test in no tier (``slow``
alone is none) fails before its fixtures run; ``perf`` is out of the default run. Each case is a pytest run of its
own on a sample file, as a developer would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration  # each case is a pytest run in a subprocess

SAMPLE = """
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
    pass


@pytest.fixture
def started() -> None:
    print("the fixture ran")


def test_in_no_tier(started) -> None:
    pass


@pytest.mark.slow
def test_only_slow(started) -> None:
    pass


@pytest.mark.slow
@pytest.mark.unit
def test_slow_and_unit() -> None:
    pass
"""


def run_pytest(tmp_path: Path, *args: str) -> str:
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-rA", "-q", *args, str(sample)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.stdout


def outcome(out: str, name: str) -> str:
    """The test's outcome from ``-rA``'s summary: FAILED, ERROR (set-up or teardown), PASSED or NOT RUN."""
    words = {line.split()[0] for line in out.splitlines() if line.endswith(f"::{name}") or f"::{name} - " in line}
    return next((w for w in ("FAILED", "ERROR", "PASSED") if w in words), "NOT RUN")


def test_unit_tests_cannot_reach_a_hypervisor(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-m", "unit")
    assert outcome(out, "test_opens_qemu") == "FAILED", out
    assert "a unit test opened libvirt at 'qemu:///system'" in out
    assert outcome(out, "test_swallows_it_in_a_thread") == "ERROR", out  # failed at teardown
    assert outcome(out, "test_uses_the_test_driver") == "PASSED", out


def test_contradicting_markers_fail_before_fixtures_run(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-m", "unit")
    assert outcome(out, "test_says_two_tiers") == "ERROR", out
    assert "marked unit but it is also integration" in out
    assert outcome(out, "test_asks_for_a_vm_fixture") == "ERROR", out
    assert "marked unit but it is also golden" in out
    assert "sshd" not in out  # the golden fixture (an sshd, then an image build) never started


def test_a_test_in_no_tier_fails_before_its_fixtures_run(tmp_path: Path) -> None:
    out = run_pytest(tmp_path)
    assert outcome(out, "test_in_no_tier") == "ERROR", out
    assert "test_in_no_tier is in no tier: mark it unit, integration, vm or perf" in out
    slow = run_pytest(tmp_path, "-m", "slow")
    assert outcome(slow, "test_only_slow") == "ERROR", slow
    assert "test_only_slow is in no tier: mark it unit, integration, vm or perf (slow is not a tier" in slow
    assert outcome(slow, "test_slow_and_unit") == "PASSED", slow
    assert "the fixture ran" not in out + slow


def test_perf_is_out_of_the_default_run(tmp_path: Path) -> None:
    out = run_pytest(tmp_path)
    assert outcome(out, "test_plain") == "PASSED", out
    assert outcome(out, "test_times_something") == "NOT RUN", out
    assert outcome(run_pytest(tmp_path, "-m", "perf"), "test_times_something") == "PASSED"
