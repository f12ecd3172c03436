"""``chrome_open_tabs`` right after a task's ``google-chrome`` launch: the launch's tab is the one closed.

OSWorld's browser tasks launch ``google-chrome`` and then open their tabs, closing the tab that was open before.
Under emulation the launcher takes seconds to hand its command line to the running browser, and the browser
more to open the window: the query script waits for a launch in flight to land before it lists the tabs. Here
the processes are real (a stand-in browser on the profile, a ``google-chrome`` script still running) and the
browser's tab list is played by a stub that grows once the launcher has exited.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.tasks.osworld_format.guest import query as q

pytestmark = [
    pytest.mark.system,
    pytest.mark.xdist_group("chrome"),
]  # one xdist worker: the handover check scans the machine for google-chrome launchers


@pytest.fixture
def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A running stand-in browser on a profile of this test (argv[0] ``chromium``, ``--user-data-dir``)."""
    profile = tmp_path / "google-chrome"
    monkeypatch.setattr(q, "PROFILE", str(profile))
    argv = ["chromium", "-c", "sleep 60; true", "x", f"--user-data-dir={profile}"]
    browser = subprocess.Popen(argv, executable="/bin/bash")
    time.sleep(0.1)
    try:
        yield profile
    finally:
        browser.kill()
        browser.wait()


class Tabs:
    """The browser session's ``Target.getTargets``: one tab appears ``delay`` s after ``launcher`` exits."""

    def __init__(self, launcher: subprocess.Popen[bytes] | None, delay: float) -> None:
        self.launcher, self.delay, self.exited = launcher, delay, None if launcher else 0.0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert method == "Target.getTargets"
        if self.exited is None and self.launcher is not None and self.launcher.poll() is not None:
            self.exited = time.monotonic()
        shown = self.exited is not None and self.launcher is not None and time.monotonic() > self.exited + self.delay
        return {"targetInfos": [{"type": "page", "targetId": "NTP", "url": "chrome://newtab/"}] if shown else []}


def test_the_browser_itself_is_no_launch_in_flight(profile: Path) -> None:
    assert q._chrome_launchers() == []
    t0 = time.monotonic()
    assert q._pages_after_launches(Tabs(None, 0), q.Deadline(60)) == []
    assert time.monotonic() - t0 < 1  # nothing launched: nothing waited for


def test_a_launch_in_flight_lands_before_the_tabs_are_listed(profile: Path, tmp_path: Path) -> None:
    script = tmp_path / "google-chrome"
    script.write_text("sleep 1.5\n")
    launcher = subprocess.Popen(["sh", str(script), "--remote-debugging-port=1337"])
    try:
        time.sleep(0.1)
        assert q._chrome_launchers() == [launcher.pid]
        t0 = time.monotonic()
        pages = q._pages_after_launches(Tabs(launcher, 1.0), q.Deadline(60))
        took = time.monotonic() - t0
    finally:
        launcher.kill()
        launcher.wait()
    assert [p["targetId"] for p in pages] == ["NTP"]  # the launch's tab, which chrome_open_tabs then closes
    assert 2.0 < took < 10, took


def test_a_launch_whose_window_never_comes_is_waited_for_boundedly(profile: Path, tmp_path: Path) -> None:
    script = tmp_path / "google-chrome"
    script.write_text("sleep 0.5\n")
    launcher = subprocess.Popen(["sh", str(script)])
    t0 = time.monotonic()
    pages = q._pages_after_launches(Tabs(launcher, 10**6), q.Deadline(6))
    launcher.wait()
    assert pages == [] and time.monotonic() - t0 < 4  # a third of what is left, not all of it
