"""A test run ended with SIGTERM still tears its fixtures down (they hold replicas, mounts and servers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.system

INNER = """
import time
import pytest

@pytest.fixture
def held(tmp_path_factory):
    yield
    open({done!r}, "w").write("torn down")

@pytest.mark.system
def test_long(held):
    open({started!r}, "w").write("started")
    time.sleep(120)
"""


def test_a_terminated_run_tears_its_fixtures_down(tmp_path: Path) -> None:
    started, done = tmp_path / "started", tmp_path / "done"
    test = tmp_path / "test_inner.py"
    test.write_text(INNER.format(started=str(started), done=str(done)))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(test)]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while not started.exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        assert started.exists(), proc.stdout.read().decode() if proc.poll() is not None else "inner test never started"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert done.read_text() == "torn down", out
    assert proc.returncode == 2, out  # pytest's "interrupted"
