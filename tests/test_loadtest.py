"""Locust scenarios for real, headless and short, against a real host agent on loopback (TCG replicas); and
both ways of naming a scenario (the installed package's file, the checkout's thin locustfile) without VMs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet import loadtest
from osfleet.bench.load import LocalAgent, run_locust
from osfleet.loadtest import SCENARIOS, locustfile
from osfleet.vm.images import GoldenImage
from tests.conftest import REPO

USERS = {"trajectories": "Agent", "bringup": "Bringup"}


@pytest.mark.system
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_packaged_and_checkout_locustfiles_offer_the_same_user(scenario: str, tmp_path: Path) -> None:
    for path in (locustfile(scenario), REPO / "loadtest" / f"{scenario}.py"):
        proc = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(path), "--list"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["Available", "Users:", USERS[scenario]]


@pytest.mark.unit
def test_the_packaged_scenarios_are_files_of_the_package() -> None:
    package = Path(loadtest.__file__).parent
    assert {locustfile(s) for s in SCENARIOS} == {package / f"{s}.py" for s in SCENARIOS}
    with pytest.raises(ValueError, match="no Locust scenario 'nope'"):
        locustfile("nope")


@pytest.fixture
def agent(golden: GoldenImage, tmp_path: Path, no_leftovers: None) -> Iterator[LocalAgent]:
    a = LocalAgent(warm=2, log=tmp_path / "agent.log", image=golden.name)
    try:
        a.wait_ready(2, 300)
        yield a
    finally:
        a.stop()


@pytest.mark.vm
def test_trajectories_and_bringup_produce_their_results(agent: LocalAgent, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_locust(
        "trajectories",
        agent.url,
        agent.token,
        run_dir,
        2,
        "45s",
        ["--tasks", "cli-write-note,gui-terminal-command"],
        spawn_rate=2,
    )
    rows = [json.loads(x) for f in run_dir.glob("trajectories-*.jsonl") for x in f.read_text().splitlines()]
    scored = [r for r in rows if r["status"] == "scored"]
    assert scored, rows
    assert all(r["reward"] == 1.0 for r in scored), [r for r in scored if r["reward"] != 1.0]
    stats = (run_dir / "trajectories_stats.csv").read_text()
    for name in ("reset", "step", "evaluate", "trajectory"):
        assert f",{name}," in stats
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and samples[-1]["disk_allocated_bytes"]["golden"] > 0 and "memory_used_bytes" in samples[-1]

    run_locust("bringup", agent.url, agent.token, run_dir, 1, "5m", ["--replicas", "2"])
    (b,) = [json.loads(x) for x in (run_dir / "bringup.jsonl").read_text().splitlines()]
    assert b["requested"] == 2 and b["ready"] == 2 and b["all_ready_seconds"] > 0
    assert all(r["bringup_seconds"] > 0 for r in b["replicas"])

    from osfleet.report import render

    paths = render(run_dir)
    assert (run_dir / "trajectories_per_minute.png") in paths and (run_dir / "request_latency.png") in paths


@pytest.mark.vm
def test_trajectories_in_master_worker_mode(agent: LocalAgent, tmp_path: Path) -> None:
    env = {**os.environ, "OSFLEET_API_TOKEN": agent.token, "OSFLEET_RUN_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "trajectories.py")]  # as the README shows
    port = str(_port())
    worker = subprocess.Popen(
        base + ["--worker", "--master-port", port], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        master = subprocess.run(
            base
            + [
                "--master",
                "--master-bind-port",
                port,
                "--expect-workers",
                "1",
                "--headless",
                "-u",
                "1",
                "-r",
                "1",
                "-t",
                "40s",
                "--host",
                agent.url,
                "--tasks",
                "cli-write-note",
                "--exit-code-on-error",
                "0",
                "--csv",
                str(tmp_path / "mw"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert master.returncode == 0, master.stderr[-2000:]
    finally:
        worker.wait(timeout=60)
    assert ",trajectory," in (tmp_path / "mw_stats.csv").read_text()
    assert list(tmp_path.glob("trajectories-*.jsonl"))


def _port() -> int:
    from osfleet.bench.load import free_port

    return free_port()
