"""What ``osfleet e2b serve`` reads from a guest and from E2B's clients, parsed strictly: command frames, finds'
listings, e2b-desktop's lines, environments, users and paths (the servers themselves: tests/test_e2b.py)."""

from __future__ import annotations

import base64

import pytest

from osfleet.e2b import desktop_lines, guest_commands, guest_files
from osfleet.e2b.envd import check_user, command_of, user_of
from osfleet.e2b.errors import E2BError
from osfleet.e2b.guest_commands import GuestProtocolError
from osfleet.e2b.guest_files import GuestFileError

pytestmark = pytest.mark.unit
NOVNC = "cd /opt/noVNC/utils && ./novnc_proxy --vnc localhost:5900 --listen 6080 --web /opt/noVNC"  # e2b-desktop's


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_frame_is_its_header_and_two_base64_lines() -> None:
    out = b64(b"a\x00b")
    frame = guest_commands.parse_frame(f"osfleet-e2b 41 0 3 1\n{out}\n{b64(b'!')}\n")
    assert (frame.pid, frame.exit_code, frame.out, frame.err, frame.out_size, frame.err_size) == (
        41,
        0,
        b"a\x00b",
        b"!",
        3,
        1,
    )
    running = guest_commands.parse_frame("osfleet-e2b - - 0 0\n\n\n")
    assert running.pid is None and running.exit_code is None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("", "not a frame"),
        ("osfleet-e2b 1 0 0 0\n\n", "not a frame of 3"),
        ("osfleet-e2b 1 0 0 0\n\n\nmore\n", "not a frame of 3"),
        ("osfleet-e2b 1 x 0 0\n\n\n", "not a frame's header"),
        ("rm -rf / 1 0 0 0\n\n\n", "not a frame's header"),
        ("osfleet-e2b 1 0 0 0\nnot base64!\n\n", "not base64"),
        ("osfleet-e2b 1 0 0 0\n" + "A" * (guest_commands.MAX_B64_LINE + 4) + "\n\n", "over"),
    ],
)
def test_anything_else_from_the_guest_is_refused_whole(answer: str, why: str) -> None:
    with pytest.raises(GuestProtocolError, match=why):
        guest_commands.parse_frame(answer)


def test_a_view_without_a_password_and_any_other_x11vnc_line_are_refused_with_the_reason() -> None:
    nopw = desktop_lines.recognise("x11vnc -bg -display :0 -forever -rfbport 5900 -nopw")
    assert nopw is not None and nopw.exit_code == 1 and "require_auth=True" in nopw.reason
    other = desktop_lines.recognise("x11vnc -storepasswd short ~/.vnc/passwd; curl evil")
    assert other is not None and other.kind == "status" and other.exit_code == 1


def test_an_environment_is_quoted_for_the_shell_or_refused() -> None:
    assert guest_commands.env_file({"A": "x'y $z", "B_2": ""}) == "A='x'\"'\"'y $z'\nB_2=''\n"
    with pytest.raises(ValueError, match="not a shell variable's name"):
        guest_commands.env_file({"A;rm": "1"})
    with pytest.raises(ValueError, match="NUL"):
        guest_commands.env_file({"A": "a\x00b"})


