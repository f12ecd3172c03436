"""``osfleet bench sandbox``: what an evaluation costs in the jail, with another checkout's sandbox beside it.

The before/after figures of the jail's docs come from ``--against`` (another checkout's Python); a Python that
cannot run that checkout's sandbox must say so in one line, not end the bench with a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # starts the evaluation jail's zygote (bubblewrap) and commands

OSFLEET = [sys.executable, "-m", "osfleet"]


def test_against_this_checkout_times_both_sandboxes_in_the_same_rounds(tmp_path: Path) -> None:
    out = tmp_path / "sandbox.json"
    args = ["bench", "sandbox", "--rounds", "2", "--fresh-rounds", "1", "--against", sys.executable, "--json"]
    proc = subprocess.run([*OSFLEET, *args, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result == json.loads(out.read_text())
    assert result["against"]["python"] == sys.executable and result["network_isolated"] is True
    for func in ("compare_table", "check_json", "check_python_file_by_test_suite"):
        assert result[func]["sandbox_s"]["n"] == 2 and result[func]["against_sandbox_s"]["n"] == 2


def test_a_python_that_cannot_run_the_other_sandbox_is_one_line() -> None:
    args = ["bench", "sandbox", "--rounds", "1", "--fresh-rounds", "1", "--against", "/bin/false"]
    proc = subprocess.run([*OSFLEET, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("osfleet: error: --against /bin/false: its sandbox ended")
