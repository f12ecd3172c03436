"""OSWorld's set-up steps, getters and scoring, run for real without a VM.

The guest is this machine in a private mount namespace (``NamespaceGuest``): ``/home/user`` and ``/var/lib`` are
folders of the test, so the converter's real guest paths (``~``, relative, ``/home/user/...``, the task cache)
are used unchanged; commands run with ``HOME=/home/user`` in that folder as the desktop user's shell would,
and the query script runs under Debian's own ``python3`` (with python3-websocket, as in the guest). Chrome is
Debian's ``chromium``, headless, with its DevTools port and a profile in the guest's home; tools of the desktop
that cannot run here (xdotool, gsettings, wmctrl) are small scripts that record how they were called.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openpyxl
import pytest

from osfleet.errors import GuestCommandKilledError, GuestFileTooLargeError, GuestTimeoutError
from osfleet.lab.engine import NO_SESSION_BUS
from osfleet.tasks import runner
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.osworld_format import getters
from osfleet.tasks.osworld_format.convert import HISTORY_TEMPLATE_URL, from_osworld
from osfleet.tasks.osworld_format.getters import GetterValueError, omnibox_text, time_format
from osfleet.tasks.osworld_format.guest_paths import guest_path, shell_command
from tests import fake_guest_reads

pytestmark = [
    pytest.mark.system,
    pytest.mark.xdist_group("chrome"),
]  # one xdist worker: the handover check scans the machine for google-chrome launchers

CHROMIUM = "/usr/bin/chromium"
DEBIAN_PYTHON = "/usr/bin/python3"
FAKE_TOOLS = {
    "xdotool": 'echo "xdotool $*" >> /home/user/.calls; [ "$1" = getdisplaygeometry ] && echo "1280 800"; exit 0',
    "gsettings": 'echo "gsettings $*" >> /home/user/.calls; [ "$1" = get ] && echo "\'file://$HOME/wall.png\'"; exit 0',
    "wmctrl": 'echo "wmctrl $*" >> /home/user/.calls; exit 1',  # no window here: OSWorld goes on anyway
}


class NamespaceGuest:
    """The runner's view of a replica, played by this machine in a mount namespace of its own per command."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.home, self.varlib, self.bin = root / "home", root / "varlib", root / "bin"
        for d in (self.home, self.varlib, self.bin):
            d.mkdir(parents=True, exist_ok=True)
        for name, body in {**FAKE_TOOLS, "python3": f'exec {DEBIAN_PYTHON} "$@"'}.items():
            (self.bin / name).write_text(f"#!/bin/sh\n{body}\n")
            (self.bin / name).chmod(0o755)
        self.env = {**os.environ, **(env or {}), "PATH": f"{self.bin}:/usr/bin:/bin:/usr/sbin:/sbin"}

    def _run(self, inner: str, arg: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
        mounts = (
            f"mount -t tmpfs tmpfs /home && mkdir /home/user && mount --bind {self.home} /home/user "
            f"&& mount --bind {self.varlib} /var/lib"
        )
        script = f"{mounts} && {inner}"
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", script, "sh", arg], capture_output=True, timeout=timeout, env=self.env
        )

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        inner = 'cd / && exec sh -c "$1"' if as_root else 'cd /home/user && HOME=/home/user exec sh -c "$1"'
        p = self._run(inner, fake_guest_reads.as_local_user(command), timeout)
        return {"exit_code": p.returncode, "stdout": p.stdout.decode(), "stderr": p.stderr.decode()}

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = 30.0) -> bytes:
        p = self._run('exec cat -- "$1"', path, timeout)
        assert p.returncode == 0, p.stderr
        return p.stdout[:limit]

    def calls(self) -> list[str]:
        calls = self.home / ".calls"
        return calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AssetStore:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
    return AssetStore.from_settings()


@pytest.fixture
def guest(tmp_path: Path) -> NamespaceGuest:
    if shutil.which("unshare") is None or not Path(DEBIAN_PYTHON).exists():
        pytest.fail("these tests need unshare (util-linux) and Debian's python3 (scripts/setup)")
    return NamespaceGuest(tmp_path / "guest")


def osworld(config: list[dict[str, Any]], **evaluator: Any) -> dict[str, Any]:
    ev = {"func": "check_include_exclude", "result": {"type": "vm_command_line", "command": "true"}}
    ev["expected"] = {"type": "rule", "rules": {"include": [], "exclude": []}}
    ev.update(evaluator)
    return {"id": "t", "instruction": "x", "config": config, "evaluator": ev}


def get(guest: NamespaceGuest, spec: dict[str, Any], tmp_path: Path, store: AssetStore, timeout: float = 30) -> Any:
    work = tmp_path / f"work-{time.monotonic_ns()}"
    work.mkdir()
    return getters.get(guest, "r-1", spec, work, store, timeout)  # type: ignore[arg-type]


# --- paths and commands -----------------------------------------------------------------------------------------
def test_paths_resolve_as_osworlds_server_resolves_them() -> None:
    assert guest_path("~/a b.txt") == "/home/user/a b.txt" and guest_path("~") == "/home/user"
    assert guest_path("$HOME/x") == guest_path("${HOME}/x") == "/home/user/x"
    assert guest_path("Downloads/s.pptx") == "/home/user/Downloads/s.pptx" and guest_path("/etc/x") == "/etc/x"
    assert guest_path("~root/x") == "/root/x" and guest_path("$NOPE/x") == "/home/user/$NOPE/x"
    assert shell_command(["ls", "~/x y", "~z"]) == "ls \"$HOME\"/'x y' '~z'"  # only a leading ~/ expands
    assert shell_command("python -c 'print(1)'") == "python -c 'print(1)'"
    assert shell_command("echo $HOME", shell="true") == "echo $HOME"  # "true": truthy, as subprocess takes it
    assert shell_command(["echo $0-$1", "a", "b"], shell=True) == "sh -c 'echo $0-$1' a b"
    assert shell_command(["echo", "{CLIENT_PASSWORD}"]) == "echo password"


