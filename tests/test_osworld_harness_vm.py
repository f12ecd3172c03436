"""OSWorld's own harness on osfleet, for real: desktop-env's ``DesktopEnv`` (installed with everything it declares,
``scripts/setup-osworld-harness``) leases office-image replicas from a host agent through ``osfleet.osworld``'s
provider, runs OSWorld's set-up (an osfleet asset URL downloaded by OSWorld's controller, VLC and Chrome started),
observes (PNG, accessibility tree), executes an action and scores with OSWorld's own getters and metrics: 0 at s0,
1 after the task's oracle, as ``osfleet tasks validate`` requires of the same tasks. VLC's getter goes through the
relay of its HTTP port (``osfleet.osworld.guest_http``), Chrome's set-up and getter through a tunnel to its
DevTools (``Session.forward``); the first task's actions are recorded by OSWorld's controller as an MP4."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.bench.load import LocalAgent
from osfleet.vm.images import GoldenImage
from tests.conftest import local_agent

pytestmark = [pytest.mark.vm, pytest.mark.heavy]  # ~10-20 min here: out of CI's slow run (.ci/run)
REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "osfleet" / "tasks" / "suites" / "osworld"
TASKS = ["os-archive-folder", "calc-total-row", "vlc-play-file", "chrome-open-tabs"]


def harness_python() -> str:
    """The harness's python, installed on first use (~7 GiB, a few minutes once per machine; progress on stderr)."""
    script = REPO / "scripts" / "setup-osworld-harness"
    out = subprocess.run([script, "--print-python"], stdout=subprocess.PIPE, text=True, timeout=3600)
    python = out.stdout.strip()
    assert os.path.exists(python), f"no OSWorld harness at {python!r}: scripts/setup-osworld-harness failed"
    return python


@pytest.fixture(scope="module")
def agent(office_image: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    with local_agent(office_image, tmp_path_factory.mktemp("harness"), 1) as served:
        yield served


def test_osworlds_desktop_env_runs_tasks_on_osfleet_replicas(agent: tuple[LocalAgent, Path], tmp_path: Path) -> None:
    served, token = agent
    tasks = [json.loads((SUITE / f"{name}.json").read_text()) for name in TASKS]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    env = {**os.environ, "OSFLEET_URL": served.url, "OSFLEET_TOKEN_FILE": str(token), "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [harness_python(), str(REPO / "tests" / "osworld_harness_driver.py"), str(tmp_path / "tasks.json"),
         str(tmp_path / "cache"), "--record"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    assert [r["id"] for r in rows] == TASKS
    first, *rest = rows
    assert first == {"id": TASKS[0], "png": True, "a11y": True, "s0": 0, "after_oracle": 1, "mp4": True}, first
    for row in rest:
        assert row == {"id": row["id"], "png": True, "a11y": True, "s0": 0, "after_oracle": 1}, row
    # OSWorld's controller downloaded the asset URL through osfleet.osworld.assets into its own cache
    assert any(p.name.endswith("sales.xlsx") for p in (tmp_path / "cache").rglob("*"))
