"""e2b-desktop 2.7.2, unchanged, in a venv of its own (what an E2B user installs), against ``osfleet e2b serve``
over a real host agent whose guest is a stand-in (tests/e2b_guest.py): E2B's documented flow (create with its
Xvfb/XFCE start-up, screenshot, click, write, press, commands, files, kill) and a wrong key. The same flow on a real
replica: tests/test_e2b_vm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import e2b_desktop_venv
from tests.e2b_guest import ALICE, Look, Served

pytestmark = [pytest.mark.system, pytest.mark.slow]  # a venv from the package index, and its python as a process

NOTE = "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"


@pytest.fixture(scope="module")
def desktop_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return e2b_desktop_venv.make(tmp_path_factory.mktemp("e2b-desktop"))


def test_e2b_desktops_flow_runs_unchanged_against_the_server(desktop_python: str, tmp_path: Path) -> None:
    stack = Served(tmp_path)
    stack.guest.programs["cat ~/notes/todo.txt"] = [Look(b"buy milk\n")]
    stack.guest.programs["id -un"] = [Look(b"user\n")]
    try:
        done = e2b_desktop_venv.run_flow(desktop_python, tmp_path, stack.url, ALICE, NOTE, 0)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stack.stop()
    assert seen["wrong_key"] == "AuthenticationException"
    assert seen["png"] == "89504e47" and seen["size"] == [1920, 1080] and seen["cursor"] == [200, 200]
    assert seen["cat"] == "buy milk\n" and seen["read"] == "hello from e2b" and seen["who"] == "user"
    assert seen["running_after_kill"] is False and stack.leased() == []
    timeline = stack.guest.timeline()
    assert "@200,200" in timeline and "B+left" in timeline and "+ret" in timeline
    # its start-up (Xvfb, xdpyinfo, startxfce4, the pgrep check) and its input were answered, not run in the guest
    assert [x.command for x in stack.guest.launched] == ["cat ~/notes/todo.txt", "id -un"]