def test_execute_command_and_launch_steps_run_as_osworld_runs_them(
    guest: NamespaceGuest, store: AssetStore, tmp_path: Path
) -> None:
    config = [
        {"type": "execute", "parameters": {"command": ["mkdir", "-p", "~/made"]}},
        {"type": "execute", "parameters": {"command": "echo hi > rel.txt", "shell": "true"}},
        {
            "type": "command",
            "parameters": {"command": ["sh", "-c", "echo out; echo err >&2; exit 3"], "stdout": "o.txt"},
        },
        {"type": "execute", "parameters": {"command": "ls -d made nothere", "stderr": "dir/e.txt"}},
        {"type": "launch", "parameters": {"command": "touch launched"}},
        {"type": "execute", "parameters": {"command": "echo 'unclosed"}},  # cannot be split: fails, set-up goes on
        {"type": "sleep", "parameters": {"seconds": 0.5}},
    ]
    task = from_osworld(
        osworld(
            config,
            func=["check_include_exclude", "check_include_exclude"],
            result=[{"type": "cache_file", "path": "o.txt"}, {"type": "cache_file", "path": "dir/e.txt"}],
            expected=[
                {"type": "rule", "rules": {"include": ["out"]}},
                {"type": "rule", "rules": {"include": ["nothere"]}},
            ],
        ),
        store,
    )
    runner.apply_setup(guest, "r-1", task)  # type: ignore[arg-type]
    assert (guest.home / "made").is_dir() and (guest.home / "rel.txt").read_text() == "hi\n"
    assert (guest.home / "launched").exists()  # launched in the background, from the home folder
    assert (guest.varlib / "osfleet-task-cache" / "o.txt").read_text() == "out\n"  # exit 3 did not stop the set-up
    ev = runner.evaluate(guest, "r-1", task)  # type: ignore[arg-type]
    assert ev.reward == 1.0 and [c.score for c in ev.criteria] == [1.0, 1.0], ev
    assert get(guest, {"type": "cache_file", "path": "absent.txt"}, tmp_path, store) is None


def test_screen_placeholders_are_filled_from_the_guests_screen_when_the_step_runs(
    guest: NamespaceGuest, store: AssetStore
) -> None:
    code = "open('xy', 'w').write('{SCREEN_WIDTH_HALF} {SCREEN_HEIGHT_HALF} {SCREEN_WIDTH}x{SCREEN_HEIGHT}')"
    config = [
        {"type": "execute", "parameters": {"command": ["python3", "-c", code]}},
        {"type": "execute", "parameters": {"command": "echo {SCREEN_WIDTH} {CLIENT_PASSWORD} > s.txt", "shell": True}},
        {"type": "launch", "parameters": {"command": ["sh", "-c", "echo {SCREEN_HEIGHT_HALF} > l.txt"]}},
    ]
    task = from_osworld(osworld(config), store)
    assert "{SCREEN_WIDTH_HALF}" in task.setup[0].command  # type: ignore[union-attr]  # not baked in: asked at set-up
    runner.apply_setup(guest, "r-1", task)  # type: ignore[arg-type]
    assert (guest.home / "xy").read_text() == "640 400 1280x800"  # the fake xdotool's screen, halves as OSWorld's
    assert (guest.home / "s.txt").read_text() == "1280 password\n"
    for _ in range(100):  # the launched step runs in the background
        if (guest.home / "l.txt").exists() and (guest.home / "l.txt").read_text():
            break
        time.sleep(0.05)
    assert (guest.home / "l.txt").read_text() == "400\n"
    assert guest.calls().count("xdotool getdisplaygeometry") == 1  # asked once per set-up


