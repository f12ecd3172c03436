"""The report from a run directory recorded from a real main-job run (tests/data/run-sample: its JSON, CSV
and JSONL results, trimmed; no figures), rendered afresh: every PNG opens, every number is marked."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from osfleet.errors import OsfleetError
from osfleet.report import Figure, load, render, write
from tests.conftest import REPO, VENV_BIN

SAMPLE = Path(__file__).parent / "data" / "run-sample"


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_report_renders_every_figure_from_a_recorded_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    paths = render(run)
    pngs = [p for p in paths if p.suffix == ".png"]
    names = {p.name for p in pngs}
    assert {
        "provisioning_time.png",
        "disk_use.png",
        "reset_cdf.png",
        "trajectories_per_minute.png",
        "request_latency.png",
        "aborts_recoveries.png",
        "cost_per_replica_day.png",
    } <= names
    for p in pngs:
        with Image.open(p) as img:
            img.verify()
    md = (run / "report.md").read_text()
    assert "measured here" in md and "(published)" in md
    assert "| disk saving vs full copies |" in md and "88% (published)" in md
    html = (run / "report.html").read_text()
    assert html.count("<img ") == len(pngs) + (1 if (run / "screenshot.png").exists() else 0)
    cost = json.loads((run / "cost.json").read_text())
    assert all(r["binding_resource"] in ("CPU", "RAM", "disk") and r["usd_per_replica_day"] > 0 for r in cost["rows"])


@pytest.mark.system
def test_report_cli_on_a_recorded_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    proc = subprocess.run([str(VENV_BIN / "osfleet"), "report", str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert str(run / "report.html") in proc.stdout


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_load_reads_without_writing_and_old_key_spellings_are_read_as_p50(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    recorded = json.loads((SAMPLE / "disk.json").read_text())["strategies"]["overlay"]
    assert "seconds_per_replica_median" in recorded  # the sample was recorded before the p50 spelling
    before = sorted(p.name for p in run.iterdir())
    results = load(run)
    assert sorted(p.name for p in run.iterdir()) == before
    assert results.disk is not None
    assert results.disk["strategies"]["overlay"]["seconds_per_replica_p50"] == recorded["seconds_per_replica_median"]
    assert results.cost is not None and results.cost.prices["version"] >= 1


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_html_comes_from_the_template_escaped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    disk = json.loads((run / "disk.json").read_text())
    disk["image"] = "<script>alert(1)</script>"
    (run / "disk.json").write_text(json.dumps(disk))
    paths = write(load(run), [Figure("f.png", "A <b>figure</b>")])
    html = (run / "report.html").read_text()
    assert "<script>" not in html and "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>" in html
    assert '<img src="f.png" alt="A &lt;b&gt;figure&lt;/b&gt;">' in html
    assert "<th>strategy</th><th>p50 / replica</th>" in html
    md = (run / "report.md").read_text()
    assert "| strategy | p50 / replica | p95 / replica |" in md and "![A <b>figure</b>](f.png)" in md
    assert paths == [run / "report.md", run / "report.html", run / "f.png"]


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_a_run_directory_without_results_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OsfleetError, match="holds none of the results a report reads"):
        render(tmp_path)


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_a_chaos_run_through_a_gateway_gets_its_section_and_timeline(tmp_path: Path) -> None:
    started = 1_000_000.0
    chaos = {
        "started_at": started, "hosts": 2, "users": 4, "duration_s": 300, "fault_kinds": 1,
        "scored_episodes": 1, "aborted_episodes": 1, "collateral_aborts": 0, "lost_actions": 0,
        "duplicated_actions": 0, "unrecovered_faults": 0, "leaks": {"domains": 0},
        "faults": [{"kind": "kill_qemu", "target": "h1/r-1", "mechanism": "SIGKILL", "injected_at": 30.0,
                    "recovered_after_s": 12.5, "layer": "rebuild"}],
    }  # fmt: skip
    (tmp_path / "chaos.json").write_text(json.dumps(chaos))
    episodes = [
        {"status": "scored", "reward": 1.0, "success": True, "t_start": started + 1, "t_end": started + 9, "steps": 2},
        {"status": "aborted", "t_start": started + 25, "t_end": started + 31, "steps": 1},
    ]
    (tmp_path / "trajectories-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    host = {"replicas": {"ready": 1, "leased": 1}, "disk_allocated_bytes": {"overlays": 2**20}, "cpu_busy_share": 0.5}
    fleet = {"time": started + 2, "hosts": {"h1": {"sample": host}, "h2": {"sample": host}}}  # through a gateway
    (tmp_path / "samples.jsonl").write_text(json.dumps(fleet) + "\n")
    seen = {
        "time": started + 3,
        "hosts": {"h1": True},
        "replicas": [{"id": "h1.r-1", "state": "leased", "generation": 2}],
    }
    (tmp_path / "fleet-samples.jsonl").write_text(json.dumps(seen) + "\n")
    paths = render(tmp_path)
    assert tmp_path / "chaos_timeline.png" in paths and tmp_path / "fleet_states.png" in paths
    Image.open(tmp_path / "chaos_timeline.png").verify()
    md = (tmp_path / "report.md").read_text()
    assert "Faults (osfleet bench chaos)" in md and "| kill_qemu | h1/r-1 | SIGKILL | 30 s | 12.5 s | rebuild |" in md


@pytest.mark.integration  # in-process, but seconds of waits in sum
def test_a_fork_run_and_reset_stages_get_their_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    reset = json.loads((run / "reset.json").read_text())
    reset["snapshot"]["stages_p50_ms"] = {"reset.resume": 4.25, "reset.clock": 3.5}
    (run / "reset.json").write_text(json.dumps(reset))
    fork = {
        "children": 8, "children_ready": 8, "fork_p50_s": 0.071, "fork_p95_s": 0.12, "parent_paused_s": 0.094,
        "save_s": 1.8, "first_child_ready_s": 2.9, "total_s": 3.6, "same_state": True, "diverged": True,
        "machine": {"hostname": "h"},
    }  # fmt: skip
    (run / "fork.json").write_text(json.dumps(fork))
    render(run)
    md = (run / "report.md").read_text()
    assert "| reset.resume | 4.2 ms | measured here |" in md and "| reset.clock | 3.5 ms | measured here |" in md
    assert "## Forks" in md and "| parent paused / saved | 94.00 ms / 1.80 s | measured here |" in md
    assert "| fork: child bring-up p50 / p95 | 71.00 ms / 120.00 ms | measured here |" in md


@pytest.mark.system
def test_a_run_becomes_a_dated_benchmark_page_of_the_docs(tmp_path: Path) -> None:
    """docs/benchmarks/2026-11-29-main-job.md is this command's output on the recorded run, not a hand copy."""
    run = tmp_path / "main-job"
    shutil.copytree(SAMPLE, run)
    pages = tmp_path / "pages"
    proc = subprocess.run(
        [str(VENV_BIN / "osfleet"), "report", str(run), "--benchmark-page", str(pages)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    page = pages / "2026-11-29-main-job.md"
    assert proc.stdout.splitlines()[-1] == str(page)
    text = page.read_text()
    assert text.startswith("# osfleet bench all, 2026-11-29\n") and "![" not in text and ".png" not in text
    assert "| overlay | 0.16 ms | 0.34 ms | 158.0 MiB | 98.4% | measured here |" in text
    assert text == (REPO / "docs" / "benchmarks" / page.name).read_text()


THROUGHPUT = {
    "benchmark": "throughput",
    "minutes": 3.0,
    "hosts": 2,
    "warm_per_host": 6,
    "users": 12,
    "trajectories_per_min": 61.3,
    "scored": 184,
    "successful": 184,
    "aborted": 0,
    "cut_at_end": 9,
    "stages": {"reset": {"p50": 0.4, "p95": 1.2, "share": 0.2}, "steps": {"p50": 3.1, "p95": 6.0, "share": 0.6}},
    "cpu": {
        "core_seconds": {"qemu": 200.0, "host_agents": 60.0, "gateway": 4.0, "libvirt": 20.0, "load_generator": 9.0},
        "cores_busy": 1.9,
        "per_trajectory_s": {"qemu": 1.087, "host_agents": 0.326, "all": 1.9},
    },
    "machine": {"hostname": "unit", "cpus": 2, "memory_gib": 23.4, "accelerator": "TCG", "date": "2026-12-06"},
}


@pytest.mark.integration  # in-process, but seconds of matplotlib
def test_a_throughput_run_gets_its_section_and_prices_a_step_from_the_fleets_own_cpu(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    (run / "throughput.json").write_text(json.dumps(THROUGHPUT))
    render(run)
    md = (run / "report.md").read_text()
    assert "## Throughput" in md and "61.3 scored trajectories a minute (184 in 3 min" in md
    assert "| steps | 3.10 s | 6.00 s | 60% |" in md and "| qemu | 1.087 |" in md
    assert "| scored trajectories a minute (bench throughput) | 61.3 | measured here |" in md
    cost = load(run).cost
    assert cost is not None and cost.step_text is not None and "bench throughput" in cost.step_text
    # the fleet's processes (QEMU, host agents, gateway, libvirt; not the load generator) over the sample's steps
    steps = sum(json.loads(x).get("steps", 0) for x in (run / "trajectories-9713.jsonl").read_text().splitlines())
    assert cost.cpu_seconds_per_step == pytest.approx(284.0 / steps)
    assert all(r["usd_per_1000_steps"] > 0 for r in cost.rows)
