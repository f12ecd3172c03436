"""The shipped ``osworld`` suite, checked without a VM: every task is supported, and 0 -> oracle 1 -> reset 0 holds
when the guest is this machine's shell with the guest's home moved into a temporary folder.

The real check on the office image is ``osfleet tasks validate --suite osworld --json``; this one catches a
broken task, asset or oracle in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from osfleet.errors import GuestFileTooLargeError
from osfleet.protocol.actions import Action, ActionResult
from osfleet.tasks import runner
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.osworld_format.convert import from_osworld
from osfleet.tasks.osworld_format.importer import import_folder
from osfleet.tasks.suites import SUITES, load_suite
from osfleet.tasks.suites.generate import HOME, generate
from tests import fake_guest_reads

pytestmark = pytest.mark.system

SUITE = SUITES["osworld"]
# Tasks whose set-up, getter or oracle needs the running desktop of the office image (a local shell cannot
# stand in for it); ``osfleet tasks validate --suite osworld`` checks them on the image.
NEEDS_THE_DESKTOP = {
    "chrome-open-tabs": "Chrome's open tabs come from DevTools in the guest",
    "multi-page-title-to-note": "its set-up opens the page in Chrome through DevTools",
    "vlc-play-file": "VLC's player state comes from its HTTP interface",
    "vscode-install-vsix": "the oracle and the getter run code-server's `code` command",
    "editor-open-in-mousepad": "the accessibility tree comes from AT-SPI on the guest's session bus",
    "os-shared-folder-sudo": "the oracle uses sudo with the image user's password",
}


class HomeGuest:
    """The guest's shell, played locally: ``/home/user`` is ``home`` (in task files, commands and paths read);
    python3 is the test's interpreter."""

    def __init__(self, home: Path, bin_dir: Path) -> None:
        self.home, self.bin_dir = home, bin_dir

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        command = fake_guest_reads.as_local_user(command)  # (before the home's path changes in its text)
        command = command.replace(HOME, str(self.home))  # getters name the guest's home by its path
        env = {**os.environ, "HOME": str(self.home), "PATH": f"{self.bin_dir}:{os.environ['PATH']}"}
        p = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=timeout, env=env, cwd=self.home
        )
        return {"exit_code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = 60.0) -> bytes:
        data = Path(path.replace(HOME, str(self.home))).read_bytes()
        if len(data) > limit:  # as the real host: never a copy cut short
            raise GuestFileTooLargeError(f"file over {limit / 2**20:g} MiB: {path}")
        return data

    def reset(self, replica_id: str, mode: object = None, unless_pristine: bool = False) -> None:
        """Back to the initial state: an empty home."""
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir()

    def act(self, replica_id: str, actions: list[Any]) -> list[ActionResult]:
        results = []
        for a in actions:
            out = self.shell(replica_id, a.command, a.timeout)
            results.append(ActionResult(type=a.type, ok=out["exit_code"] == 0, seconds=0.0, error=out["stderr"]))
        return results


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AssetStore:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
    return AssetStore.from_settings()


def test_the_suite_has_at_least_40_supported_tasks_over_8_apps(store: AssetStore) -> None:
    report = import_folder(SUITE, store)
    assert report.summary["supported"] == len(report.tasks) >= 40, report.summary
    tasks = load_suite("osworld", store)
    apps = {a for t in tasks for a in t.apps}
    assert len(apps) >= 8 and all(t.task.oracle for t in tasks), apps
    assert set(NEEDS_THE_DESKTOP) <= {t.task.id for t in tasks}


def test_the_suite_uses_each_getter_family_osworld_has() -> None:
    """Chrome, VLC, GIMP, VS Code, Thunderbird, PDF, images and the accessibility tree: at least one task each."""
    evaluators = [json.loads(p.read_text())["evaluator"] for p in SUITE.glob("*.json")]
    used = {json.dumps(e) for e in evaluators}
    for marker in (
        '"type": "bookmarks"',
        '"type": "open_tabs_info"',
        '"type": "vlc_config"',
        '"type": "vlc_playing_info"',
        '"type": "gimp_config_file"',
        '"check_json_settings"',
        '"check_thunderbird_prefs"',
        '"compare_pdfs"',
        '"compare_images"',
        '"type": "accessibility_tree"',
    ):
        assert any(marker in e for e in used), marker


def test_the_committed_suite_is_what_the_generator_writes(tmp_path: Path) -> None:
    generate(tmp_path / "fresh")
    committed = sorted(p.name for p in SUITE.glob("*.json"))
    assert committed == sorted(p.name for p in (tmp_path / "fresh").glob("*.json"))
    for name in committed:
        assert json.loads((SUITE / name).read_text()) == json.loads((tmp_path / "fresh" / name).read_text()), name


def guest_and_task(name: str, store: AssetStore, tmp_path: Path) -> tuple[HomeGuest, Any, dict[str, Any]]:
    store.add_bundle(SUITE)
    home = tmp_path / "home"
    data = json.loads((SUITE / f"{name}.json").read_text().replace(HOME, str(home)))
    task = from_osworld(data, store)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return HomeGuest(home, bin_dir), task, data


@pytest.mark.parametrize("name", sorted(p.stem for p in SUITE.glob("*.json")))
def test_each_task_scores_0_then_1_after_its_oracle_then_0_after_a_reset(
    name: str, store: AssetStore, tmp_path: Path
) -> None:
    if name in NEEDS_THE_DESKTOP:
        pytest.skip(f"checked on the office image only: {NEEDS_THE_DESKTOP[name]}")
    guest, task, data = guest_and_task(name, store, tmp_path)
    home = guest.home

    def reset() -> None:
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        runner.apply_setup(guest, "r-1", task)  # type: ignore[arg-type]

    def reward() -> float:
        return runner.evaluate(guest, "r-1", task).reward  # type: ignore[arg-type]

    reset()
    assert reward() == 0.0
    for action in data["osfleet_oracle"]:
        out = guest.shell("r-1", action["command"], action.get("timeout", 30))
        assert out["exit_code"] == 0, out["stderr"]
    after = runner.evaluate(guest, "r-1", task)  # type: ignore[arg-type]
    assert after.reward == 1.0, [c.detail for c in after.criteria]
    reset()
    assert reward() == 0.0


def test_validating_the_suite_without_its_image_says_how_to_build_it(tmp_path: Path) -> None:
    env = {**os.environ, "OSFLEET_HOME": str(tmp_path / "empty-home")}
    osfleet = Path(sys.executable).parent / "osfleet"
    p = subprocess.run(
        [str(osfleet), "tasks", "validate", "--suite", "osworld", "--json"], capture_output=True, text=True, env=env
    )
    assert p.returncode == 1 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert (
        line.startswith("osfleet: error: suite osworld runs on golden-")
        and "--recipe" in line
        and "office.yaml" in line
    )


def test_validate_times_each_phase(store: AssetStore, tmp_path: Path) -> None:
    guest, task, data = guest_and_task("calc-total-row", store, tmp_path)
    task = task.model_copy(update={"oracle": TypeAdapter(list[Action]).validate_python(data["osfleet_oracle"])})
    v = runner.validate(guest, "r-1", task)  # type: ignore[arg-type]
    assert v.ok, v.problem
    assert list(v.phases) == ["reset", "evaluate_initial", "oracle", "evaluate_oracle", "reset_again", "evaluate_reset"]