def test_download_open_window_and_wallpaper_steps(guest: NamespaceGuest, store: AssetStore, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("data")
    store.add("https://files.test/in.txt", src)
    files = [{"url": "https://files.test/in.txt", "path": p} for p in ("~/a/in.txt", "b/in.txt", "/home/user/c.txt")]
    config = [
        {"type": "download", "parameters": {"files": files}},
        {"type": "activate_window", "parameters": {"window_name": "in.txt - Editor", "strict": "true"}},
        {"type": "close_window", "parameters": {"window_name": "gimp", "by_class": True}},
        {"type": "change_wallpaper", "parameters": {"path": "~/c.txt"}},
    ]
    runner.apply_setup(guest, "r-1", from_osworld(osworld(config), store))  # type: ignore[arg-type]
    assert all((guest.home / p).read_text() == "data" for p in ("a/in.txt", "b/in.txt", "c.txt"))
    assert guest.calls() == [
        "wmctrl -F -a in.txt - Editor",
        "wmctrl -x -c gimp",
        "gsettings set org.gnome.desktop.background picture-uri file:///home/user/c.txt",
    ]
    missing = from_osworld(osworld([{"type": "open", "parameters": {"path": "~/nope.docx"}}]), store)
    with pytest.raises(runner.TaskSetupError, match="file not found: /home/user/nope.docx"):
        runner.apply_setup(guest, "r-1", missing)  # type: ignore[arg-type]


# --- getters --------------------------------------------------------------------------------------------------
def test_file_getters_single_multi_gives_missing_and_capped(
    guest: NamespaceGuest, store: AssetStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a.txt", "b.txt"):
        (guest.home / name).write_text(name)
    one = get(guest, {"type": "vm_file", "path": "/home/user/a.txt", "dest": "mine.txt"}, tmp_path, store)
    assert one.name == "mine.txt" and one.read_text() == "a.txt"
    spec = {"type": "vm_file", "path": ["/home/user/a.txt", "/home/user/x", "/home/user/b.txt"], "multi": True}
    spec["dest"] = ["1.txt", "2.txt", "3.txt"]
    three = get(guest, {**spec, "gives": [0, 1, 2]}, tmp_path, store)
    assert [p.read_text() if p else None for p in three] == ["a.txt", None, "b.txt"]
    assert get(guest, {**spec, "gives": [2]}, tmp_path, store).read_text() == "b.txt"  # one given: itself
    assert get(guest, {"type": "vm_file", "path": "/home/user/none", "dest": "n"}, tmp_path, store) is None
    stamped = get(
        guest, {"type": "vm_file", "path": "/home/user/a.txt", "dest": "r.txt", "time_suffix": True}, tmp_path, store
    )
    assert stamped.name.startswith(f"r_{dt.datetime.now():%Y%m%d}")
    monkeypatch.setattr(getters, "MAX_READ_BYTES", 3)
    with pytest.raises(GuestFileTooLargeError, match="file over 3 bytes: /home/user/a.txt"):
        get(guest, {"type": "vm_file", "path": "/home/user/a.txt", "dest": "a"}, tmp_path, store)
    for i, url in enumerate(("https://x.test/1", "https://x.test/2")):
        (tmp_path / f"c{i}").write_text(f"cloud {i}")
        store.add(url, tmp_path / f"c{i}")
    cloud = {"type": "cloud_file", "path": ["https://x.test/1", "https://x.test/2"], "dest": ["g1.txt", "g2.txt"]}
    both = get(guest, {**cloud, "multi": True, "gives": [0, 1]}, tmp_path, store)
    assert [p.name for p in both] == ["g1.txt", "g2.txt"] and both[1].read_text() == "cloud 1"


def test_command_rule_and_desktop_getters(guest: NamespaceGuest, store: AssetStore, tmp_path: Path) -> None:
    out = get(guest, {"type": "vm_command_line", "command": ["sh", "-c", "echo o; echo e >&2"]}, tmp_path, store)
    err = get(guest, {"type": "vm_command_error", "command": "sh -c 'echo o; echo e >&2'"}, tmp_path, store)
    assert (out, err) == ("o\n", "e\n")
    assert (
        get(guest, {"type": "vm_command_line", "command": "echo $HOME", "shell": True}, tmp_path, store)
        == "/home/user\n"
    )
    assert get(guest, {"type": "rule", "rules": {"expected": ["a"]}}, tmp_path, store) == {"expected": ["a"]}
    assert get(guest, {"type": "constant", "value": 3}, tmp_path, store) == 3
    assert get(guest, {"type": "time_diff_range", "diff_range_in_minutes": 5}, tmp_path, store) == 5
    assert get(guest, {"type": "vm_screen_size"}, tmp_path, store) == {"width": 1280, "height": 800}
    cache = guest.home / ".local" / "share" / "applications" / "mimeinfo.cache"  # searched before the system's
    cache.parent.mkdir(parents=True)
    cache.write_text("[MIME Cache]\n" + "".join(f"video/{t}=mpv.desktop;\n" for t in ("avi", "mpeg", "ogg", "dv")))
    cache.write_text(
        cache.read_text() + "video/mp4=vlc.desktop;\nvideo/webm=vlc.desktop;\nvideo/x-matroska=vlc.desktop;\n"
    )
    assert get(guest, {"type": "default_video_player"}, tmp_path, store) == "mpv.desktop\n"  # most common answer
    (guest.home / "wall.png").write_bytes(b"PNG")
    assert get(guest, {"type": "vm_wallpaper", "dest": "w.png"}, tmp_path, store).read_bytes() == b"PNG"
    (guest.home / "Desktop" / "sub").mkdir(parents=True)
    (guest.home / "Desktop" / "chrome.desktop").write_text("[Desktop Entry]\nName=Chrome\n")
    (guest.home / "Desktop" / "sub" / "f").write_text("")
    assert get(guest, {"type": "shortcuts_on_desktop"}, tmp_path, store) == {
        "chrome.desktop": "[Desktop Entry]\nName=Chrome\n"
    }
    tree = get(guest, {"type": "list_directory", "path": "/home/user/Desktop"}, tmp_path, store)
    assert tree == {
        "type": "directory",
        "name": "Desktop",
        "children": [
            {"type": "file", "name": "chrome.desktop"},
            {"type": "directory", "name": "sub", "children": [{"type": "file", "name": "f"}]},
        ],
    }
    (guest.home / ".config" / "vlc").mkdir(parents=True)
    (guest.home / ".config" / "vlc" / "vlcrc").write_text("qt-max-volume=200\n")
    assert get(guest, {"type": "vlc_config", "dest": "vlcrc"}, tmp_path, store).read_text() == "qt-max-volume=200\n"
    assert get(guest, {"type": "gimp_config_file", "file_name": "sessionrc", "dest": "s"}, tmp_path, store) is None
    assert get(guest, {"type": "vlc_playing_info", "dest": "status.xml"}, tmp_path, store) is None  # VLC not running


def test_document_getters_read_in_the_guest(guest: NamespaceGuest, store: AssetStore, tmp_path: Path) -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    assert ws is not None
    for row in (["name", "n", "x"], ["a", 1, 2.5], ["LeCun", 7, None]):
        ws.append(row)
    wb.save(guest.home / "r.xlsx")
    spec = {
        "type": "content_from_vm_file",
        "path": "/home/user/r.xlsx",
        "file_type": "xlsx",
        "file_content": "last_row",
    }
    assert get(guest, spec, tmp_path, store) == ["LeCun", "7", "nan"]
    rels = (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId2" Type="http://schemas.microsoft.com/office/2007/relationships/media" '
        'Target="../media/media1.mp3"/>'
        '<Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/audio" '
        'Target="../media/media1.mp3"/></Relationships>'
    )
    with zipfile.ZipFile(guest.home / "s.pptx", "w") as z:
        z.writestr(
            "ppt/slides/slide1.xml", "<p:sld xmlns:p='http://schemas.openxmlformats.org/presentationml/2006/main'/>"
        )
        z.writestr("ppt/slides/_rels/slide1.xml.rels", rels)
        z.writestr("ppt/media/media1.mp3", b"ID3 audio")
    audio = {"type": "audio_in_slide", "ppt_file_path": "~/s.pptx", "slide_index": 0, "dest": "a.mp3"}
    task = from_osworld(osworld([], func="check_include_exclude", result=audio, expected=audio), store)
    spec = task.criteria[0].check.result  # type: ignore[union-attr]
    assert spec["ppt_file_path"] == "/home/user/s.pptx"
    found = get(guest, spec, tmp_path, store)
    assert found.name == "a.mp3" and found.read_bytes() == b"ID3 audio"
    assert get(guest, {**spec, "type": "background_image_in_slide"}, tmp_path, store) is None  # no background


def test_relative_times_follow_osworlds_phrases() -> None:
    monday = dt.datetime(2026, 3, 2, 15, 0, tzinfo=dt.UTC)  # a Monday
    friday = dt.datetime(2026, 3, 6, 9, 0, tzinfo=dt.UTC)
    day = getters._relative_day  # noqa: SLF001 (the table under test)
    assert day("tomorrow", monday).day == 3 and day("next Monday", monday).day == 9
    assert day("this Saturday", monday).day == 7 and day("this Sunday", monday).day == 8
    assert day("next Friday", friday).day == 13 and day("next Saturday", friday).day == 7
    assert day("next Friday", friday, ("next Monday", day("next Monday", friday))).day == 13
    assert day("next Sunday", friday, ("next Saturday", day("next Saturday", friday))).day == 8
    assert day("10th next month", monday) == dt.datetime(2026, 4, 10, tzinfo=dt.UTC)
    assert day("first monday four months later", monday) == dt.datetime(2026, 7, 6, tzinfo=dt.UTC)
    august = dt.datetime(2026, 8, 20, tzinfo=dt.UTC)  # OSWorld's month arithmetic gives month 0 here: December
    assert day("first monday four months later", august) == dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    assert time_format("{DoW}, {Month} {DayD}, {Year} {Month0D}/{Day0D} {month} {MonthFull}", monday) == (
        "Mon, Mar 2, 2026 03/02 march March"
    )
    with pytest.raises(GetterValueError, match="no relative time"):
        day("someday", monday)


def test_rule_relative_time_fills_the_expected_dates(guest: NamespaceGuest, store: AssetStore, tmp_path: Path) -> None:
    spec = {
        "type": "rule_relativeTime",
        "rules": {
            "relativeTime": {"from": "next Monday", "to": "next Friday"},
            "expected": {"from": "{DoW} {DayD}", "to": "{DoW} {DayD}", "other": 1},
            "timezone": "Europe/Zurich",
        },
    }
    rules = get(guest, spec, tmp_path, store)
    now = dt.datetime.now(dt.UTC).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Zurich"))
    monday = now + dt.timedelta(days=7 - now.weekday())
    assert rules["expected"] == {
        "from": f"Mon {monday.day}",
        "to": f"Fri {(monday + dt.timedelta(days=4)).day}",
        "other": 1,
    }
    assert spec["rules"]["expected"]["from"] == "{DoW} {DayD}"  # the task's own spec is left as it was


# --- scoring --------------------------------------------------------------------------------------------------
def test_conj_and_infeasible_are_scored_as_osworld_scores_them(guest: NamespaceGuest, store: AssetStore) -> None:
    def metrics(conj: str, *includes: str) -> Any:
        n = len(includes)
        return from_osworld(
            osworld(
                [],
                func=["check_include_exclude"] * n,
                result=[{"type": "vm_command_line", "command": "echo abc"}] * n,
                expected=[{"type": "rule", "rules": {"include": [s]}} for s in includes],
                options=[None] * n,
                conj=conj,
            ),
            store,
        )

    def score(task: Any, declared: bool = False) -> tuple[float, int]:
        ev = runner.evaluate(guest, "r-1", task, declared)  # type: ignore[arg-type]
        return ev.reward, len(ev.criteria)

    assert score(metrics("and", "a", "b")) == (1.0, 2)
    assert score(metrics("and", "x", "a")) == (0.0, 1)  # stops at the first 0
    assert score(metrics("or", "x", "a", "b")) == (1.0, 2)  # stops at the first 1
    assert score(metrics("or", "x", "y")) == (0.0, 2)
    assert score(metrics("and", "a"), declared=True) == (0.0, 1)  # gave up on a feasible task: 0, metrics not run
    infeasible = from_osworld({"id": "i", "instruction": "Do the impossible.", "evaluator": {"func": "infeasible"}})
    assert score(infeasible) == (0.0, 1) and score(infeasible, declared=True) == (1.0, 1)


# --- Chrome through its DevTools protocol ----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def chrome(tmp_path: Path) -> Iterator[tuple[NamespaceGuest, Path]]:
    """Headless chromium with DevTools on a free port and its profile in the guest's home, and that guest."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium")
    port = _free_port()
    guest = NamespaceGuest(tmp_path / "guest", {"OSFLEET_DEVTOOLS_PORT": str(port)})
    site = tmp_path / "site"
    site.mkdir()
    (site / "shop.html").write_text(
        "<html><head><title>Shop</title></head><body><div class='city'>SEA</div><div class='city'>NYC</div>"
        "<p id='price'>42 USD</p><input id='q' value=' spider man '><a id='next' href='shop.html?page=2'>next</a>"
        "</body></html>"
    )
    profile = guest.home / ".config" / "google-chrome"
    proc = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
         f"--user-data-dir={profile}", "--no-first-run", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield guest, site
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_chrome_tabs_set_up_and_read_through_devtools(
    chrome: tuple[NamespaceGuest, Path], store: AssetStore, tmp_path: Path
) -> None:
    guest, site = chrome
    shop, other = f"file://{site}/shop.html", "data:text/html,<title>Other</title>hi"
    config = [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [shop, other]}}]
    runner.apply_setup(guest, "r-1", from_osworld(osworld(config), store))  # type: ignore[arg-type]
    tabs = get(guest, {"type": "open_tabs_info"}, tmp_path, store)
    assert sorted(t["url"] for t in tabs) == sorted([shop, other])  # the blank start tab was closed
    assert {t["title"] for t in tabs} == {"Shop", "Other"}
    close = [{"type": "chrome_close_tabs", "parameters": {"urls_to_close": [other]}}]
    runner.apply_setup(guest, "r-1", from_osworld(osworld(close), store))  # type: ignore[arg-type]
    assert [t["url"] for t in get(guest, {"type": "open_tabs_info"}, tmp_path, store)] == [shop]
    active = get(guest, {"type": "active_url_from_accessTree", "goto_prefix": ""}, tmp_path, store)
    assert active == shop  # a file URL shows whole in the address bar
    parse = {"type": "active_tab_html_parse", "goto_prefix": "", "category": "class"}
    parse["class_multiObject"] = {"city": {"0": "from", "1": "to", "2": "via"}}
    assert get(guest, parse, tmp_path, store) == {"from": "SEA", "to": "NYC", "via": ""}
    xpath = {"type": "active_tab_html_parse", "goto_prefix": "", "category": "xpath"}
    xpath["xpathObject"] = {"/html/body/p": "price"}
    assert get(guest, xpath, tmp_path, store) == {"price": "42 USD"}
    inputs = {"type": "active_tab_html_parse", "goto_prefix": "", "category": "input", "inputObject": {"//input": "q"}}
    assert get(guest, inputs, tmp_path, store) == {"q": "spider man"}
    info = get(guest, {"type": "active_tab_info", "goto_prefix": ""}, tmp_path, store)
    assert info["title"] == "Shop" and "42 USD" in info["content"]
    page = get(guest, {"type": "page_info", "url": shop}, tmp_path, store)
    assert page["url"] == shop and page["title"] == "Shop"
    website = {"type": "info_from_website", "url": shop, "backups": ["b"]}
    website["infos"] = [
        {"action": "inner_text", "selector": "#price"},
        {"action": "attribute", "selector": "#next", "attribute": "href"},
    ]
    assert get(guest, website, tmp_path, store) == ["42 USD", "shop.html?page=2"]
    broken = {**website, "infos": [{"action": "inner_text", "selector": "#nothing"}]}
    assert get(guest, broken, tmp_path, store) == ["b"]  # OSWorld's backups when the page cannot be read


@pytest.mark.slow
def test_chrome_appearance_is_read_off_its_settings_page(
    chrome: tuple[NamespaceGuest, Path], store: AssetStore, tmp_path: Path
) -> None:
    guest, _ = chrome
    # Debian's Chromium starts a fresh profile with the classic theme (extensions.theme.system_theme 0), which the
    # page's preferences, read as OSWorld reads them, call light (OSWorld's own probe says the same:
    # tests/test_osworld_differential_verified.py).
    assert get(guest, {"type": "open_tabs_info"}, tmp_path, store)  # waits for the browser's DevTools port
    assert get(guest, {"type": "chrome_appearance_mode_ui"}, tmp_path, store, timeout=60) == "light"
    tabs = get(guest, {"type": "open_tabs_info"}, tmp_path, store)
    assert not any("settings" in t["url"] for t in tabs)  # the probe's tab is closed again


@pytest.mark.parametrize(
    "theme, expected",
    [
        ({}, "system"),
        ({"browser": {"theme": {"color_scheme2": 2}}}, "dark"),
        ({"browser": {"theme": {"color_scheme": 1}}}, "light"),
        ({"browser": {"theme": {"color_scheme2": 2, "color_scheme": 1}}}, "dark"),  # the newer key wins
        ({"browser": {"theme": {"color_scheme2": "Dark"}}}, "dark"),
        ({"browser": {"theme": {"color_scheme2": 2}}, "extensions": {"theme": {"system_theme": 0}}}, "light"),
        ({"browser": {"theme": {"color_scheme2": 7}}}, "system"),
    ],
)
def test_chrome_appearance_without_a_browser_comes_from_preferences(
    guest: NamespaceGuest, store: AssetStore, tmp_path: Path, theme: dict[str, Any], expected: str
) -> None:
    # No Chromium listens on the DevTools port here: OSWorld falls back to the profile's Preferences then.
    prefs = guest.home / ".config" / "google-chrome" / "Default" / "Preferences"
    prefs.parent.mkdir(parents=True)
    prefs.write_text(json.dumps(theme))
    guest.env["OSFLEET_DEVTOOLS_PORT"] = str(_free_port())
    started = time.monotonic()
    assert get(guest, {"type": "chrome_appearance_mode_ui"}, tmp_path, store) == expected
    assert time.monotonic() - started < (2 if expected == "light" else 12)  # light at once, others asked 5 times


def _desktop_file(folder: Path, name: str, program: str, types: str, extra: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(
        f"[Desktop Entry]\nType=Application\nName={name}\nExec={program} %U\n{extra}MimeType={types}\n"
    )


@pytest.mark.parametrize(
    "scene",
    ["only desktop files", "defaults", "user choice", "user choice of a missing app", "a desktop's own list"],
)
def test_default_applications_are_what_the_real_xdg_mime_says(tmp_path: Path, scene: str) -> None:
    """The query script's port of xdg-mime's lookup (default_video_player) against Debian's own xdg-mime, over
    OSWorld's video types, on folders laid out like a desktop's: the answers must be the same for every type."""
    import runpy

    if not Path("/usr/bin/xdg-mime").exists():
        pytest.fail("these tests need Debian's xdg-utils (scripts/setup)")
    home, share, bin_dir = tmp_path / "home", tmp_path / "share", tmp_path / "bin"
    for program in ("vlc", "totem", "mpv"):
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / program).write_text("#!/bin/sh\n")
        (bin_dir / program).chmod(0o755)
    apps = share / "applications"
    _desktop_file(apps, "vlc.desktop", "vlc", "video/mp4;video/x-matroska;video/webm;video/ogg;video/x-ogm+ogg;")
    _desktop_file(
        apps, "org.gnome.Totem.desktop", "totem", "video/mp4;video/mpeg;video/x-flv;", "InitialPreference=3\n"
    )
    _desktop_file(apps / "kde4", "mpv.desktop", "mpv", "video/x-anim;video/mp4;")
    (home / ".config").mkdir(parents=True)
    if scene != "only desktop files":
        (apps / "mimeinfo.cache").write_text("[MIME Cache]\nvideo/mp4=vlc.desktop;org.gnome.Totem.desktop;\n")
        (apps / "defaults.list").write_text(
            "[Default Applications]\nvideo/mpeg=org.gnome.Totem.desktop\nvideo/webm=gone.desktop\n"
        )
    if scene.startswith("user choice"):
        app = "vlc.desktop" if scene == "user choice" else "gone.desktop"
        lines = "".join(f"video/{t}={app};\n" for t in ("mp4", "mpeg", "x-flv", "3gp"))
        (home / ".config" / "mimeapps.list").write_text(
            f"[Added Associations]\nvideo/avi=x.desktop\n[Default Applications]\n{lines}"
        )
    if scene == "a desktop's own list":
        (home / ".config" / "xfce-mimeapps.list").write_text("[Default Applications]\nvideo/mp4=kde4-mpv.desktop\n")
    env = {
        "HOME": str(home),
        "XDG_DATA_DIRS": str(share),
        "XDG_DATA_HOME": str(tmp_path / "none"),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
    }
    if scene == "a desktop's own list":
        env["XDG_CURRENT_DESKTOP"] = "XFCE"
    query = runpy.run_path(str(Path(getters.__file__).parent / "guest" / "query.py"), run_name="query")
    ported = query["XdgDefaults"](env)
    types = sorted(set(getters.VIDEO_TYPES))
    real = subprocess.run(
        ["sh", "-c", 'for t in "$@"; do echo "$t=$(xdg-mime query default "video/$t")"; done', "sh", *types],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    theirs = dict(line.split("=", 1) for line in real.stdout.splitlines())
    ours = {t: ported.query(f"video/{t}") or "" for t in types}
    assert ours == theirs
    assert len(set(ours.values())) >= 2  # the scene tells players apart


def test_omnibox_and_url_getters() -> None:
    assert omnibox_text("https://www.drugs.com/npc/") == "drugs.com/npc/"
    assert omnibox_text("https://www.google.com/") == "google.com"
    assert omnibox_text("http://scholar.google.com/citations?user=x") == "scholar.google.com/citations?user=x"
    assert omnibox_text("chrome://password-manager/passwords") == "chrome://password-manager/passwords"


def test_url_getters_parse_the_active_url(store: AssetStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://www.example.com/weather/manchester/march-weather/123?q=a,b&x=1"
    monkeypatch.setattr(getters.Context, "ask", lambda self, op, **kw: url if op == "chrome_active_url" else None)
    spec = {"type": "active_tab_url_parse", "goto_prefix": "https://www.", "parse_keys": ["q", "x"]}
    assert get(None, {**spec, "replace": {"x": "y"}}, tmp_path, store) == {"q": "a,b", "y": "1"}  # type: ignore[arg-type]
    assert get(None, {**spec, "split_list": True}, tmp_path, store) == {"q": ["a", "b"], "x": ["1"]}  # type: ignore[arg-type]
    dash = {"type": "url_dashPart", "goto_prefix": "https://www.", "partIndex": -2, "needDeleteId": False}
    assert get(None, {**dash, "returnType": "json", "key": "time"}, tmp_path, store) == {"time": "march-weather"}  # type: ignore[arg-type]
    assert get(None, {**dash, "partIndex": -1, "needDeleteId": True, "returnType": "string"}, tmp_path, store) == "123"  # type: ignore[arg-type]


def test_chrome_profile_getters_and_browse_history(guest: NamespaceGuest, store: AssetStore, tmp_path: Path) -> None:
    # These getters and the history set-up read and write the profile's files; no Chromium runs on it here: a
    # running one writes the same files on its own schedule (on CI it opened History after the template was put
    # in place, found no `meta` table and replaced it, so add_history met "no such table: urls").
    default = guest.home / ".config" / "google-chrome" / "Default"
    default.mkdir(parents=True, exist_ok=True)
    (default / "Bookmarks").write_text(json.dumps({"roots": {"bookmark_bar": {"children": [{"name": "Ref"}]}}}))
    prefs = {"profile": {"name": "Thomas"}, "webkit": {"webprefs": {"default_font_size": 20}}}
    prefs["extensions"] = {"settings": {"abc": {"path": "/home/user/ext", "manifest": {"name": "Hello"}}}}
    (default / "Preferences").write_text(json.dumps(prefs))
    assert get(guest, {"type": "bookmarks"}, tmp_path, store) == {"bookmark_bar": {"children": [{"name": "Ref"}]}}
    assert get(guest, {"type": "profile_name"}, tmp_path, store) == "Thomas"
    assert get(guest, {"type": "chrome_font_size"}, tmp_path, store) == {"default_font_size": 20}
    assert get(guest, {"type": "find_unpacked_extension_path"}, tmp_path, store) == ["/home/user/ext"]
    assert get(guest, {"type": "find_installed_extension_name"}, tmp_path, store) == ["Hello"]
    assert get(guest, {"type": "default_search_engine"}, tmp_path, store) == "Google"  # OSWorld's default
    assert get(guest, {"type": "new_startup_page"}, tmp_path, store) == "true"  # no session: a fresh start
    (default / "Preferences").write_text("{broken")
    assert get(guest, {"type": "profile_name"}, tmp_path, store) is None  # OSWorld's value when it cannot read
    template = tmp_path / "history_empty.sqlite"
    with sqlite3.connect(template) as db:  # the two tables OSWorld writes to, as Chrome's History has them
        db.execute("CREATE TABLE urls (id INTEGER PRIMARY KEY, url TEXT, title TEXT, visit_count INTEGER, "
                   "typed_count INTEGER, last_visit_time INTEGER, hidden INTEGER)")  # fmt: skip
        db.execute("CREATE TABLE visits (id INTEGER PRIMARY KEY, url INTEGER, visit_time INTEGER, from_visit INTEGER, "
                   "transition INTEGER, segment_id INTEGER, visit_duration INTEGER)")  # fmt: skip
    db.close()
    store.add(HISTORY_TEMPLATE_URL, template)
    items = [{"url": "https://www.youtube.com/watch?v=1", "title": "Song", "visit_time_from_now_in_seconds": 3600}]
    config = [{"type": "update_browse_history", "parameters": {"history": items}}]
    runner.apply_setup(guest, "r-1", from_osworld(osworld(config), store))  # type: ignore[arg-type]
    ((url, title, stamp),) = get(guest, {"type": "history", "dest": "h.sqlite"}, tmp_path, store)
    now_us = (time.time() + 11644473600) * 1e6
    assert (url, title) == (items[0]["url"], "Song") and abs(now_us - 3600e6 - stamp) < 60e6


# --- the accessibility tree (AT-SPI) ---------------------------------------------------------------------------
GTK_APP = """
import gi
gi.require_version("Gtk", "3.0")
from gi.repository import Gtk
w = Gtk.Window(title="osfleet a11y")
box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL)
box.add(Gtk.Label(label="Hello label"))
box.add(Gtk.Button(label="Press me"))
entry = Gtk.Entry()
entry.set_text("typed text")
box.add(entry)
w.add(box)
w.show_all()
Gtk.main()
"""


class DesktopGuest:
    """A desktop on Xvfb with its own D-Bus session and AT-SPI bus; commands get only DISPLAY and HOME, as the
    guest agent's do (the query script finds the session's bus itself)."""

    def __init__(self, display: str, home: Path) -> None:
        self.display, self.home = display, home

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        env = {"PATH": f"{Path(DEBIAN_PYTHON).parent}:/bin", "DISPLAY": self.display, "HOME": str(self.home)}
        command = fake_guest_reads.as_local_user(command)
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout, env=env)
        return {"exit_code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = 30.0) -> bytes:
        return Path(path).read_bytes()[:limit]


@pytest.fixture
def desktop(tmp_path: Path) -> Iterator[DesktopGuest]:
    needed = ["/usr/bin/Xvfb", "/usr/bin/dbus-run-session", "/usr/bin/dbus-send", "/usr/libexec/at-spi-bus-launcher"]
    if not all(Path(p).exists() for p in needed):
        pytest.fail(f"the AT-SPI test needs {', '.join(needed)} (scripts/setup installs them)")
    (tmp_path / "app.py").write_text(GTK_APP)
    display_file = tmp_path / "display"
    # Each step waits for the one before it instead of sleeping a fixed time: under load (CI) an app that starts
    # before the accessibility bus answers never registers with it, and a display number picked by looking at
    # /tmp can be taken by another X server; Xvfb picks a free one itself (-displayfd).
    session = (
        f"Xvfb -displayfd 3 -screen 0 1024x768x24 3>{display_file} & "
        f"until [ -s {display_file} ]; do sleep 0.1; done; export DISPLAY=:$(cat {display_file}); "
        "/usr/libexec/at-spi-bus-launcher --launch-immediately & "
        "until dbus-send --session --print-reply --dest=org.a11y.Bus /org/a11y/bus org.a11y.Bus.GetAddress "
        ">/dev/null 2>&1; do sleep 0.2; done; "
        f"exec {DEBIAN_PYTHON} {tmp_path / 'app.py'}"
    )
    # The session's launcher carries an address that names no bus, as a process started under `osfleet infra`
    # does (NO_SESSION_BUS): the query must pass it by for the session's own.
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": NO_SESSION_BUS}
    proc = subprocess.Popen(
        ["dbus-run-session", "--", "sh", "-c", session], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (display_file.exists() and display_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "Xvfb did not start"
            time.sleep(0.1)
        guest = DesktopGuest(f":{display_file.read_text().strip()}", tmp_path)
        while "Hello label" not in _tree(guest):
            assert proc.poll() is None, "the test desktop's session ended"
            assert time.monotonic() < deadline, "the test desktop did not come up"
            time.sleep(0.5)
        yield guest
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def _tree(guest: DesktopGuest) -> str:
    from osfleet.tasks.osworld_format import guest_query

    try:
        return str(guest_query.ask(guest, "r", "accessibility_tree", {}, 20))
    except guest_query.GuestQueryError:
        return ""


def test_only_a_reachable_session_bus_is_taken(tmp_path: Path) -> None:
    from osfleet.tasks.osworld_format.guest.query import _reachable_bus

    sock = tmp_path / "bus"
    sock.touch()
    assert not _reachable_bus(NO_SESSION_BUS) and not _reachable_bus("") and not _reachable_bus("unix:path=/nowhere")
    assert _reachable_bus(f"unix:path={sock},guid=1") and _reachable_bus("unix:abstract=/tmp/dbus-x")
    assert _reachable_bus(f"{NO_SESSION_BUS};unix:path={sock}")


def test_the_accessibility_tree_comes_from_at_spi(desktop: DesktopGuest, store: AssetStore, tmp_path: Path) -> None:
    import lxml.etree

    xml = get(desktop, {"type": "accessibility_tree"}, tmp_path, store)  # type: ignore[arg-type]
    tree = lxml.etree.fromstring(xml.encode())
    ns = {
        "st": "https://accessibility.ubuntu.example.org/ns/state",
        "cp": "https://accessibility.ubuntu.example.org/ns/component",
    }
    (label,) = tree.xpath('//frame[@name="osfleet a11y"]//label', namespaces=ns)
    assert label.text == "Hello label" and label.get(f"{{{ns['st']}}}showing") == "true"
    (button,) = tree.xpath('//push-button[@name="Press me"]', namespaces=ns)
    assert button.get(f"{{{ns['cp']}}}size") and tree.xpath('//text[text()="typed text"]')
    assert get(desktop, {"type": "vm_terminal_output"}, tmp_path, store) is None  # type: ignore[arg-type]  # no terminal


@pytest.mark.slow
def test_without_chrome_the_active_url_is_none_soon(tmp_path: Path, store: AssetStore) -> None:
    guest = NamespaceGuest(tmp_path / "guest", {"OSFLEET_DEVTOOLS_PORT": str(_free_port())})
    start = time.monotonic()
    assert get(guest, {"type": "active_url_from_accessTree", "goto_prefix": "https://www."}, tmp_path, store) is None
    assert time.monotonic() - start < 15  # it does not wait out the criterion's whole time
    with pytest.raises(GetterValueError, match="DevTools port did not answer"):
        get(guest, {"type": "open_tabs_info"}, tmp_path, store, timeout=8)  # tried to start google-chrome first


class _KilledQueries(NamespaceGuest):
    """A guest whose query script the guest's own timeout kills (a desktop too busy to answer in the getter's
    time), or whose guest agent does not answer at all (``unreachable``)."""

    unreachable = False

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        if "default_video_player" in command:
            if self.unreachable:
                raise GuestTimeoutError("r-1: guest agent did not answer within 30 s")
            raise GuestCommandKilledError(f"command timed out after {timeout:g} s and was killed")
        return super().shell(replica_id, command, timeout, as_root)


def test_a_getter_the_guest_cannot_answer_in_time_scores_0_not_an_infrastructure_failure(
    tmp_path: Path, store: AssetStore
) -> None:
    # OSWorld-Verified's multi_apps 937087b6 ("make VLC the default video player") answered 503 on an untouched
    # desktop: its getter's command was killed after 30 s. A killed guest command is the guest's doing: 0.
    task = from_osworld(
        osworld(
            [],
            func="check_include_exclude",
            result={"type": "default_video_player"},
            expected={"type": "rule", "rules": {"include": ["vlc.desktop"]}},
        ),
        store,
    )
    guest = _KilledQueries(tmp_path / "guest")
    ev = runner.evaluate(guest, "r-1", task)  # type: ignore[arg-type]
    assert ev.reward == 0.0 and "did not answer in time" in ev.criteria[0].detail
    guest.unreachable = True  # a guest agent that does not answer at all stays an infrastructure failure
    with pytest.raises(runner.VerifierError, match="guest agent did not answer"):
        runner.evaluate(guest, "r-1", task)  # type: ignore[arg-type]


class _BehindProxy(NamespaceGuest):
    """A guest on a host that runs with --replica-network proxy=URL (the proxy is never contacted here)."""

    replica_proxy = "http://10.200.0.1:3128"


def test_proxy_tasks_are_set_up_behind_the_hosts_proxy_as_osworld_does(tmp_path: Path, store: AssetStore) -> None:
    launch = {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}}
    other = {"type": "launch", "parameters": {"command": ["sh", "-c", 'echo "$*" > args.txt', "sh", "x"]}}
    data = {**osworld([launch, other]), "proxy": True}
    task = from_osworld(data, store)
    assert task.needs_proxy and [getattr(s, "chrome", None) for s in task.setup] == [True, False]
    behind = runner.proxy_steps(task, _BehindProxy.replica_proxy)
    assert behind[1].command.endswith(" --proxy-server=http://10.200.0.1:3128")  # type: ignore[union-attr]
    assert behind[2] == task.setup[1]  # only google-chrome gets the flag
    assert runner.proxy_steps(task, None) == task.setup  # a host without a proxy: the task runs as it is
    plain = from_osworld(osworld([launch]), store)
    assert runner.proxy_steps(plain, _BehindProxy.replica_proxy) == plain.setup  # a task that needs none
    guest = _BehindProxy(tmp_path / "guest")
    runner.apply_setup(guest, "r-1", from_osworld({**osworld([other]), "proxy": "true"}, store))  # type: ignore[arg-type]
    exports = (guest.home / ".bashrc").read_text().splitlines()
    assert exports == [f"export {v}=http://10.200.0.1:3128" for v in runner.PROXY_VARIABLES]
