"""``osfleet report`` on every run directory a README command sequence makes: it renders, or says in one line
what is missing (exit != 0, no traceback).

Cheap sequences run for real (``osfleet bench disk --out``); the Locust sequence needs a host agent with a
booted replica, so it is marked ``vm``/``slow`` and runs the README's commands as typed, with the time
limit that cut episodes short (the ``KeyError: 'status'`` of issue 18). Directories that only a long run
makes (a chaos run's ``faults.jsonl``, a half-finished run) are built here in the shape those commands write.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from osfleet.bench.load import free_port
from osfleet.report import load
from tests.conftest import REPO, VENV_BIN

SAMPLE = Path(__file__).parent / "data" / "run-sample"
OSF = str(VENV_BIN / "osfleet")


def _report(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OSF, "report", str(run_dir)], capture_output=True, text=True, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.system
def test_bench_disk_with_out_then_report(tmp_path: Path) -> None:
    run = tmp_path / "disk-run"
    done = subprocess.run(
        [OSF, "bench", "disk", "--replicas", "3", "--json", "--out", str(run / "disk.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    assert "provisioning_time.png" in rendered.stdout and (run / "report.html").exists()


@pytest.mark.system
def test_episodes_cut_by_locusts_time_limit_are_counted_as_interrupted(tmp_path: Path) -> None:
    """A run directory as Locust left it before the fix: the last episode of each user has no status."""
    run = tmp_path / "locust-run"
    shutil.copytree(SAMPLE, run, ignore=shutil.ignore_patterns("disk.json", "reset.json", "boot.json", "run.json"))
    traj = next(run.glob("trajectories-*.jsonl"))
    cut = {"task": "cli-write-note", "policy": "oracle", "replica": "r-1", "t_start": 1795957300.0, "steps": 0}
    with open(traj, "a") as f:
        f.write(json.dumps({**cut, "t_end": 1795957310.0}) + "\n")
        f.write(json.dumps({**cut, "status": "interrupted", "t_end": 1795957311.0}) + "\n")
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    md = (run / "report.md").read_text()
    assert "2 cut short by the run's end" in md


@pytest.mark.system
def test_a_half_finished_run_renders_what_it_has(tmp_path: Path) -> None:
    """Killed mid-run: boot.json written, the trajectories file's last line half written."""
    run = tmp_path / "half"
    run.mkdir()
    shutil.copy(SAMPLE / "boot.json", run)
    lines = (next(SAMPLE.glob("trajectories-*.jsonl"))).read_text().splitlines()
    (run / "trajectories-1.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    assert len(load(run).load.trajectories) == 3


@pytest.mark.system
@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({}, "holds none of the results a report reads"),
        ({"faults.jsonl": '{"event": "fault", "kind": "kill_qemu"}\n'}, "holds none of the results a report reads"),
        ({"disk.json": '{"strategies": '}, "disk.json is not valid JSON"),
        ({"trajectories-1.jsonl": '{"a": 1}\nnot json\n{"b": 2}\n'}, "is not valid JSON lines"),
    ],
)
def test_a_run_directory_with_nothing_to_show_is_one_line(tmp_path: Path, files: dict[str, str], says: str) -> None:
    """An empty directory, ``osfleet chaos run --run-dir D`` (faults only), a broken file."""
    run = tmp_path / "run"
    run.mkdir()
    for name, text in files.items():
        (run / name).write_text(text)
    assert says in _one_line_error(_report(run))


@pytest.mark.system
def test_a_path_that_is_not_a_run_directory_is_refused_by_the_command_line(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x")
    for path, says in ((f, "is a file"), (tmp_path / "missing", "does not exist")):
        done = _report(path)
        assert done.returncode == 2 and "Traceback" not in done.stderr  # click's usage error names the problem
        assert says in done.stderr.strip().splitlines()[-1]


@pytest.mark.vm
@pytest.mark.slow
def test_locust_alone_through_a_host_agent_then_report(tmp_path: Path) -> None:
    """README: a host agent, ``locust -f loadtest/trajectories.py ... --headless -t 60s --run-dir D``, then
    ``osfleet report D`` (the time limit cuts the running episodes)."""
    run = tmp_path / "locust"
    token = "t-" + os.urandom(8).hex()
    port = free_port()
    env = {**os.environ, "OSFLEET_API_TOKEN": token}
    agent = subprocess.Popen(
        [OSF, "host", "serve", "--port", str(port), "--warm", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        ready = False
        while time.monotonic() < deadline and not ready:
            probe = subprocess.run(
                ["curl", "-sf", "-H", f"Authorization: Bearer {token}", f"{url}/v1/replicas"],
                capture_output=True,
                text=True,
            )
            ready = probe.returncode == 0 and any(r["state"] == "ready" for r in json.loads(probe.stdout or "[]"))
            time.sleep(2)
        assert ready, "the agent's warm replica did not become ready"
        locust = subprocess.run(
            [str(VENV_BIN / "locust"), "-f", "loadtest/trajectories.py", "--host", url, "--token", token,
             "--policy", "oracle", "--headless", "-u", "1", "-t", "60s", "--run-dir", str(run)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
        assert locust.returncode in (0, 1), locust.stderr[-2000:]
    finally:
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=300)
        subprocess.run(
            [sys.executable, "-m", "osfleet", "replicas", "down", "--all", "--force"], capture_output=True, check=False
        )
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    assert "Trajectories:" in (run / "report.md").read_text()


@pytest.mark.vm
@pytest.mark.slow
def test_bench_infra_with_out_then_report(tmp_path: Path) -> None:
    """README: ``osfleet bench infra --hosts N --out RUN/infra.json`` then ``osfleet report RUN``."""
    run = tmp_path / "infra-run"
    done = subprocess.run(
        [OSF, "bench", "infra", "--hosts", "1", "--out", str(run / "infra.json")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    assert "Infrastructure as code" in (run / "report.md").read_text()


@pytest.mark.vm
@pytest.mark.slow
def test_bench_chaos_then_report(tmp_path: Path) -> None:
    """README: ``osfleet bench chaos ... --run-dir D`` (its shortest run) then ``osfleet report D``."""
    run = tmp_path / "chaos-run"
    done = subprocess.run(
        [
            OSF,
            "bench",
            "chaos",
            "--hosts",
            "1",
            "--warm",
            "1",
            "--users",
            "1",
            "--duration",
            "30",
            "--run-dir",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rendered = _report(run)
    assert rendered.returncode == 0, rendered.stderr
    assert "Faults (osfleet bench chaos)" in (run / "report.md").read_text()
