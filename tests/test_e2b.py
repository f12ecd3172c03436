"""``osfleet e2b serve`` driven by E2B's own SDK (``e2b`` 2.63.0, unchanged, pointed at it by E2B_API_URL and
E2B_SANDBOX_URL) over a real host agent with two clients; only the desktop's guest is a stand-in (tests/e2b_guest.py:
its input events are recorded, its bash is a script of what each command prints). e2b-desktop itself drives the same
stack in tests/test_e2b_desktop.py, and a real replica in tests/test_e2b_vm.py."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import (
    AuthenticationException,
    FileNotFoundException,
    SandboxException,
    SandboxNotFoundException,
)
from PIL import Image

from tests.e2b_guest import ALICE, BOB, Look, Served

pytestmark = pytest.mark.integration  # in-process, servers in threads on loopback; seconds in sum


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    stack = Served(tmp_path)
    monkeypatch.setenv("E2B_API_URL", stack.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", stack.url)
    monkeypatch.setenv("E2B_API_KEY", ALICE)
    yield stack
    stack.stop()


@pytest.fixture
def sandbox(served: Served) -> Iterator[Sandbox]:
    box = Sandbox.create(timeout=300)
    yield box
    box.kill()


# --- keys and tenants ----------------------------------------------------------------------------------------------
def test_a_wrong_key_is_refused_with_401_and_takes_no_desktop(served: Served) -> None:
    with pytest.raises(AuthenticationException, match="401"):
        Sandbox.create(api_key="not-a-client-token")
    answer = httpx.get(f"{served.url}/v2/sandboxes")  # no key at all
    assert answer.status_code == 401 and "X-API-KEY" in answer.json()["message"]
    assert served.leased() == []


def test_a_sandbox_is_a_lease_of_its_key_and_kill_gives_it_back(served: Served) -> None:
    box = Sandbox.create(timeout=300, metadata={"run": "7"})
    assert len(served.leased()) == 1
    info = box.get_info()
    assert info.sandbox_id == box.sandbox_id and info.metadata == {"run": "7"} and info.state.value == "running"
    assert [s.sandbox_id for s in Sandbox.list().next_items()] == [box.sandbox_id]
    assert box.is_running()
    box.kill()
    assert served.leased() == []
    assert not box.is_running()  # the daemon answers "not found" to its old token
    with pytest.raises(SandboxNotFoundException):
        box.get_info()


def test_another_clients_sandbox_is_404_on_every_route(served: Served) -> None:
    box = Sandbox.create(timeout=300)
    try:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(box.sandbox_id, api_key=BOB)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(box.sandbox_id, api_key=BOB)
        assert Sandbox.kill(box.sandbox_id, api_key=BOB) is False  # the SDK's reading of 404
        assert Sandbox.list(api_key=BOB).next_items() == []
        for method, path in [("POST", "/timeout"), ("POST", "/pause"), ("POST", "/fork")]:
            answer = httpx.request(
                method, f"{served.url}/sandboxes/{box.sandbox_id}{path}", headers={"X-API-KEY": BOB}, json={}
            )
            assert answer.status_code == 404, (path, answer.text)
        daemon = httpx.get(f"{served.url}/files", params={"path": "/tmp/x"}, headers={"E2b-Sandbox-Id": box.sandbox_id})
        assert daemon.status_code == 401  # the daemon wants the sandbox's own access token
        assert box.is_running() and len(served.leased()) == 1
    finally:
        box.kill()


# --- commands ------------------------------------------------------------------------------------------------------
def test_a_command_runs_in_the_guest_and_answers_its_output_and_status(served: Served, sandbox: Sandbox) -> None:
    served.guest.programs["cat ~/notes/todo.txt"] = [Look(b"buy milk\n")]
    served.guest.programs["false"] = [Look(b"", b"nope\n", 3)]
    result = sandbox.commands.run("cat ~/notes/todo.txt", envs={"GREETING": "it's me"}, cwd="notes")
    assert (result.stdout, result.stderr, result.exit_code) == ("buy milk\n", "", 0)
    ran = served.guest.launched[-1]
    assert ran.command == "cat ~/notes/todo.txt" and ran.cwd == "/home/user/notes"
    assert "GREETING='it'\"'\"'s me'" in ran.env  # quoted for the runner's shell, whatever the value holds
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("false")
    assert (failed.value.exit_code, failed.value.stderr) == (3, "nope\n")
    assert served.guest.removed == [x.nonce for x in served.guest.launched]  # each command's folder, once it ended


def test_a_background_command_streams_as_it_prints_and_dies_by_its_signal(served: Served, sandbox: Sandbox) -> None:
    served.guest.programs["./serve"] = [
        Look(b"", status=None),
        Look(b"one\n", status=None),
        Look(b"one\n", b"warn\n", None),
        Look(b"one\ntwo\n", b"warn\n", None),
    ]
    handle = sandbox.commands.run("./serve", background=True)
    assert [p.pid for p in sandbox.commands.list()] == [handle.pid]
    seen = []
    for out, err, _ in handle:
        seen.append(out or err)
        if len(seen) == 3:
            break
    assert seen == ["one\n", "warn\n", "two\n"]  # in the order it printed, each once
    assert sandbox.commands.kill(handle.pid) is True
    ended = sandbox.commands.connect(handle.pid)  # a second follower sees the end
    with pytest.raises(CommandExitException) as killed:
        ended.wait()
    assert killed.value.exit_code == 137
    assert sandbox.commands.list() == []
    assert sandbox.commands.kill(handle.pid) is False  # gone: the SDK's reading of NOT_FOUND


def test_a_sleep_line_starts_at_once_runs_in_the_background_and_dies_by_its_signal(
    served: Served, sandbox: Sandbox
) -> None:
    """``sleep S`` is answered here (e2b-desktop waits with it), but as a process: it answered nothing until S had
    passed, so ``sleep 300`` in the background timed out and could not be killed."""
    t = time.monotonic()
    slow = sandbox.commands.run("sleep 300", background=True, request_timeout=20)
    assert time.monotonic() - t < 10 and [p.pid for p in sandbox.commands.list()] == [slow.pid]
    assert sandbox.commands.kill(slow.pid) is True
    with pytest.raises(CommandExitException) as killed:
        slow.wait()
    assert killed.value.exit_code == 137 and sandbox.commands.list() == []
    t = time.monotonic()
    assert sandbox.commands.run("sleep 0.5").exit_code == 0
    assert time.monotonic() - t >= 0.5
    assert sandbox.commands.list() == [] and served.guest.launched == []  # none of it ran in the guest


def test_nothing_runs_as_root_and_stdin_is_refused_with_the_reason(served: Served, sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="never as root"):
        sandbox.commands.run("id", user="root")
    with pytest.raises(SandboxException, match="stdin"):
        sandbox.commands.run("cat", stdin=True)
    assert served.guest.launched == []
    sandbox.commands.run("id -un", user="user")  # the desktop user, named, is who runs it anyway
    assert served.guest.launched[-1].command == "id -un"


# --- e2b-desktop's lines -------------------------------------------------------------------------------------------
def test_e2b_desktops_lines_are_the_fleets_capture_and_input_not_commands(served: Served, sandbox: Sandbox) -> None:
    run = sandbox.commands.run
    xvfb = run("Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix", background=True)
    xvfb.disconnect()
    assert run("xdpyinfo -display :0").exit_code == 0
    run("startxfce4", background=True).disconnect()
    assert run("pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null")
    assert "1920x1080" in run("xrandr").stdout
    run("xdotool mousemove --sync 200 150")
    run("xdotool click 1")
    run("xdotool click --repeat 2 1")
    run("xdotool click 3")
    run("xdotool click --repeat 2 5")
    run("xdotool mousedown 1")
    run("xdotool mouseup 1")
    assert run("xdotool getmouselocation").stdout.startswith("x:200 y:150 ")
    run("xdotool type --delay 75 -- 'echo it'\"'\"'s; ok'")
    run("xdotool key ctrl+a Return")
    timeline = served.guest.timeline()
    assert "@200,150" in timeline
    assert timeline.count("B+left") == 4 and timeline.count("B+right") == 1 and timeline.count("B+wheel-down") == 2
    assert "+ctrl" in timeline and "+ret" in timeline
    shot = "/tmp/screenshot-1.png"
    run(f"scrot --pointer {shot}")
    image = Image.open(io.BytesIO(bytes(sandbox.files.read(shot, format="bytes"))))
    assert image.size == (1920, 1080) and image.getpixel((10, 10)) == (255, 0, 0)
    sandbox.files.remove(shot)
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(shot)
    sandbox.commands.kill(xvfb.pid)
    assert served.guest.launched == []  # not one of them reached the guest's shell


def test_an_action_the_desktop_refuses_is_an_error_the_sdk_raises(served: Served, sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as off:
        sandbox.commands.run("xdotool mousemove --sync 5000 10")
    assert off.value.exit_code == 1 and "off the 1920x1080 screen" in off.value.stderr
    with pytest.raises(CommandExitException, match="key"):
        sandbox.commands.run("xdotool key NoSuchKeyAnywhere")


def test_a_line_that_is_not_exactly_e2b_desktops_runs_in_the_guest(served: Served, sandbox: Sandbox) -> None:
    sandbox.commands.run("xdotool key ctrl+c; rm -rf ~/x")  # a shell would run both: it is the guest's to run
    sandbox.commands.run("xdotool getwindowfocus")
    assert [x.command for x in served.guest.launched] == ["xdotool key ctrl+c; rm -rf ~/x", "xdotool getwindowfocus"]
    assert "+ctrl" not in served.guest.timeline()


def test_e2b_desktops_live_view_is_served_at_its_host_for_its_password(served: Served, sandbox: Sandbox) -> None:
    run = sandbox.commands.run
    with pytest.raises(CommandExitException, match="only with a password"):  # stream.start() without require_auth
        run("x11vnc -bg -display :0 -forever -wait 50 -shared -rfbport 5900 -nopw 2>/tmp/x11vnc_stderr.log ")
    with pytest.raises(CommandExitException):
        run("pgrep -x x11vnc")  # e2b-desktop's "is the stream running?": no
    run("x11vnc -storepasswd Pa55word0123abcd ~/.vnc/passwd")  # stream.start(require_auth=True)'s lines
    run("x11vnc -bg -display :0 -forever -wait 50 -shared -rfbport 5900 -usepw 2>/tmp/x11vnc_stderr.log ")
    novnc = "cd /opt/noVNC/utils && ./novnc_proxy --vnc localhost:5900 --listen 6080 --web /opt/noVNC"
    proxy = run(f"{novnc} > /tmp/novnc.log 2>&1", background=True, timeout=0)
    assert ":6080 " in run('netstat -tuln | grep ":6080 "').stdout
    assert run("pgrep -x x11vnc").exit_code == 0
    view = {"Host": f"6080-{sandbox.sandbox_id}.e2b.example.org"}
    page = httpx.get(f"{served.url}/vnc.html", params={"password": "Pa55word0123abcd"}, headers=view)
    assert page.status_code == 200 and b"frame.jpg" in page.content
    frame = httpx.get(f"{served.url}/frame.jpg", params={"password": "Pa55word0123abcd"}, headers=view)
    assert frame.headers["content-type"] == "image/jpeg" and Image.open(io.BytesIO(frame.content)).size == (1920, 1080)
    assert httpx.get(f"{served.url}/frame.jpg", params={"password": "guess"}, headers=view).status_code == 401
    daemon = {"Host": f"49983-{sandbox.sandbox_id}.e2b.example.org"}  # the domain mode's daemon host: the routes
    assert (
        httpx.get(f"{served.url}/frame.jpg", params={"password": "Pa55word0123abcd"}, headers=daemon).status_code == 404
    )
    run("pkill x11vnc")  # stream.stop()
    proxy.kill()
    assert httpx.get(f"{served.url}/vnc.html", params={"password": "Pa55word0123abcd"}, headers=view).status_code == 404
    assert served.guest.launched == []  # none of it ran in the guest


# --- files ---------------------------------------------------------------------------------------------------------
def test_files_go_through_the_fleets_files_endpoint_as_the_desktop_user(served: Served, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/e2b.txt", "hello from e2b")
    assert sandbox.files.read("/home/user/e2b.txt") == "hello from e2b"
    sandbox.files.write("notes/n.bin", io.BytesIO(b"\x00\xff" * 10))  # a file object: octet-stream, relative path
    assert served.host.desktop_files["/home/user/notes/n.bin"] == b"\x00\xff" * 10
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write("/etc/passwd", "root::0:0::/:/bin/sh\n")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/none.txt")
    with pytest.raises(SandboxException, match="never as root"):
        sandbox.files.read("/home/user/e2b.txt", user="root")


# --- life: timeouts, pause and resume, forks -----------------------------------------------------------------------
def test_pause_keeps_a_checkpoint_and_connect_resumes_on_a_new_replica(served: Served, sandbox: Sandbox) -> None:
    first = served.leased()
    assert sandbox.pause() is True
    assert served.leased() == [] and sandbox.get_info().state.value == "paused"
    with pytest.raises(SandboxException, match="paused"):
        sandbox.commands.run("true")
    again = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert again.get_info().state.value == "running"
    assert served.leased() != first and len(served.leased()) == 1
    assert served.host.checkpoints.list("alice") == []  # the checkpoint served its turn
    assert again.commands.run("true").exit_code == 0


def test_timeouts_move_within_the_lease_and_end_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = Served(tmp_path, max_lifetime=120)
    monkeypatch.setenv("E2B_API_URL", stack.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", stack.url)
    try:
        with pytest.raises(SandboxException, match="max-lifetime"):
            Sandbox.create(timeout=600, api_key=ALICE)
        box = Sandbox.create(timeout=60, api_key=ALICE)
        with pytest.raises(SandboxException, match="past this sandbox's lease"):
            box.set_timeout(600)
        box.set_timeout(1)
        deadline = time.monotonic() + 20
        while stack.book.sandboxes and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stack.book.sandboxes == {} and stack.leased() == []
        with pytest.raises(SandboxNotFoundException):
            box.get_info()
    finally:
        stack.stop()


def test_a_fork_gives_new_sandboxes_of_the_same_key(served: Served, sandbox: Sandbox) -> None:
    children = sandbox.fork(count=2)
    try:
        assert all(isinstance(c, Sandbox) for c in children) and len(served.leased()) == 3
        assert {s.sandbox_id for s in Sandbox.list().next_items()} == {
            sandbox.sandbox_id,
            *(c.sandbox_id for c in children),
        }  # type: ignore[union-attr]
        assert Sandbox.list(api_key=BOB).next_items() == []
    finally:
        for child in children:
            child.kill()  # type: ignore[union-attr]


def test_list_filters_by_state_and_metadata(served: Served) -> None:
    a = Sandbox.create(metadata={"team": "a"})
    b = Sandbox.create(metadata={"team": "b"})
    try:
        b.pause()
        from e2b import SandboxQuery, SandboxState

        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert [s.sandbox_id for s in running] == [a.sandbox_id]
        team_b = Sandbox.list(query=SandboxQuery(metadata={"team": "b"})).next_items()
        assert [s.sandbox_id for s in team_b] == [b.sandbox_id]
    finally:
        a.kill()
        b.kill()
    assert [
        c.name for c in served.host.checkpoints.list("alice")
    ] == []  # killing a paused sandbox deletes its checkpoint


def test_what_a_desktop_cannot_do_is_refused_with_the_reason(served: Served) -> None:
    with pytest.raises(SandboxException, match="no network"):
        Sandbox.create(allow_internet_access=True)
    with pytest.raises(SandboxException, match="404: template 'python' was not found"):
        Sandbox.create(template="python")
    assert served.leased() == []
    bad = httpx.post(f"{served.url}/v2/sandboxes", headers={"X-API-KEY": ALICE}, content=b"[1]")
    assert bad.status_code == 400 and bad.json()["code"] == 400


def test_a_web_pages_origin_is_refused_before_anything_runs(served: Served) -> None:
    answer = httpx.post(
        f"{served.url}/v2/sandboxes",
        headers={"X-API-KEY": ALICE, "Origin": "http://evil.example"},
        json={"templateID": "desktop"},
    )
    assert answer.status_code == 403 and served.leased() == []


def test_stopping_the_server_gives_every_desktop_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = Served(tmp_path)
    monkeypatch.setenv("E2B_API_URL", stack.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", stack.url)
    Sandbox.create(api_key=ALICE)
    paused = Sandbox.create(api_key=BOB)
    paused.pause()
    assert len(stack.leased()) == 1 and [c.name for c in stack.host.checkpoints.list("bob")] != []
    stack.e2b.stop()
    assert stack.leased() == [] and [c.name for c in stack.host.checkpoints.list("bob")] == []
    stack.agent.stop()


def test_a_bad_timeout_is_an_invalid_argument(served: Served, sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="timeout -5 s: must be 0 or more seconds"):
        sandbox.set_timeout(-5)


# --- races ---------------------------------------------------------------------------------------------------------
def test_killing_a_sandbox_ends_the_stream_of_a_command_it_runs(served: Served) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from e2b.exceptions import SandboxNotRunningException

    served.guest.programs["./forever"] = [Look(b"", status=None), Look(b"tick\n", status=None)]
    box = Sandbox.create()
    handle = box.commands.run("./forever", background=True)
    assert next(iter(handle))[0] == "tick\n"
    with ThreadPoolExecutor(3) as pool:  # the stream goes on while two kills race each other
        waiting = pool.submit(handle.wait)
        killed = [pool.submit(box.kill), pool.submit(Sandbox.kill, box.sandbox_id)]
        assert True in [k.result(timeout=30) for k in killed]  # the other may find it gone already: False
        with pytest.raises(SandboxNotRunningException, match="was not found: it was killed"):
            waiting.result(timeout=60)
    assert served.leased() == [] and served.book.sandboxes == {}


def test_a_pause_racing_a_kill_leaves_neither_lease_nor_checkpoint(served: Served) -> None:
    from concurrent.futures import ThreadPoolExecutor

    for _ in range(3):
        box = Sandbox.create()
        with ThreadPoolExecutor(2) as pool:
            pausing = pool.submit(box.pause)
            killing = pool.submit(box.kill)
            assert killing.result(timeout=30) is True
            with contextlib.suppress(SandboxNotFoundException):  # after the kill: nothing to pause
                pausing.result(timeout=30)  # before it: a checkpoint the kill deleted
        assert served.leased() == [] and served.host.checkpoints.list("alice") == []