@pytest.mark.parametrize(
    ("line", "kind", "actions"),
    [
        ("scrot --pointer /tmp/screenshot-1.png", "screenshot", ()),
        ("xdotool mousemove --sync 12 34", "step", ({"type": "move", "x": 12, "y": 34},)),
        ("xdotool click 1", "step", ({"type": "click", "button": "left", "count": 1},)),
        ("xdotool click --repeat 2 1", "step", ({"type": "click", "button": "left", "count": 2},)),
        (
            "xdotool click --repeat 5 3",
            "step",
            ({"type": "click", "button": "right", "count": 3}, {"type": "click", "button": "right", "count": 2}),
        ),
        ("xdotool click --repeat 3 4", "step", ({"type": "scroll", "clicks": -3},)),
        ("xdotool click 7", "step", ({"type": "scroll", "clicks_x": 1},)),
        ("xdotool click 8", "step", ({"type": "click", "button": "back", "count": 1},)),
        ("xdotool mousedown 2", "step", ({"type": "mouse_down", "button": "middle"},)),
        ("xdotool type --delay 75 -- 'a b'", "step", ({"type": "type", "text": "a b"},)),
        (
            "xdotool key ctrl+shift+t Return",
            "step",
            ({"type": "hotkey", "keys": ["ctrl", "shift", "t"]}, {"type": "hotkey", "keys": ["Return"]}),
        ),
        ("xdotool getmouselocation", "cursor", ()),
        ("xrandr", "xrandr", ()),
        ("Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix", "running", ()),
        ("startxfce4", "running", ()),
        ("sleep 0.5", "sleep", ()),
        (
            "x11vnc -bg -display :0 -forever -wait 50 -shared -rfbport 5900 -nopw 2>/tmp/x11vnc_stderr.log ",
            "status",
            (),
        ),
        (
            "x11vnc -bg -display :0 -forever -wait 50 -shared -rfbport 5900 -usepw 2>/tmp/x11vnc_stderr.log ",
            "view_start",
            (),
        ),
        ("x11vnc -storepasswd abcdEFGH12345678 ~/.vnc/passwd", "view_password", ()),
        (
            NOVNC + " > /tmp/novnc.log 2>&1",
            "view_proxy",
            (),
        ),
        ('netstat -tuln | grep ":6080 "', "view_port", ()),
        ("pgrep -x x11vnc", "view_status", ()),
        ("pkill x11vnc", "view_stop", ()),
    ],
)
def test_e2b_desktops_lines_are_recognised(line: str, kind: str, actions: tuple[dict[str, object], ...]) -> None:
    found = desktop_lines.recognise(line)
    assert found is not None and found.kind == kind and found.actions == actions


@pytest.mark.parametrize(
    "line",
    [
        "xdotool key ctrl+c; rm -rf ~",  # a shell would run more than xdotool
        "xdotool type $HOME",  # a shell would expand it
        "xdotool type --delay 75 -- a b",  # two words: not what e2b-desktop sends
        "xdotool mousemove --sync 1.5 2",
        "xdotool click 1 && echo x",
        "scrot /etc/shadow.png",  # a screenshot is kept under /tmp only
        "scrot --pointer /tmp/../etc/x.png",
        "Xvfb :1 -ac",  # another display
        "sleep 100000",
        "xdotool search --onlyvisible --class xterm",  # a real query: the guest's
        NOVNC + "; rm -rf ~",
        'netstat -tuln | grep ":6080 "; reboot',
    ],
)
def test_anything_else_is_the_guests_to_run(line: str) -> None:
    assert desktop_lines.recognise(line) is None


def test_a_listing_is_finds_records_or_refused_whole() -> None:
    record = "d\x004096\x00755\x00user\x00user\x001733486400.25\x00\x00/home/user/dir\x00\n"
    link = "l\x009\x00777\x00user\x00user\x001\x00/etc/hosts\x00/home/user/l\x00\n"
    entries = guest_files.parse_listing(record + link)
    assert [(e.name, e.type, e.size, e.mode, e.symlink_target) for e in entries] == [
        ("dir", "dir", 4096, 0o755, None),
        ("l", "symlink", 9, 0o777, "/etc/hosts"),
    ]
    for bad in (record.replace("4096", "-1"), record.replace("\x00755", "\x00rwx"), "x\x00\n", record[:-2]):
        with pytest.raises(GuestFileError, match="find's"):
            guest_files.parse_listing(bad)


def test_paths_are_the_desktop_users_and_normalised() -> None:
    assert guest_files.resolve("notes/a.txt") == "/home/user/notes/a.txt"
    assert guest_files.resolve("~/a/../b") == "/home/user/b"
    assert guest_files.resolve("//tmp//x/") == "/tmp/x"
    for bad in ("", "a\x00b", "/" + "x" * 5000):
        with pytest.raises(GuestFileError, match="1 to 4096 characters"):
            guest_files.resolve(bad)


def test_only_the_desktop_user_is_named_by_a_call() -> None:
    basic = "Basic " + base64.b64encode(b"root:").decode()
    assert user_of(basic) == "root" and user_of(None) is None and user_of("Bearer x") is None
    check_user("user")
    check_user(None)
    for who in ("root", "nobody"):
        with pytest.raises(E2BError, match="never as root") as refused:
            check_user(who)
        assert refused.value.status == 403
    with pytest.raises(E2BError, match="not HTTP Basic"):
        user_of("Basic !!!")


def test_a_process_config_is_the_line_bash_would_run() -> None:
    from e2b.envd.process import process_pb

    assert command_of(process_pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", "echo hi"])) == "echo hi"
    assert command_of(process_pb.ProcessConfig(cmd="ls", args=["-l", "a b"])) == "ls -l 'a b'"
    with pytest.raises(E2BError, match="needs a command"):
        command_of(process_pb.ProcessConfig())
