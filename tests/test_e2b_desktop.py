"""e2b-desktop 2.7.2, unchanged, in a venv of its own (what an E2B user installs), against ``osfleet e2b serve``
over a real host agent whose guest is a stand-in (tests/e2b_guest.py): E2B's documented flow (create with its
Xvfb/XFCE start-up, screenshot, click, write, press, commands, files, kill) and a wrong key. The same flow on a real
replica: tests/test_e2b_vm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
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


def test_e2b_desktops_live_view_url_shows_the_desktop_for_its_password(desktop_python: str, tmp_path: Path) -> None:
    stack = Served(tmp_path)
    script = tmp_path / "stream.py"
    script.write_text(e2b_desktop_venv.STREAM)
    env = e2b_desktop_venv.environment(tmp_path, stack.url, ALICE)
    with subprocess.Popen(
        [desktop_python, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as streaming:
        try:
            assert streaming.stdout is not None and streaming.stdin is not None and streaming.stderr is not None
            given = urlsplit(json.loads(streaming.stdout.readline())["url"])  # https://6080-<id>.<domain>/vnc.html?...
            password = parse_qs(given.query)["password"][0]
            page = httpx.get(f"{stack.url}{given.path}?{given.query}", headers={"Host": given.netloc})
            frame = httpx.get(f"{stack.url}/frame.jpg", params={"password": password}, headers={"Host": given.netloc})
            streaming.stdin.close()
            stopped = streaming.stdout.readline()
            assert streaming.wait(120) == 0, streaming.stderr.read()
        finally:
            if streaming.poll() is None:
                streaming.kill()
            stack.stop()
    assert given.netloc.startswith("6080-") and page.status_code == 200 and b"frame.jpg" in page.content
    assert frame.status_code == 200 and frame.content[:2] == b"\xff\xd8"  # a JPEG of the screen
    assert json.loads(stopped) == {"stopped": True} and stack.leased() == []
    # x11vnc, noVNC and the port check were answered here; its mkdir of ~/.vnc is an ordinary command
    assert [x.command for x in stack.guest.launched] == ["mkdir -p ~/.vnc"]
